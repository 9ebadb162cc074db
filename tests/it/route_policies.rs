//! Route policies beyond the limits (issue 21 items 2 and 5), through the real binary on the
//! memory and Redis stores, each over HTTP/1.1, h2c, and HTTP/1.1 and HTTP/2 over TLS:
//! - `exempt`: clients in those networks skip the limits, with no rate-limit fields, counted as
//!   `decision="exempt"`; everyone else on the route is still limited;
//! - `deny_status` (`[store]` default and per route) and `deny_body_file` /
//!   `deny_content_type`: the denial's status and body change, `Retry-After` and the RateLimit
//!   fields stay.
//!
//! - `legacy_headers`: the `X-RateLimit-*` trio of the tightest limit beside the draft's fields.
//!
//! And the config errors of those keys, with file, line and key.

use crate::common;

use std::path::Path;

use common::cli::check_config;
use common::config::assert_invalid;
use common::fetch::{fetch_with, url};
use common::load::{h2load, Burst};
use common::proxy::{ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::{Upstream, UPSTREAM_BODY};
use slidegate::config::{Config, ConfigError};

const DENY_HTML: &str = "<h1>Slow down</h1>\n";

/// A proxy on `store_lines` with three routes of 1 request per minute: `/open` keyed by client
/// address with `10.0.0.0/8` exempt, `/custom` answering denials `403` with an HTML body,
/// `/plain` with the store's `deny_status = 503` and the problem body.
fn start(store_lines: &str, up: &Upstream, ca: &TestCa, dir: &Path) -> Proxy {
    let body = dir.join("deny.html");
    std::fs::write(&body, DENY_HTML).unwrap();
    let one = r#"limits = [{ requests = 1, window = "1m" }]"#;
    let config = ConfigBuilder::new()
        .store(&format!("{store_lines}\ndeny_status = 503"))
        .trusted_proxies(&["127.0.0.1/32"])
        .upstream("app", up.addr())
        .route(
            "open",
            &format!("path_prefix = \"/open\"\nexempt = [\"10.0.0.0/8\"]\n{one}"),
        )
        .route(
            "custom",
            &format!(
                "path_prefix = \"/custom\"\nkey = \"header:X-Client\"\n{one}\n\
                 deny_status = 403\ndeny_body_file = {body:?}\n\
                 deny_content_type = \"text/html; charset=utf-8\""
            ),
        )
        .route(
            "plain",
            &format!("path_prefix = \"/plain\"\nkey = \"header:X-Client\"\n{one}"),
        )
        .build();
    Proxy::start_with(&config, tls_options(ca, "h2c = true"))
}

async fn exercise(proxy: &Proxy, ca: &TestCa) {
    for (p, protocol) in Protocol::ALL.into_iter().enumerate() {
        let client = protocol.client(&ca.ca_pem());
        let get = |path: &'static str, headers: Vec<(&'static str, String)>| {
            let (client, url) = (client.clone(), url(proxy, protocol, path));
            async move {
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                fetch_with(&client, &url, &headers, protocol.version()).await
            }
        };
        // Exempt: three in a row pass a 1-per-minute limit, with no rate-limit fields.
        let inside = format!("10.{p}.2.3");
        for _ in 0..3 {
            let seen = get("/open", vec![("x-forwarded-for", inside.clone())]).await;
            assert_eq!(seen.status, 200, "{protocol:?} exempt {seen:?}");
            assert_eq!(seen.body, UPSTREAM_BODY);
            assert!(
                seen.policy.is_none() && seen.ratelimit.is_none(),
                "{seen:?}"
            );
        }
        // Outside the exempt networks: limited, denied with the store's 503.
        let outside = format!("203.0.113.{p}");
        let first = get("/open", vec![("x-forwarded-for", outside.clone())]).await;
        assert_eq!(first.status, 200, "{protocol:?} {first:?}");
        assert!(first.ratelimit.is_some(), "{first:?}");
        let denied = get("/open", vec![("x-forwarded-for", outside)]).await;
        assert_eq!(denied.status, 503, "{protocol:?} {denied:?}");

        // The route's own status and body; Retry-After and RateLimit stay.
        let who = format!("c-{protocol:?}");
        assert_eq!(
            get("/custom", vec![("x-client", who.clone())]).await.status,
            200
        );
        let custom = get("/custom", vec![("x-client", who)]).await;
        assert_eq!(custom.status, 403, "{protocol:?} {custom:?}");
        assert_eq!(custom.body, DENY_HTML);
        assert_eq!(
            custom.content_type.as_deref(),
            Some("text/html; charset=utf-8")
        );
        assert!(
            custom.retry_after.is_some() && custom.ratelimit.is_some(),
            "{custom:?}"
        );

        // The store's status with the problem body, which says the same status.
        let who = format!("p-{protocol:?}");
        assert_eq!(
            get("/plain", vec![("x-client", who.clone())]).await.status,
            200
        );
        let plain = get("/plain", vec![("x-client", who)]).await;
        assert_eq!(plain.status, 503, "{protocol:?} {plain:?}");
        assert_eq!(
            plain.content_type.as_deref(),
            Some("application/problem+json")
        );
        let problem: serde_json::Value = serde_json::from_str(&plain.body).unwrap();
        assert_eq!(problem["status"], 503, "{problem}");
        assert!(plain.retry_after.is_some(), "{plain:?}");
    }
    let n = Protocol::ALL.len() as u64;
    assert_eq!(proxy.decisions("open", "exempt"), 3 * n);
    assert_eq!(proxy.decisions("open", "denied"), n);
    assert_eq!(proxy.decisions("custom", "denied"), n);
    println!(
        "exempt: {} forwarded past a 1/min limit, {} outside denied 503; custom 403 + HTML and \
         store 503 + problem body over {n} protocols",
        3 * n,
        n
    );
}

#[tokio::test]
async fn exempt_clients_and_the_deny_answer_on_the_memory_store() {
    let (up, ca, dir) = (
        Upstream::start(),
        TestCa::new("ca"),
        tempfile::tempdir().unwrap(),
    );
    let proxy = start("backend = \"memory\"", &up, &ca, dir.path());
    exercise(&proxy, &ca).await;
}

#[tokio::test]
async fn exempt_clients_and_the_deny_answer_on_the_redis_store() {
    let redis = RedisServer::start();
    let (up, ca, dir) = (
        Upstream::start(),
        TestCa::new("ca"),
        tempfile::tempdir().unwrap(),
    );
    let proxy = start(&redis.store_toml(), &up, &ca, dir.path());
    exercise(&proxy, &ca).await;
}

/// `legacy_headers = true`: `X-RateLimit-Limit`, `-Remaining` and `-Reset` of the tightest
/// limit on allowed and denied responses, over HTTP/1.1, h2c, and HTTP/1.1 and HTTP/2 over TLS;
/// a route without it sends none.
#[tokio::test]
async fn legacy_fields_of_the_tightest_limit_over_every_protocol() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let limits = r#"limits = [{ requests = 3, window = "1m" }, { requests = 5, window = "1h" }]"#;
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "legacy",
            &format!("path_prefix = \"/legacy\"\nkey = \"header:X-Client\"\nlegacy_headers = true\n{limits}"),
        )
        .route(
            "modern",
            &format!("path_prefix = \"/modern\"\nkey = \"header:X-Client\"\n{limits}"),
        )
        .build();
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    for protocol in Protocol::ALL {
        let client = protocol.client(&ca.ca_pem());
        let who = format!("{protocol:?}");
        let mut seen = Vec::new();
        for path in ["/legacy", "/legacy", "/legacy", "/legacy", "/modern"] {
            let resp = client
                .get(url(&proxy, protocol, path))
                .header("x-client", &who)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.version(), protocol.version());
            let h = |n: &str| {
                resp.headers()
                    .get(n)
                    .map(|v| v.to_str().unwrap().parse::<u64>().unwrap())
            };
            seen.push((
                resp.status().as_u16(),
                h("x-ratelimit-limit"),
                h("x-ratelimit-remaining"),
                h("x-ratelimit-reset"),
                h("retry-after"),
            ));
        }
        let statuses: Vec<u16> = seen.iter().map(|s| s.0).collect();
        assert_eq!(statuses, [200, 200, 200, 429, 200], "{protocol:?} {seen:?}");
        for (i, (_, limit, remaining, reset, _)) in seen[..4].iter().enumerate() {
            // The 1-minute limit is the tightest: 2, 1, 0 left of 3 (the hour's 4, 3, 2 of 5).
            assert_eq!(*limit, Some(3), "{protocol:?} {seen:?}");
            assert_eq!(*remaining, Some(2u64.saturating_sub(i as u64)));
            assert!(reset.is_some_and(|t| (1..=60).contains(&t)), "{seen:?}");
        }
        let denied = &seen[3];
        assert_eq!(
            denied.3, denied.4,
            "on the denial Reset is Retry-After: {denied:?}"
        );
        assert_eq!(
            seen[4].1, None,
            "no legacy_headers, no X-RateLimit-*: {seen:?}"
        );
    }
}

/// Each bad value is refused with the file, its line and its key.
#[test]
fn bad_policy_keys_name_file_line_and_key() {
    let base = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\n\
                upstream = \"app\"\n";
    for (extra, key, line, message) in [
        (
            "deny_status = 200\n",
            "routes[0].deny_status",
            9,
            "400 to 599",
        ),
        (
            "deny_status = 600\n",
            "routes[0].deny_status",
            9,
            "400 to 599",
        ),
        (
            "deny_content_type = \"text/html\"\n",
            "routes[0].deny_content_type",
            9,
            "deny_body_file",
        ),
        (
            "deny_body_file = \"x.html\"\ndeny_content_type = \"html\"\n",
            "routes[0].deny_content_type",
            10,
            "media type",
        ),
        ("exempt = [\"10.0.0.0/33\"]\n", "routes[0].exempt[0]", 9, ""),
        (
            "legacy_headers = \"yes\"\n",
            "routes[0].legacy_headers",
            9,
            "expected a boolean",
        ),
    ] {
        let text = format!("{base}{extra}");
        assert_invalid(&text, key, line, message);
    }
    let store = "[store]\ndeny_status = 99\n";
    let base = base.replace("[upstreams", &format!("{store}[upstreams"));
    match Config::from_toml(Path::new("p.toml"), &base) {
        Err(ConfigError::Invalid { line, key, .. }) => {
            assert_eq!((key.as_str(), line), ("store.deny_status", Some(5)));
        }
        other => panic!("{other:?}"),
    }
}

/// A `deny_body_file` that cannot be read stops the start with the line, key and file.
#[test]
fn an_unreadable_deny_body_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.html");
    let config = ConfigBuilder::new()
        .upstream("app", "127.0.0.1:1")
        .route("r", &format!("deny_body_file = {missing:?}"))
        .build();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        format!("[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n{config}"),
    )
    .unwrap();
    let checked = check_config(&file, &[]);
    let stderr = &checked.stderr;
    assert!(!checked.ok, "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    let line = 1 + text
        .lines()
        .position(|l| l.contains("deny_body_file"))
        .unwrap();
    let at = format!(":{line}: `routes[0].deny_body_file`");
    assert!(
        stderr.contains(&at) && stderr.contains("missing.html"),
        "{stderr}"
    );
    // A file that never ends is refused at once, not read until memory runs out.
    std::fs::write(
        &file,
        text.replace(&format!("{missing:?}"), "\"/dev/zero\""),
    )
    .unwrap();
    let checked = check_config(&file, &[]);
    assert!(!checked.ok, "{}", checked.stderr);
    assert!(
        checked.stderr.contains("not a regular file"),
        "{}",
        checked.stderr
    );
}

/// Under a burst of 300 h2c connections × 10 streams (4000 requests), on both stores: every
/// request of an exempt client is forwarded and counted `exempt`, and a route with its own deny
/// answer admits exactly its limit (1) and answers the other 3999 with its `403`.
#[test]
fn exempt_and_deny_answer_hold_under_an_h2_burst() {
    let _permit = common::heavy::heavy();
    let redis = RedisServer::start();
    for store in ["backend = \"memory\"".to_string(), redis.store_toml()] {
        let (up, ca, dir) = (
            Upstream::start(),
            TestCa::new("ca"),
            tempfile::tempdir().unwrap(),
        );
        let proxy = start(&store, &up, &ca, dir.path());
        let burst = |path: &str, header: &str| Burst {
            path: path.into(),
            headers: vec![header.into()],
            ..Burst::keyed(300, "unused")
        };
        let exempt = h2load(proxy.addr(), &burst("/open", "X-Forwarded-For: 10.9.9.9"));
        assert_eq!(
            (exempt.s2xx, exempt.failed),
            (4000, 0),
            "{store}: {exempt:?}"
        );
        assert_eq!(proxy.decisions("open", "exempt"), 4000, "{store}");
        let custom = h2load(proxy.addr(), &burst("/custom", "X-Client: burst"));
        assert_eq!(
            (custom.s2xx, custom.s4xx, custom.failed),
            (1, 3999, 0),
            "{store}: {custom:?}"
        );
        assert_eq!(proxy.decisions("custom", "denied"), 3999, "{store}");
        println!(
            "{store}: exempt burst 4000 x 200 (max {:?}); deny burst 1 x 200 + 3999 x 403 (max {:?})",
            exempt.max_latency, custom.max_latency
        );
    }
}
