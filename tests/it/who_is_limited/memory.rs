//! `/api/v1/top` on the memory store: the proxy's own counts, `admin_show_keys = false`, bad
//! parameters, the token, `top_clients` out of range; and `slidegate_build_info`.

use super::*;

/// On the memory store the proxy's own summary answers (the period not folded yet too); with
/// `admin_show_keys = false` only `pk`; bad parameters are problem+json; the token guards it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_answers_from_the_proxy_s_own_counts() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let token = "s3cret-token-0123456789";
    let mut opts = tls_options(&ca, "h2c = true");
    opts.server_extra = format!("h2c = true\nadmin_token = \"{token}\"\nadmin_show_keys = false");
    let hidden = Proxy::start_with(&config(&up, "backend = \"memory\"", &access), opts);
    let opts = ProxyOptions {
        server_extra: "h2c = true\ntop_clients = 10".into(),
        ..tls_options(&ca, "")
    };
    let access2 = dir.path().join("access2.log");
    let shown = Proxy::start_with(&config(&up, "backend = \"memory\"", &access2), opts);
    let auth = format!("Bearer {token}");
    let auth = [("authorization", auth.as_str())];
    for (proxy, headers) in [(&hidden, &auth[..]), (&shown, &[][..])] {
        common::admin::wait_readyz(proxy, 200, Duration::from_secs(20));
        let calls: Vec<_> = (PROTOCOLS.iter())
            .flat_map(|p| std::iter::repeat_n((0, *p, "noisy"), 4))
            .collect();
        let sent = send(&[proxy], &ca, &calls).await;
        let denied = sent.iter().filter(|s| s.seen.status == 429).count() as u64;
        assert_eq!(denied, 7);
        let pk = own_pk(&sent[0].seen);
        // Read at once: the period not folded yet answers too.
        let (status, body) = top(proxy, "route=api", headers).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["shared"], false);
        assert_eq!(body["minutes"], 5, "the default span");
        let c = &body["clients"][0];
        assert_eq!(c["denied"], denied, "{body}");
        assert_eq!(c["allowed"], 5, "{body}");
        assert_eq!(c["pk"], pk.as_str(), "{body}");
        assert_eq!(c["limits"], serde_json::json!(["api-10s"]), "{body}");
        match headers.is_empty() {
            true => assert_eq!(c["key"], "noisy", "{body}"),
            false => {
                assert!(
                    c.get("key").is_none() && c.get("inspectable").is_none(),
                    "{body}"
                )
            }
        }
        // Bad parameters: problem+json, naming what is wrong.
        for (query, status, says) in [
            ("", 400, "missing query parameter \"route\""),
            ("route=api&minutes=0", 400, "from 1 to 15"),
            ("route=api&minutes=16", 400, "from 1 to 15"),
            ("route=api&minutes=five", 400, "from 1 to 15"),
            ("route=api&route=api", 400, "given twice"),
            (
                "route=api&client=x",
                400,
                "unknown query parameter \"client\"",
            ),
            ("route=nope", 404, "no route named \"nope\""),
        ] {
            let reply = admin(proxy, "GET", &format!("/api/v1/top?{query}"), headers).await;
            assert_eq!(reply.status, status, "{query}: {}", reply.body);
            let ct = reply.headers.get("content-type").unwrap().to_str().unwrap();
            assert_eq!(ct, "application/problem+json", "{query}");
            let problem: Value = serde_json::from_str(&reply.body).unwrap();
            let detail = problem["detail"].as_str().unwrap_or_default();
            assert!(detail.contains(says), "{query}: {}", reply.body);
        }
        let reply = admin(proxy, "POST", "/api/v1/top?route=api", headers).await;
        assert_eq!(reply.status, 405, "{}", reply.body);
    }
    // Issue 54 item 5: the build, named once.
    let metrics = shown.metrics_text();
    let info: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("slidegate_build_info{"))
        .collect();
    assert_eq!(info.len(), 1, "{info:?}");
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    assert!(
        info[0].contains(&version) && info[0].ends_with("} 1"),
        "{info:?}"
    );
    assert!(!info[0].contains("commit=\"\""), "{info:?}");
    // The token: none, a wrong one.
    assert_eq!(top(&hidden, "route=api", &[]).await.0, 401);
    let wrong = [("authorization", "Bearer wrong-token-0123456789")];
    assert_eq!(top(&hidden, "route=api", &wrong).await.0, 401);
}

#[test]
fn top_clients_out_of_range_names_its_file_line_and_key() {
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                top_clients = 5\n";
    common::config::assert_invalid(text, "server.top_clients", 4, "between 10 and 10000");
}
