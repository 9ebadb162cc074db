//! Bounded-memory limits (`resolution`) through the real binary, on the memory and Redis
//! stores, over HTTP/1.1, h2c, and HTTP/1.1 and HTTP/2 over TLS: a route mixing a slotted and a
//! log limit admits exactly, answers 429 with `Retry-After` and the RateLimit fields of both
//! policies; under an h2c burst (300 connections × 10 streams) exactly `requests` pass, on one
//! proxy and on two sharing Redis.

use crate::common;

use common::admin::window;
use common::fetch::{fetch, url};
use common::load::{h2load, Burst};
use common::proxy::{ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// `/mixed`: 3 per 2 s in 500 ms slots and 5 per minute (a log), keyed by `X-Client`;
/// `/burst`: 50 per minute in 1 s slots, keyed by `X-K`.
fn start(store_lines: &str, up: &Upstream, ca: &TestCa) -> Proxy {
    let config = ConfigBuilder::new()
        .store(store_lines)
        .upstream("app", up.addr())
        .route(
            "mixed",
            "path_prefix = \"/mixed\"\nkey = \"header:X-Client\"\n\
             limits = [{ requests = 3, window = \"2s\", resolution = \"500ms\" }, \
                       { requests = 5, window = \"1m\" }]",
        )
        .route(
            "burst",
            "path_prefix = \"/burst\"\nkey = \"header:X-K\"\n\
             limits = [{ requests = 50, window = \"1m\", resolution = \"1s\" }]",
        )
        .build();
    Proxy::start_with(&config, tls_options(ca, "h2c = true"))
}

async fn exercise(proxy: &Proxy, ca: &TestCa) {
    for protocol in Protocol::ALL {
        let client = protocol.client(&ca.ca_pem());
        let (url, who) = (url(proxy, protocol, "/mixed"), format!("{protocol:?}"));
        for left in (0..3).rev() {
            let seen = fetch(&client, &url, &who, protocol.version()).await;
            assert_eq!(seen.status, 200, "{protocol:?} {seen:?}");
            let policy = seen.policy.as_deref().unwrap_or_default();
            assert!(
                policy.contains("\"mixed-2s@500ms\";q=3;w=2")
                    && policy.contains("\"mixed-60s\";q=5;w=60"),
                "{protocol:?} {policy}"
            );
            let ratelimit = seen.ratelimit.as_deref().unwrap_or_default();
            assert!(ratelimit.contains(&format!("r={left}")), "{ratelimit}");
        }
        let denied = fetch(&client, &url, &who, protocol.version()).await;
        assert_eq!(denied.status, 429, "{protocol:?} {denied:?}");
        // The oldest slot leaves at most window + resolution after it began: ≤ 2.5 s, so a
        // whole-second Retry-After of at most 3.
        let retry: u64 = denied.retry_after.as_deref().unwrap().parse().unwrap();
        assert!((1..=3).contains(&retry), "{protocol:?} Retry-After {retry}");
    }
    let n = Protocol::ALL.len() as u64;
    assert_eq!(proxy.decisions("mixed", "allowed"), 3 * n);
    assert_eq!(proxy.decisions("mixed", "denied"), n);

    // The inspector shows the slots: 3 admissions in at most 2 of them, and the log's 3.
    let view = window(proxy, "mixed", "H1").await;
    let (slotted, log) = (&view["limits"][0], &view["limits"][1]);
    assert_eq!(
        (slotted["resolution_ms"].as_u64(), slotted["count"].as_u64()),
        (Some(500), Some(3)),
        "{view}"
    );
    let slots = slotted["slots"].as_array().unwrap();
    let counted: u64 = slots.iter().map(|s| s["count"].as_u64().unwrap()).sum();
    assert!(
        !slots.is_empty() && slots.len() <= 2 && counted == 3,
        "{view}"
    );
    assert_eq!(
        (log["count"].as_u64(), log["slots"].as_array().map(Vec::len)),
        (Some(3), Some(0)),
        "{view}"
    );
}

#[tokio::test]
async fn a_slotted_limit_admits_exactly_on_the_memory_store() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    exercise(&start("backend = \"memory\"", &up, &ca), &ca).await;
}

#[tokio::test]
async fn a_slotted_limit_admits_exactly_on_the_redis_store() {
    let (redis, up, ca) = (RedisServer::start(), Upstream::start(), TestCa::new("ca"));
    exercise(&start(&redis.store_toml(), &up, &ca), &ca).await;
}

fn burst(key: &str) -> Burst {
    Burst {
        path: "/burst".into(),
        ..Burst::keyed(300, key)
    }
}

#[test]
fn an_h2_burst_gets_exactly_the_limit_through_slots() {
    let _permit = common::heavy::heavy();
    let redis = RedisServer::start();
    for store in ["backend = \"memory\"".to_string(), redis.store_toml()] {
        let (up, ca) = (Upstream::start(), TestCa::new("ca"));
        let proxy = start(&store, &up, &ca);
        let got = h2load(proxy.addr(), &burst("one"));
        assert_eq!(
            (got.s2xx, got.s4xx, got.failed),
            (50, 3950, 0),
            "{store}: {got:?}"
        );
        println!(
            "{store}: 300 x 10 streams, 4000 requests: 50 x 200, 3950 x 429 (max {:?})",
            got.max_latency
        );
    }
}

#[test]
fn two_proxies_sharing_redis_admit_exactly_the_limit_through_slots() {
    let (redis, up, ca) = (RedisServer::start(), Upstream::start(), TestCa::new("ca"));
    let (a, b) = (
        start(&redis.store_toml(), &up, &ca),
        start(&redis.store_toml(), &up, &ca),
    );
    let (addr_a, addr_b) = (a.addr(), b.addr());
    let other = std::thread::spawn(move || h2load(addr_b, &burst("shared")));
    let here = h2load(addr_a, &burst("shared"));
    let there = other.join().unwrap();
    assert_eq!(here.failed + there.failed, 0, "{here:?} {there:?}");
    assert_eq!(here.s2xx + there.s2xx, 50, "{here:?} {there:?}");
    assert_eq!(here.s4xx + there.s4xx, 7950, "{here:?} {there:?}");
    println!(
        "two proxies, 2 x 4000 requests at 300 x 10 streams: {} + {} admitted of 50",
        here.s2xx, there.s2xx
    );
}
