//! Issue 54's "who is limited, and by which limit?", through the real binary. Two proxies on one
//! Redis, `/api` keyed by `X-Api-Key` at 5 per 10 s per key and 20 per 10 s for everyone: a
//! noisy tenant floods it through both proxies over HTTP/1.1, h2c and HTTP/2 over TLS; five
//! tenants fill the global limit; a quiet tenant gets `429` from the global policy. Then on
//! each proxy: the denials metric splits per key and global, the quiet tenant's access-log lines
//! name the global policy and its `pk`, `GET /api/v1/top?route=api` lists the noisy tenant first
//! with every proxy's denials (polled, within 10 s), and the inspector's page lists it with a
//! link that opens its bucket (headless chromium). On the memory store: the proxy's own counts,
//! `admin_show_keys = false`, the endpoint's bad parameters and its token.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::admin::admin;
use common::browser::Browser;
use common::fetch::{fetch_with, url, Seen};
use common::log_file::wait_lines;
use common::proxy::{ConfigBuilder, Proxy, ProxyOptions};
use common::ratelimit::parse_ratelimit;
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;
use futures::future::join_all;
use serde_json::Value;

/// The flood's protocols, each through both proxies.
const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

/// The noisy tenant's requests per proxy and protocol.
const NOISY_EACH: usize = 8;

/// `[server] top_clients` (the default): the documented error is the denials over it.
const TOP_CLIENTS: u64 = 100;

fn config(up: &Upstream, store: &str, access: &Path) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "api",
            "path_prefix = \"/api\"\nkey = \"header:X-Api-Key\"\n\
             limits = [\n  { requests = 5, window = \"10s\" },\n  \
             { requests = 20, window = \"10s\", key = \"global\" },\n]",
        )
        .raw(&format!("[log]\naccess = {access:?}\nformat = \"json\""))
        .build()
}

/// A proxy on `store` with its own access log in `dir`, a TLS listener and h2c, ready.
fn proxy(up: &Upstream, ca: &TestCa, store: &str, dir: &Path, n: usize) -> (Proxy, PathBuf) {
    let access = dir.join(format!("access-{n}.log"));
    let proxy = Proxy::start_with(&config(up, store, &access), tls_options(ca, "h2c = true"));
    common::admin::wait_readyz(&proxy, 200, Duration::from_secs(20));
    (proxy, access)
}

/// One request of `tenant` to `/api` through proxy `p` over `protocol`.
struct Sent {
    proxy: usize,
    tenant: &'static str,
    seen: Seen,
}

/// Send every `(proxy, protocol, tenant)` at once.
async fn send(
    proxies: &[&Proxy],
    ca: &TestCa,
    calls: &[(usize, Protocol, &'static str)],
) -> Vec<Sent> {
    let clients: Vec<_> = PROTOCOLS
        .iter()
        .map(|p| (*p, p.client(&ca.ca_pem())))
        .collect();
    let calls = calls.iter().map(|&(p, protocol, tenant)| {
        let client = clients
            .iter()
            .find(|(q, _)| *q == protocol)
            .unwrap()
            .1
            .clone();
        let target = url(proxies[p], protocol, "/api/items");
        async move {
            let headers = [("x-api-key", tenant)];
            let seen = fetch_with(&client, &target, &headers, protocol.version()).await;
            Sent {
                proxy: p,
                tenant,
                seen,
            }
        }
    });
    join_all(calls).await
}

/// The base64 `pk` of a reply's first RateLimit item (the client's own bucket).
fn own_pk(seen: &Seen) -> String {
    let items = parse_ratelimit(seen.ratelimit.as_deref().unwrap_or_default());
    base64::engine::general_purpose::STANDARD.encode(&items[0].pk)
}

/// `GET /api/v1/top?…` on `proxy`: status and JSON.
async fn top(proxy: &Proxy, query: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let reply = admin(proxy, "GET", &format!("/api/v1/top?{query}"), headers).await;
    let json = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
    (reply.status, json)
}

/// The access log's JSON lines of `path`, once it holds `n`.
fn log_lines(path: &Path, n: usize) -> Vec<Value> {
    (wait_lines(path, n).iter())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_proxy_names_the_noisy_tenant_and_the_limit_that_refused_the_quiet_one() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("pk-secret");
    std::fs::write(&secret, "one-secret-for-the-fleet-0123456789").unwrap();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\npartition_key_secret_file = {:?}",
        redis.url(),
        secret
    );
    let (a, log_a) = proxy(&up, &ca, &store, dir.path(), 0);
    let (b, log_b) = proxy(&up, &ca, &store, dir.path(), 1);
    let proxies = [&a, &b];
    let logs = [&log_a, &log_b];

    // The flood: 8 per proxy and protocol at once, 48 in all: 5 admitted, 43 refused by the
    // per-key limit (the global one has room).
    let flood: Vec<_> = (0..2)
        .flat_map(|p| PROTOCOLS.map(|protocol| (p, protocol)))
        .flat_map(|(p, protocol)| std::iter::repeat_n((p, protocol, "noisy"), NOISY_EACH))
        .collect();
    let mut sent = send(&proxies, &ca, &flood).await;
    // Five tenants take 3 each of the global 20 (5 + 15), then the quiet one's 4 are refused
    // by the global limit alone.
    let fillers = ["t1", "t2", "t3", "t4", "t5"];
    let fill: Vec<_> = (fillers.iter().enumerate())
        .flat_map(|(i, t)| (0..3).map(move |j| (j % 2, PROTOCOLS[(i + j) % 3], *t)))
        .collect();
    sent.extend(send(&proxies, &ca, &fill).await);
    let quiet: Vec<_> = (0..4).map(|i| (i % 2, PROTOCOLS[i % 3], "quiet")).collect();
    sent.extend(send(&proxies, &ca, &quiet).await);

    let count = |tenant: &str, status: u16, p: Option<usize>| {
        (sent.iter())
            .filter(|s| s.tenant == tenant && s.seen.status == status)
            .filter(|s| p.is_none_or(|p| s.proxy == p))
            .count() as u64
    };
    assert_eq!(count("noisy", 200, None), 5);
    let noisy_denied = count("noisy", 429, None);
    assert_eq!(noisy_denied, 43);
    for t in fillers {
        assert_eq!(count(t, 200, None), 3, "{t}");
    }
    assert_eq!(
        count("quiet", 429, None),
        4,
        "the quiet tenant is refused by the global limit"
    );
    let quiet_sent: Vec<&Sent> = sent.iter().filter(|s| s.tenant == "quiet").collect();
    for s in &quiet_sent {
        let field = s.seen.ratelimit.as_deref().unwrap_or_default();
        assert!(field.contains("\"api-10s-global\";r=0;"), "{field}");
        assert!(
            !field.contains("\"api-10s\";r=0;"),
            "its own limit had room: {field}"
        );
    }
    let quiet_pk = own_pk(&quiet_sent[0].seen);
    assert!(
        quiet_sent.iter().all(|s| own_pk(&s.seen) == quiet_pk),
        "one pk for the fleet"
    );
    let noisy_pk = own_pk(&sent[0].seen);

    for (p, proxy) in proxies.iter().enumerate() {
        // The denials metric: the per-key limit's are the noisy tenant's, the global one's the
        // quiet tenant's, through this proxy.
        let denials = |limit: &str| {
            proxy.counter(&format!(
                "slidegate_limit_denials_total{{limit=\"{limit}\",route=\"api\"}}"
            ))
        };
        assert_eq!(
            denials("api-10s"),
            count("noisy", 429, Some(p)),
            "proxy {p}"
        );
        assert_eq!(
            denials("api-10s-global"),
            count("quiet", 429, Some(p)),
            "proxy {p}"
        );
        assert_eq!(denials("api-10s-global"), 2, "proxy {p}");

        // The access log: the quiet tenant's 429s name the global policy and its pk.
        let through = sent.iter().filter(|s| s.proxy == p).count();
        let lines = log_lines(logs[p], through);
        let quiet_lines: Vec<&Value> = (lines.iter())
            .filter(|l| l["pk"] == quiet_pk.as_str())
            .collect();
        assert_eq!(quiet_lines.len(), 2, "proxy {p}: {quiet_lines:?}");
        for l in &quiet_lines {
            assert_eq!(l["status"], 429, "{l}");
            assert_eq!(l["decision"], "denied", "{l}");
            assert_eq!(l["limits"], "api-10s-global", "{l}");
            assert_eq!(l["route"], "api", "{l}");
        }
        let noisy_lines = lines.iter().filter(|l| l["pk"] == noisy_pk.as_str());
        for l in noisy_lines.filter(|l| l["status"] == 429) {
            assert_eq!(l["limits"], "api-10s", "{l}");
        }
    }

    // `/api/v1/top` on either proxy: the fleet's counts (folded every 2 s), within 10 s.
    let bound = (noisy_denied + 4) / TOP_CLIENTS;
    for (p, proxy) in proxies.iter().enumerate() {
        let started = Instant::now();
        let mut last = Value::Null;
        let found = loop {
            let (status, body) = top(proxy, "route=api&minutes=2", &[]).await;
            assert_eq!(status, 200, "{body}");
            let first = &body["clients"][0];
            let denied = first["denied"].as_u64().unwrap_or(0);
            let quiet_in = (body["clients"].as_array().unwrap().iter())
                .any(|c| c["key"] == "quiet" && c["denied"] == 4);
            if first["key"] == "noisy" && denied + bound >= noisy_denied && quiet_in {
                break Some(body);
            }
            last = body;
            if started.elapsed() > Duration::from_secs(10) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let body = found.unwrap_or_else(|| panic!("proxy {p}: not within 10 s: {last}"));
        println!(
            "proxy {p}: /api/v1/top answered for the fleet after {:?}",
            started.elapsed()
        );
        assert_eq!(body["shared"], true);
        assert_eq!(body["minutes"], 2);
        let noisy = &body["clients"][0];
        assert!(noisy["denied"].as_u64().unwrap() <= noisy_denied, "{noisy}");
        assert_eq!(noisy["pk"], noisy_pk.as_str(), "{noisy}");
        assert_eq!(noisy["inspectable"], true, "{noisy}");
        assert_eq!(noisy["limits"], serde_json::json!(["api-10s"]), "{noisy}");
        let quiet = (body["clients"].as_array().unwrap().iter())
            .find(|c| c["key"] == "quiet")
            .unwrap();
        assert_eq!(quiet["pk"], quiet_pk.as_str(), "{quiet}");
        assert_eq!(
            quiet["limits"],
            serde_json::json!(["api-10s-global"]),
            "{quiet}"
        );
        assert_eq!(quiet["allowed"], 0, "{quiet}");
    }
    assert_eq!(a.counter("slidegate_top_folds_total{result=\"failed\"}"), 0);
    assert!(a.counter("slidegate_top_folds_total{result=\"ok\"}") > 0);

    // The inspector's page lists the noisy tenant first, and its link opens its bucket.
    let browser = Browser::start().await;
    browser.goto(&format!("http://{}/", b.admin_addr())).await;
    let first = browser
        .wait_for(
            "the top limited clients listed",
            "const row = document.querySelector('[data-top-route=\"api\"] tbody tr');
             return row ? { key: row.dataset.key, pk: row.dataset.pk,
                            denied: Number(row.querySelector('td.deny').textContent) } : null;",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(first["key"], "noisy", "{first}");
    assert_eq!(first["pk"], noisy_pk.as_str(), "{first}");
    assert!(
        first["denied"].as_u64().unwrap() + bound >= noisy_denied,
        "{first}"
    );
    browser
        .click("[data-top-route=\"api\"] tbody tr a.top-link")
        .await;
    let card = browser
        .wait_for(
            "the noisy tenant's bucket open",
            "const c = document.querySelector('[data-limit=\"api-10s\"] .remaining');
             return c && c.textContent ? { text: c.textContent, url: location.search } : null;",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(card["url"], "?route=api&client=noisy", "{card}");
    assert!(
        card["text"].as_str().unwrap().contains("of 5 left"),
        "{card}"
    );
}

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

/// A `combined` line in a `log_format` names the decision, the refusing policy and the `pk`,
/// over HTTP/1.1, h2c and HTTP/2 over TLS; the variables of `combined` stay nginx's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combined_log_format_names_the_limit_and_the_bucket() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let format = "$remote_addr - $remote_user [$time_local] \\\"$request\\\" $status \
                  $body_bytes_sent \\\"$http_referer\\\" \\\"$http_user_agent\\\" \
                  $limit_req_status $limit_decision $limit_refused $limit_pk $cost";
    let toml = config(&up, "backend = \"memory\"", &access).replace(
        "format = \"json\"",
        &format!("format = \"combined\"\nlog_format = \"{format}\""),
    );
    let proxy = Proxy::start_with(&toml, tls_options(&ca, "h2c = true"));
    common::admin::wait_readyz(&proxy, 200, Duration::from_secs(20));
    let calls: Vec<_> = (PROTOCOLS.iter())
        .flat_map(|p| std::iter::repeat_n((0, *p, "noisy"), 2))
        .collect();
    let sent = send(&[&proxy], &ca, &calls).await;
    let denied = sent.iter().filter(|s| s.seen.status == 429).count();
    assert_eq!(denied, 1, "6 requests, 5 admitted");
    let pk = own_pk(&sent[0].seen);
    let lines = wait_lines(&access, 6);
    for line in &lines {
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(line.contains("\"GET /api/items HTTP/"), "{line}");
        let tail = match line.contains("\" 429 ") {
            true => format!(" REJECTED denied api-10s {pk} -"),
            false => format!(" PASSED allowed - {pk} -"),
        };
        assert!(line.ends_with(&tail), "{line} does not end with {tail:?}");
    }
    let versions = ["HTTP/1.1\"", "HTTP/2.0\""];
    assert!(
        versions.iter().all(|v| lines.iter().any(|l| l.contains(v))),
        "{lines:?}"
    );
}

#[test]
fn a_log_format_with_an_unknown_variable_names_its_file_line_and_key() {
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [log]\nformat = \"combined\"\nlog_format = \"$remote_addr $limit\"\n";
    common::config::assert_invalid(text, "log.log_format", 6, "unknown variable $limit");
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [log]\nlog_format = \"$remote_addr\"\n";
    common::config::assert_invalid(text, "log.log_format", 5, "format = \"combined\"");
}

/// Redis frozen: requests are decided locally (`on_error = "local"`) at once, the folds fail,
/// each counted and logged, and `/api/v1/top` answers 503 promptly; thawed, both come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_costs_the_folds_never_a_request() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"100ms\"\non_error = \"local\"",
        redis.url()
    );
    let (proxy, _log) = proxy(&up, &ca, &store, dir.path(), 0);
    let folds =
        |result: &str| proxy.counter(&format!("slidegate_top_folds_total{{result=\"{result}\"}}"));
    let calls: Vec<_> = (PROTOCOLS.iter())
        .flat_map(|p| std::iter::repeat_n((0, *p, "noisy"), 3))
        .collect();
    send(&[&proxy], &ca, &calls).await;
    let waited = common::control::poll_until(Duration::from_secs(10), || folds("ok") >= 1);
    assert!(waited.is_some(), "a fold within 10 s");

    redis.freeze();
    let started = Instant::now();
    let sent = send(&[&proxy], &ca, &calls).await;
    let took = started.elapsed();
    assert!(
        sent.iter().all(|s| matches!(s.seen.status, 200 | 429)),
        "decided locally"
    );
    assert!(took < Duration::from_secs(3), "9 requests took {took:?}");
    let failed = common::control::poll_until(Duration::from_secs(10), || folds("failed") >= 1);
    assert!(failed.is_some(), "a failed fold counted within 10 s");
    let started = Instant::now();
    let (status, body) = top(&proxy, "route=api", &[]).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        proxy.log().contains("top limited clients: "),
        "a WARN line names the failed folds"
    );

    redis.thaw();
    let ok_before = folds("ok");
    send(&[&proxy], &ca, &calls).await;
    let back = common::control::poll_until(Duration::from_secs(15), || folds("ok") > ok_before);
    assert!(back.is_some(), "folds again once Redis answers");
    let (status, body) = top(&proxy, "route=api", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["clients"][0]["key"], "noisy", "{body}");
}

/// On a Redis Cluster a route's top keys share one slot (`{<route>}`): two proxies fold, either
/// answers for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_answers_for_both_proxies() {
    let (up, ca, cluster) = (
        Upstream::start(),
        TestCa::new("ca"),
        common::redis::shared_cluster(),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = format!("{}\ntimeout = \"2s\"", cluster.own_store());
    let (a, _) = proxy(&up, &ca, &store, dir.path(), 0);
    let (b, _) = proxy(&up, &ca, &store, dir.path(), 1);
    let calls: Vec<_> = (0..2)
        .flat_map(|p| PROTOCOLS.map(|protocol| (p, protocol)))
        .flat_map(|(p, protocol)| std::iter::repeat_n((p, protocol, "noisy"), 3))
        .collect();
    let sent = send(&[&a, &b], &ca, &calls).await;
    let denied = sent.iter().filter(|s| s.seen.status == 429).count() as u64;
    assert_eq!(denied, 13, "18 sent, 5 admitted");
    for proxy in [&a, &b] {
        let started = Instant::now();
        loop {
            let (status, body) = top(proxy, "route=api&minutes=1", &[]).await;
            assert_eq!(status, 200, "{body}");
            if body["clients"][0]["denied"] == denied {
                assert_eq!(body["clients"][0]["key"], "noisy", "{body}");
                assert_eq!(body["clients"][0]["allowed"].as_u64().unwrap(), 5, "{body}");
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
