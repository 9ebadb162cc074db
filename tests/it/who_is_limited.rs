//! Issue 54's "who is limited, and by which limit?", through the real binary. Two proxies on one
//! Redis, `/api` keyed by `X-Api-Key` at 5 per 10 s per key and 20 per 10 s for everyone: a
//! noisy tenant floods it through both proxies over HTTP/1.1, h2c and HTTP/2 over TLS; five
//! tenants fill the global limit; a quiet tenant gets `429` from the global policy. Then on
//! each proxy: the denials metric splits per key and global, the quiet tenant's access-log lines
//! name the global policy and its `pk`, `GET /api/v1/top?route=api` lists the noisy tenant first
//! with every proxy's denials (polled, within 10 s), and the inspector's page lists it with a
//! link that opens its bucket (headless chromium). `memory.rs`: the memory store's own counts,
//! `admin_show_keys = false`, the endpoint's bad parameters and its token; `stores.rs`: a frozen
//! Redis and a Redis Cluster; `log_format.rs`: `combined` lines that name the limit.

use crate::common;

mod log_format;
mod memory;
mod stores;

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
