//! Cost-weighted limits (`cost`, `max_cost`, `limits[].unit = "cost"`) through the real binary:
//! a route with 150 requests and a quota of 1000 cost units a minute, the cost read from
//! `X-Cost`. On the memory store, one Redis, two proxies sharing one Redis, and a Redis
//! Cluster: 200 concurrent requests of random cost (over HTTP/1.1, HTTP/2 over TLS and h2c at
//! once) never admit more than the quota, and (one process or one Redis deciding) the costs
//! the upstream saw are exactly what the store counted. Every bad cost form is a `400` naming
//! `cost`, counted nowhere; a missing header costs 1.

use crate::common;

use common::fetch::{fetch_with, url, Seen};
use common::proxy::{ConfigBuilder, Proxy};
use common::ratelimit::parse_ratelimit;
use common::redis::{shared_cluster, RedisServer};
use common::tls::{ready_on_every_protocol, Protocol, TestCa};
use common::upstream::Upstream;
use futures::future::join_all;

const QUOTA: u64 = 1000;
const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2Tls, Protocol::H2c];

fn config(up: &Upstream, store: &str) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "chat",
            "key = \"header:X-Client\"\ncost = \"header:X-Cost\"\nmax_cost = 5000\n\
             limits = [\n  { requests = 150, window = \"1m\" },\n  \
             { quota = 1000, window = \"1m\", unit = \"cost\" },\n]",
        )
        .build()
}

fn proxies(up: &Upstream, ca: &TestCa, store: &str, n: usize) -> Vec<Proxy> {
    ready_on_every_protocol(&config(up, store), ca, n)
}

/// One request of `who` with `X-Cost` values `costs` over `protocol` to `proxy`.
async fn send(proxy: &Proxy, ca: &TestCa, protocol: Protocol, who: &str, costs: &[&str]) -> Seen {
    let client = protocol.client(&ca.ca_pem());
    let mut headers = vec![("x-client", who)];
    headers.extend(costs.iter().map(|c| ("x-cost", *c)));
    fetch_with(
        &client,
        &url(proxy, protocol, "/"),
        &headers,
        protocol.version(),
    )
    .await
}

/// The cost limit's `r` in a response's `RateLimit` field.
fn cost_left(seen: &Seen) -> u64 {
    let items = parse_ratelimit(seen.ratelimit.as_deref().unwrap_or_default());
    let item = items.iter().find(|i| i.name == "chat-60s@1s-cost");
    item.unwrap_or_else(|| panic!("{seen:?}")).r
}

/// 200 requests of random cost 0..=60 at once, request `i` over protocol `i % 3` to proxy
/// `i % n`: returns the sum of the admitted costs, which is at most the quota.
async fn burst(proxies: &[Proxy], ca: &TestCa) -> u64 {
    let clients: Vec<reqwest::Client> = PROTOCOLS.iter().map(|p| p.client(&ca.ca_pem())).collect();
    let mut rng = fastrand::Rng::with_seed(35);
    let calls = (0..200).map(|i| {
        let (protocol, client) = (PROTOCOLS[i % 3], clients[i % 3].clone());
        let target = url(&proxies[i % proxies.len()], protocol, "/");
        let cost = rng.u64(0..=60);
        async move {
            let text = cost.to_string();
            let headers = [("x-client", "burst"), ("x-cost", text.as_str())];
            (
                cost,
                fetch_with(&client, &target, &headers, protocol.version()).await,
            )
        }
    });
    let seen = join_all(calls).await;
    let mut sum = 0;
    for (cost, s) in &seen {
        assert!(matches!(s.status, 200 | 429), "{s:?}");
        if s.status == 200 {
            sum += cost;
        } else {
            assert!(s.retry_after.is_some(), "{s:?}");
        }
    }
    assert!(sum <= QUOTA, "admitted {sum} cost units > {QUOTA}");
    assert!(sum + 60 > QUOTA, "the quota was not used up: {sum}");
    sum
}

/// What the upstream saw of `who`: the sum of its `X-Cost` values.
fn upstream_sum(up: &Upstream, who: &str) -> u64 {
    (up.requests().iter())
        .filter(|r| r.headers.get("x-client").is_some_and(|v| v == who))
        .filter_map(|r| r.headers.get("x-cost")?.to_str().ok()?.parse::<u64>().ok())
        .sum()
}

/// Every bad form is a 400 naming `cost` over every protocol, and counted nowhere: the next
/// request (no header: cost 1) sees `r` one lower than the one before the bad ones.
async fn bad_costs_are_refused(proxy: &Proxy, ca: &TestCa) {
    for (n, protocol) in PROTOCOLS.into_iter().enumerate() {
        let who = format!("bad{n}");
        let first = send(proxy, ca, protocol, &who, &["10"]).await;
        assert_eq!((first.status, cost_left(&first)), (200, QUOTA - 10));
        let bad: [&[&str]; 7] = [
            &["abc"],
            &["-1"],
            &["1.5"],
            &["5001"],
            &["1001"],
            &["1", "2"],
            &["1,2"],
        ];
        for costs in bad {
            let seen = send(proxy, ca, protocol, &who, costs).await;
            assert_eq!(seen.status, 400, "{protocol:?} {costs:?}: {seen:?}");
            assert!(seen.body.contains("cost"), "{costs:?}: {}", seen.body);
        }
        let missing = send(proxy, ca, protocol, &who, &[]).await;
        assert_eq!((missing.status, cost_left(&missing)), (200, QUOTA - 11));
        let spaced = send(proxy, ca, protocol, &who, &["0"]).await;
        assert_eq!(
            (spaced.status, cost_left(&spaced)),
            (200, QUOTA - 11),
            "cost 0"
        );
    }
}

/// The inspector's cost limit of the burst's client: `sum` used, the rest remaining, in cost
/// units.
fn inspector_shows_cost_units(proxy: &Proxy, sum: u64) {
    let (status, body) = proxy.admin_get("/api/v1/window?route=chat&client=burst");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cost = &v["limits"][1];
    assert_eq!(cost["name"], "chat-60s@1s-cost", "{v}");
    assert_eq!(cost["count"].as_u64(), Some(sum), "{v}");
    assert_eq!(cost["remaining"].as_u64(), Some(QUOTA - sum), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_admits_at_most_the_quota() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxies = proxies(&up, &ca, "backend = \"memory\"", 1);
    let sum = burst(&proxies, &ca).await;
    assert_eq!(upstream_sum(&up, "burst"), sum);
    inspector_shows_cost_units(&proxies[0], sum);
    bad_costs_are_refused(&proxies[0], &ca).await;
    let metrics = proxies[0].admin_get("/metrics").1;
    let line = "slidegate_cost_admitted_total{limit=\"chat-60s@1s-cost\",route=\"chat\"}";
    assert!(metrics.contains(line), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_admits_at_most_the_quota() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let proxies = proxies(&up, &ca, &store, 1);
    let sum = burst(&proxies, &ca).await;
    assert_eq!(upstream_sum(&up, "burst"), sum);
    bad_costs_are_refused(&proxies[0], &ca).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_redis_admit_at_most_the_quota() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"",
        redis.url()
    );
    let proxies = proxies(&up, &ca, &store, 2);
    let sum = burst(&proxies, &ca).await;
    assert_eq!(upstream_sum(&up, "burst"), sum);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_admits_at_most_the_quota() {
    let (up, ca, cluster) = (Upstream::start(), TestCa::new("ca"), shared_cluster());
    let store = format!("{}\ntimeout = \"2s\"", cluster.own_store());
    let proxies = proxies(&up, &ca, &store, 1);
    let sum = burst(&proxies, &ca).await;
    assert_eq!(upstream_sum(&up, "burst"), sum);
}
