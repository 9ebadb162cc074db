//! End to end with Redis: real slidegate processes sharing a real `redis-server` or a real
//! 3-master Redis Cluster, in front of a real upstream, over loopback.
//!
//! - several proxies on one Redis admit exactly the limit under thousands of concurrent clients;
//! - a Redis Cluster decides stacked limits in one slot (no CROSSSLOT), all or nothing;
//! - a killed, frozen and restarted Redis costs each request at most the store timeout, applies
//!   `on_error`, flips `/readyz?store`, and limiting is exact again after recovery, without a restart;
//! - a proxy started while Redis is down serves (with `on_error`) and recovers on its own;
//! - proxies whose clocks are an hour apart (libfaketime) share one window exactly;
//! - the local deny cache is exact across proxies and saves Redis calls.
//!
//! The flood and fault tests take [`ALONE`] so that their latency measurements are not made while
//! another test of this file floods the (2-core) machine.

use crate::common;

use common::admin::wait_readyz;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::proxy::{connect, request, ConfigBuilder, Proxy, ProxyOptions, Reply};
use common::ratelimit::{policy, retry_after, violated};
use common::redis::{shared_cluster, RedisServer};
use common::upstream::Upstream;

/// Serializes the tests that flood the machine or measure latencies.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a proxy may take to see a (re)started Redis. `maintain` runs once a second.
const READY_WITHIN: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers.

/// `[store]` lines for one Redis.
fn redis_store(redis: &RedisServer, extra: &str) -> String {
    format!("backend = \"redis\"\nurl = \"{}\"\n{extra}", redis.url())
}

/// `path_prefix`, `key` and one limit.
fn route(path: &str, key: &str, requests: u32, window: &str, extra: &str) -> String {
    format!(
        "path_prefix = \"{path}\"\nkey = \"{key}\"\n{extra}\n\
         limits = [ {{ requests = {requests}, window = \"{window}\" }} ]"
    )
}

/// `slidegate_store_errors_total` by kind (absent series count as 0).
fn store_errors(proxy: &Proxy) -> BTreeMap<&'static str, u64> {
    let text = proxy.metrics_text();
    ["timeout", "unavailable", "backend"]
        .into_iter()
        .map(|kind| {
            let sample = format!("slidegate_store_errors_total{{kind=\"{kind}\"}}");
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(sample.as_str()))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            (kind, value as u64)
        })
        .collect()
}

fn total(errors: &BTreeMap<&'static str, u64>) -> u64 {
    errors.values().sum()
}

fn reset_stats(redis: &RedisServer) {
    let _: () = ::redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis.connection())
        .expect("CONFIG RESETSTAT");
}

/// One request on a new connection with a 10 s bound; the reply and how long it took.
async fn timed(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (Reply, Duration) {
    let start = Instant::now();
    match tokio::time::timeout(Duration::from_secs(10), request(addr, "GET", path, headers)).await {
        Ok(Ok(reply)) => (reply, start.elapsed()),
        Ok(Err(e)) => panic!("GET {path} via {addr}: {e}"),
        Err(_) => panic!("GET {path} via {addr}: no response in 10 s"),
    }
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    timed(addr, path, headers).await.0
}

/// `clients` requests at once, each on its own TCP connection, client `i` to
/// `addrs[i % addrs.len()]`: every connection is opened first, then all send `GET <path>/<i>`
/// together. Statuses per proxy index; panics on any transport error.
async fn flood(addrs: &[SocketAddr], clients: usize, path: &str) -> Vec<BTreeMap<u16, usize>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(clients));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let barrier = barrier.clone();
        let proxy = i % addrs.len();
        let addr = addrs[proxy];
        let path = format!("{path}/{i}");
        tasks.spawn(async move {
            let conn = connect(addr).await;
            barrier.wait().await;
            let reply = match conn {
                Ok(conn) => {
                    tokio::time::timeout(Duration::from_secs(60), conn.send("GET", &path, &[]))
                        .await
                        .unwrap_or_else(|_| Err("no response in 60 s".into()))
                }
                Err(e) => Err(e),
            };
            (proxy, reply)
        });
    }
    let mut statuses = vec![BTreeMap::new(); addrs.len()];
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("client task") {
            (p, Ok(reply)) => *statuses[p].entry(reply.status).or_default() += 1,
            (_, Err(e)) => errors.push(e),
        }
    }
    assert!(
        errors.is_empty(),
        "{} client errors, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    statuses
}

fn count(statuses: &[BTreeMap<u16, usize>], status: u16) -> usize {
    statuses
        .iter()
        .map(|s| s.get(&status).copied().unwrap_or(0))
        .sum()
}

/// p50, p95 and max.
fn percentiles(samples: &[Duration]) -> (Duration, Duration, Duration) {
    assert!(!samples.is_empty());
    let mut s = samples.to_vec();
    s.sort();
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95), s[s.len() - 1])
}

// ---------------------------------------------------------------------------------------------
// 1. Several proxies, one Redis.

/// 3 proxies share one Redis; 3000 clients at once, each on its own connection, spread over
/// them, against 10 per minute on one global bucket: exactly 10 reach the upstream.
async fn three_proxies_one_redis(deny_cache: bool) {
    const CLIENTS: usize = 3000;
    const LIMIT: usize = 10;
    let _alone = ALONE.lock().await;
    let redis = RedisServer::start();
    let up = Upstream::start();
    // A generous timeout and fail-closed: a slow decision on a flooded machine must show up
    // as a 503 (and fail the test), never as an extra admission.
    let toml = ConfigBuilder::new()
        .store(&redis_store(
            &redis,
            &format!("timeout = \"5s\"\non_error = \"deny\"\nlocal_deny_cache = {deny_cache}"),
        ))
        .upstream("app", up.addr())
        .route("flood", &route("/", "global", LIMIT as u32, "1m", ""))
        .build();
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start(&toml)).collect();
    for p in &proxies {
        wait_readyz(p, 200, READY_WITHIN);
    }
    reset_stats(&redis);
    let addrs: Vec<SocketAddr> = proxies.iter().map(Proxy::addr).collect();

    let started = Instant::now();
    let statuses = flood(&addrs, CLIENTS, "/flood").await;
    let elapsed = started.elapsed();

    let allowed: Vec<u64> = proxies
        .iter()
        .map(|p| p.decisions("flood", "allowed"))
        .collect();
    let denied: Vec<u64> = proxies
        .iter()
        .map(|p| p.decisions("flood", "denied"))
        .collect();
    let errors: Vec<_> = proxies.iter().map(store_errors).collect();
    let calls = redis.script_calls();
    println!(
        "3 proxies, deny cache {deny_cache}: {CLIENTS} concurrent connections in {elapsed:?}; \
         statuses per proxy {statuses:?}; upstream hits {}; metrics allowed {allowed:?} \
         (sum {}), denied {denied:?} (sum {}); store errors {errors:?}; Redis script calls \
         {calls}",
        up.hits(),
        allowed.iter().sum::<u64>(),
        denied.iter().sum::<u64>(),
    );
    assert_eq!(count(&statuses, 200), LIMIT, "statuses {statuses:?}");
    assert_eq!(count(&statuses, 429), CLIENTS - LIMIT, "{statuses:?}");
    assert_eq!(
        up.hits(),
        LIMIT as u64,
        "requests that reached the upstream"
    );
    assert_eq!(allowed.iter().sum::<u64>(), LIMIT as u64);
    assert_eq!(denied.iter().sum::<u64>(), (CLIENTS - LIMIT) as u64);
    assert!(errors.iter().all(|e| total(e) == 0), "{errors:?}");
    // Every request was decided (the metrics above), in at most one script call each:
    // concurrent decisions share calls (batching). With the deny cache, in one fully
    // concurrent burst every request may be in flight before the first denial is cached, so
    // its saving is timing-dependent here; the sustained flood in
    // `deny_cache_is_exact_across_proxies_and_saves_redis_calls` measures it.
    assert!(
        (1..=CLIENTS as u64).contains(&calls),
        "{calls} script calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_proxies_one_redis_admit_exactly_the_limit() {
    let _permit = common::heavy::heavy();
    three_proxies_one_redis(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_proxies_one_redis_admit_exactly_the_limit_without_deny_cache() {
    let _permit = common::heavy::heavy();
    three_proxies_one_redis(false).await;
}

// ---------------------------------------------------------------------------------------------
// 2. Redis Cluster.

/// Stacked limits (3 per 2 s + 5 per 1 m) on a 3-master cluster, for six clients whose buckets
/// land on different masters: never CROSSSLOT, and denied requests do not eat the 1 m quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_stacked_limits_are_all_or_nothing() {
    let cluster = shared_cluster();
    // Its own key prefix on the shared Cluster: the keys below are read back under it.
    let prefix = common::shared::unique_prefix("stack");
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .store(&format!(
                "backend = \"redis_cluster\"\nurls = {:?}\nprefix = \"{prefix}\"\n\
                 timeout = \"2s\"\non_error = \"deny\"",
                cluster.urls()
            ))
            .upstream("app", up.addr())
            .route(
                "stack",
                "key = \"header:X-Client\"\n\
                 limits = [ { requests = 3, window = \"2s\" }, { requests = 5, window = \"1m\" } ]",
            )
            .build(),
    );
    let ready = wait_readyz(&proxy, 200, READY_WITHIN);
    println!("cluster: proxy ready after {ready:?}");
    let addr = proxy.addr();
    const CLIENTS: [&str; 6] = ["alice", "bob", "carol", "dave", "erin", "frank"];
    const DENIED_WHILE_FULL: usize = 10;

    let mut tasks = tokio::task::JoinSet::new();
    for client in CLIENTS {
        tasks.spawn(async move {
            let h = [("x-client", client)];
            let first = Instant::now();
            // Fill the 2 s limit: both limits count down together.
            for (i, (r2, r60)) in [(2, 4), (1, 3), (0, 2)].into_iter().enumerate() {
                let reply = get(addr, "/", &h).await;
                assert_eq!(reply.status, 200, "{client} request {i}: {reply:?}");
                assert_eq!(policy(&reply, "stack-2s").0, r2, "{client}: {reply:?}");
                assert_eq!(policy(&reply, "stack-60s").0, r60, "{client}: {reply:?}");
            }
            let filled = Instant::now();
            // Denied by the 2 s limit only; the 1 m quota stays at 2 however many are denied.
            for i in 0..DENIED_WHILE_FULL {
                let reply = get(addr, "/", &h).await;
                assert_eq!(violated(&reply), ["stack-2s"], "{client} denial {i}");
                assert_eq!(policy(&reply, "stack-60s").0, 2, "{client}: {reply:?}");
                let (_, t) = policy(&reply, "stack-2s");
                assert!((1..=2).contains(&t), "{client}: {reply:?}");
                assert!((1..=2).contains(&retry_after(&reply)), "{reply:?}");
            }
            let spent = first.elapsed();
            assert!(
                spent < Duration::from_millis(1500),
                "{client}: 13 requests took {spent:?}, too slow for a 2 s window"
            );
            // Every entry of the 2 s log was written before `filled`: let them all slide out.
            tokio::time::sleep_until((filled + Duration::from_millis(2100)).into()).await;
            for (r2, r60) in [(2, 1), (1, 0)] {
                let reply = get(addr, "/", &h).await;
                assert_eq!(reply.status, 200, "{client} after the slide: {reply:?}");
                assert_eq!(policy(&reply, "stack-2s").0, r2, "{client}: {reply:?}");
                assert_eq!(policy(&reply, "stack-60s").0, r60, "{client}: {reply:?}");
            }
            // Now the 1 m limit is full, the 2 s one is not.
            let reply = get(addr, "/", &h).await;
            assert_eq!(violated(&reply), ["stack-60s"], "{client}");
            assert_eq!(policy(&reply, "stack-2s").0, 1, "{client}: {reply:?}");
            let wait = retry_after(&reply);
            assert!((55..=60).contains(&wait), "{client}: {reply:?}");
            wait
        });
    }
    let mut waits = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        waits.push(joined.expect("client sequence"));
    }

    let allowed = proxy.decisions("stack", "allowed");
    let denied = proxy.decisions("stack", "denied");
    let errors = store_errors(&proxy);
    // Where the buckets live: both limits of a bucket on one master (one slot).
    let mut tags: HashMap<String, Vec<(usize, String)>> = HashMap::new();
    for (n, node) in cluster.nodes().iter().enumerate() {
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query(&mut node.connection())
            .expect("KEYS");
        // The top limited clients' keys (`<prefix>:top:{<route>}:…`) are no bucket's.
        for key in keys.into_iter().filter(|k| !k.contains(":top:{")) {
            let tag = key
                .split_once('{')
                .and_then(|(_, rest)| rest.split_once('}'))
                .map(|(tag, _)| tag.to_string())
                .unwrap_or_else(|| panic!("key without hash tag: {key}"));
            tags.entry(tag).or_default().push((n, key));
        }
    }
    let nodes_used: std::collections::BTreeSet<usize> =
        tags.values().flatten().map(|(n, _)| *n).collect();
    println!(
        "cluster: {} clients x (5 allowed + {} denied): metrics allowed {allowed} denied {denied}, \
         upstream hits {}, store errors {errors:?}, Retry-After of the 1 m denial {waits:?}, \
         buckets {} on masters {nodes_used:?}",
        CLIENTS.len(),
        DENIED_WHILE_FULL + 1,
        up.hits(),
        tags.len(),
    );
    assert_eq!(total(&errors), 0, "store errors (CROSSSLOT?): {errors:?}");
    assert_eq!(proxy.decisions("stack", "error_denied"), 0);
    assert_eq!(allowed, 5 * CLIENTS.len() as u64);
    assert_eq!(
        denied,
        (DENIED_WHILE_FULL as u64 + 1) * CLIENTS.len() as u64
    );
    assert_eq!(up.hits(), allowed);
    assert_eq!(tags.len(), CLIENTS.len(), "{tags:?}");
    for (tag, keys) in &tags {
        assert_eq!(keys.len(), 2, "bucket {tag}: {keys:?}");
        assert_eq!(
            keys[0].0, keys[1].0,
            "bucket {tag} split over masters: {keys:?}"
        );
    }
    assert!(
        nodes_used.len() >= 2,
        "all buckets on one master; the test would not exercise redirects: {tags:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Faults under traffic.

/// What one request of the fault traffic saw.
struct Sample {
    status: u16,
    retry_after: Option<String>,
    took: Duration,
}

/// `workers` concurrent loops per path, each sending requests one after the other (a new
/// connection each, 5 ms apart) for `duration` (at least one request each).
async fn traffic(
    addr: SocketAddr,
    paths: &[&'static str],
    workers: usize,
    duration: Duration,
) -> HashMap<&'static str, Vec<Sample>> {
    let end = Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for &path in paths {
        for _ in 0..workers {
            tasks.spawn(async move {
                let mut out = Vec::new();
                loop {
                    let (reply, took) = timed(addr, path, &[]).await;
                    out.push(Sample {
                        status: reply.status,
                        retry_after: reply.header("retry-after").map(str::to_string),
                        took,
                    });
                    if Instant::now() >= end {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (path, out)
            });
        }
    }
    let mut by_path: HashMap<&'static str, Vec<Sample>> = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (path, samples) = joined.expect("traffic task");
        by_path.entry(path).or_default().extend(samples);
    }
    by_path
}

/// The bound asserted on every request while Redis is down or frozen: `store.timeout` (50 ms)
/// plus generous scheduling slack for a loaded 2-core debug build. A request that waited for the
/// client library's reconnect backoff would take seconds.
const FAULT_MAX: Duration = Duration::from_millis(500);

/// Send fault traffic to `/allow` (on_error allow) and `/deny` (on_error deny) and check every
/// answer: the allow route reaches the upstream and counts `error_allowed`, the deny route is a
/// 503 with `Retry-After: 1` counted as `error_denied`, each within [`FAULT_MAX`].
async fn fault_phase(name: &str, proxy: &Proxy, up: &Upstream, duration: Duration) {
    const WORKERS: usize = 4;
    let hits = up.hits();
    let (ea, ed) = (
        proxy.decisions("allow", "error_allowed"),
        proxy.decisions("deny", "error_denied"),
    );
    let errors_before = store_errors(proxy);
    let samples = traffic(proxy.addr(), &["/allow", "/deny"], WORKERS, duration).await;
    let errors_after = store_errors(proxy);
    let n = samples["/allow"].len() as u64;
    let n_deny = samples["/deny"].len() as u64;
    for path in ["/allow", "/deny"] {
        let s = &samples[path];
        let (p50, p95, max) = percentiles(&s.iter().map(|s| s.took).collect::<Vec<_>>());
        println!(
            "fault {name}: {path}: {} requests, latency p50 {p50:?} p95 {p95:?} max {max:?}",
            s.len()
        );
        assert!(
            max < FAULT_MAX,
            "{name}: a request to {path} took {max:?} (> {FAULT_MAX:?})"
        );
    }
    let diff: BTreeMap<_, _> = errors_after
        .iter()
        .map(|(k, v)| (*k, v - errors_before[k]))
        .collect();
    println!(
        "fault {name}: store errors during the phase {diff:?}, upstream hits +{}",
        up.hits() - hits
    );
    assert!(
        samples["/allow"].iter().all(|s| s.status == 200),
        "{name}: /allow not all 200"
    );
    assert!(
        samples["/deny"]
            .iter()
            .all(|s| s.status == 503 && s.retry_after.as_deref() == Some("1")),
        "{name}: /deny not all 503 with Retry-After: 1: {:?}",
        samples["/deny"]
            .iter()
            .map(|s| (s.status, s.retry_after.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        up.hits() - hits,
        n,
        "{name}: every /allow request reaches the upstream"
    );
    assert_eq!(proxy.decisions("allow", "error_allowed") - ea, n, "{name}");
    assert_eq!(
        proxy.decisions("deny", "error_denied") - ed,
        n_deny,
        "{name}"
    );
    assert_eq!(
        total(&errors_after) - total(&errors_before),
        n + n_deny,
        "{name}: {diff:?}"
    );
}

/// Healthy, then Redis killed, restarted, frozen (SIGSTOP) and replaced by an empty Redis on the
/// same port, all under traffic through one proxy that is never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_faults_under_traffic_are_bounded_and_recover() {
    let _permit = common::heavy::heavy();
    const EXACT: u32 = 7;
    const EXACT_CLIENTS: usize = 60;
    let _alone = ALONE.lock().await;
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let big = 1_000_000;
    let mut proxy = Proxy::start(
        &ConfigBuilder::new()
            .store(&redis_store(&redis, "timeout = \"50ms\""))
            .upstream("app", up.addr())
            .route(
                "allow",
                &route("/allow", "client_ip", big, "1m", "on_error = \"allow\""),
            )
            .route(
                "deny",
                &route("/deny", "client_ip", big, "1m", "on_error = \"deny\""),
            )
            .route(
                "exact",
                &route("/exact", "global", EXACT, "1m", "on_error = \"deny\""),
            )
            .build(),
    );
    wait_readyz(&proxy, 200, READY_WITHIN);
    let addr = proxy.addr();

    // Healthy baseline: everything admitted by Redis.
    let samples = traffic(addr, &["/allow", "/deny"], 4, Duration::from_millis(500)).await;
    let all: Vec<Duration> = samples.values().flatten().map(|s| s.took).collect();
    let (p50, p95, max) = percentiles(&all);
    println!(
        "healthy: {} requests, latency p50 {p50:?} p95 {p95:?} max {max:?}",
        all.len()
    );
    assert!(samples.values().flatten().all(|s| s.status == 200));
    for route in ["allow", "deny"] {
        let sent = samples[format!("/{route}").as_str()].len() as u64;
        assert_eq!(proxy.decisions(route, "allowed"), sent, "{route}");
    }
    assert_eq!(total(&store_errors(&proxy)), 0);

    // (a) Killed: connections reset, port closed.
    redis.kill();
    // Long enough for a few `maintain` rounds (PING, reconnect attempts) to happen under it.
    fault_phase("killed", &proxy, &up, Duration::from_millis(2500)).await;
    let t = wait_readyz(&proxy, 503, Duration::from_secs(5));
    println!("killed: /readyz 503 (after another {t:?})");
    assert!(proxy.is_running(), "slidegate exited while Redis was down");

    redis.restart();
    let recovery = wait_readyz(&proxy, 200, READY_WITHIN);
    println!("restarted after kill: /readyz 200 after {recovery:?}");
    let reply = get(addr, "/deny", &[]).await;
    assert_eq!(reply.status, 200, "{reply:?}");

    // (b) Frozen: sockets stay open, nothing answers.
    redis.freeze();
    // Longer than 5 failed PINGs: the store drops the connection and tries new ones against
    // the frozen server (the kernel still accepts them), all while requests are answered.
    fault_phase("frozen", &proxy, &up, Duration::from_secs(7)).await;
    let t = wait_readyz(&proxy, 503, Duration::from_secs(5));
    println!("frozen: /readyz 503 (after another {t:?})");
    assert!(
        proxy.is_running(),
        "slidegate exited while Redis was frozen"
    );

    // (c) An empty Redis on the same port (the frozen one is killed).
    let restarted = Instant::now();
    redis.restart();
    let recovery = wait_readyz(&proxy, 200, READY_WITHIN);
    println!(
        "replaced frozen Redis: /readyz 200 after {recovery:?} ({:?} after the kill)",
        restarted.elapsed()
    );
    let hits = up.hits();
    let statuses = flood(&[addr], EXACT_CLIENTS, "/exact").await;
    println!(
        "after recovery: {EXACT_CLIENTS} concurrent on {EXACT} per 1m: {statuses:?}, upstream \
         hits +{}",
        up.hits() - hits
    );
    assert_eq!(count(&statuses, 200), EXACT as usize, "{statuses:?}");
    assert_eq!(
        count(&statuses, 429),
        EXACT_CLIENTS - EXACT as usize,
        "{statuses:?}"
    );
    assert_eq!(up.hits() - hits, u64::from(EXACT));
    assert_eq!(proxy.decisions("exact", "allowed"), u64::from(EXACT));
    assert!(proxy.is_running(), "slidegate exited");
}

// ---------------------------------------------------------------------------------------------
// 4. Started with Redis down.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_started_with_redis_down_serves_then_enforces() {
    const LIMIT: usize = 3;
    const CLIENTS: usize = 20;
    // Reserve a port, then close it: the proxy starts against a Redis that is not there.
    let mut redis = RedisServer::start();
    redis.kill();
    let up = Upstream::start();
    let mut proxy = Proxy::start(
        &ConfigBuilder::new()
            .store(&redis_store(&redis, "timeout = \"1s\""))
            .upstream("app", up.addr())
            .route(
                "open",
                &route(
                    "/open",
                    "global",
                    LIMIT as u32,
                    "1m",
                    "on_error = \"allow\"",
                ),
            )
            .route(
                "closed",
                &route(
                    "/closed",
                    "global",
                    LIMIT as u32,
                    "1m",
                    "on_error = \"deny\"",
                ),
            )
            .build(),
    );
    let pid = proxy.pid();
    assert_eq!(
        proxy.admin_get("/readyz?store").0,
        503,
        "store ready without Redis"
    );
    // The "open" route serves (on_error = "allow"): the process is ready for traffic.
    let (status, body) = proxy.admin_get("/readyz");
    assert_eq!(
        (status, body.lines().take(2).collect::<Vec<_>>()),
        (200, vec!["ready", "store: down"])
    );

    // on_error applies, beyond the limit too (nothing can be counted).
    for i in 0..2 * LIMIT {
        let (open, took_open) = timed(proxy.addr(), "/open", &[]).await;
        let (closed, took_closed) = timed(proxy.addr(), "/closed", &[]).await;
        assert_eq!(open.status, 200, "request {i}: {open:?}");
        assert_eq!(closed.status, 503, "request {i}: {closed:?}");
        assert_eq!(closed.header("retry-after"), Some("1"), "{closed:?}");
        assert!(
            took_open.max(took_closed) < FAULT_MAX,
            "{took_open:?} {took_closed:?}"
        );
    }
    assert_eq!(proxy.decisions("open", "error_allowed"), 2 * LIMIT as u64);
    assert_eq!(proxy.decisions("closed", "error_denied"), 2 * LIMIT as u64);
    assert_eq!(up.hits(), 2 * LIMIT as u64);

    redis.restart();
    let ready = wait_readyz(&proxy, 200, READY_WITHIN);
    println!("Redis started after the proxy: /readyz 200 after {ready:?}");

    let hits = up.hits();
    let statuses = flood(&[proxy.addr()], CLIENTS, "/closed").await;
    let statuses_open = flood(&[proxy.addr()], CLIENTS, "/open").await;
    println!(
        "then {CLIENTS} concurrent per route on {LIMIT} per 1m: closed {statuses:?}, open \
         {statuses_open:?}"
    );
    for s in [&statuses, &statuses_open] {
        assert_eq!(count(s, 200), LIMIT, "{s:?}");
        assert_eq!(count(s, 429), CLIENTS - LIMIT, "{s:?}");
    }
    assert_eq!(up.hits() - hits, 2 * LIMIT as u64);
    assert!(proxy.is_running());
    assert_eq!(proxy.pid(), pid);
}

// ---------------------------------------------------------------------------------------------
// 5. Clock skew.

/// libfaketime's preload library. Its absence fails the test: a skipped skew test would read as
/// a passing one.
fn faketime_lib() -> PathBuf {
    let mut candidates = vec![
        PathBuf::from("/usr/lib/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/lib64/faketime/libfaketime.so.1"),
    ];
    // Debian and Ubuntu: /usr/lib/<multiarch triple>/faketime/.
    if let Ok(dirs) = std::fs::read_dir("/usr/lib") {
        candidates.extend(
            dirs.filter_map(Result::ok)
                .map(|d| d.path().join("faketime/libfaketime.so.1")),
        );
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
            "the clock-skew test needs libfaketime (libfaketime.so.1 not found under /usr/lib): \
             apt-get install faketime"
        )
        })
}

/// Options running the binary with its wall clock shifted by `offset` (libfaketime syntax, e.g.
/// "+1h"). The monotonic clock is left alone, as NTP leaves it: timers keep working, and only the
/// wall clock, which a proxy could wrongly decide with, is wrong.
fn skewed(lib: &std::path::Path, offset: &str) -> ProxyOptions {
    ProxyOptions {
        env: vec![
            ("LD_PRELOAD".into(), lib.display().to_string()),
            ("FAKETIME".into(), offset.into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ],
        ..ProxyOptions::default()
    }
}

/// How far ahead of ours the process's wall clock is, from the `Date` of its admin response.
async fn clock_offset(proxy: &Proxy) -> i64 {
    let reply = get(proxy.admin_addr(), "/healthz", &[]).await;
    let date = reply
        .header("date")
        .unwrap_or_else(|| panic!("no Date header: {reply:?}"));
    let theirs = httpdate::parse_http_date(date).unwrap_or_else(|e| panic!("Date {date:?}: {e}"));
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64
    };
    secs(theirs) - secs(SystemTime::now())
}

/// Two proxies whose clocks are two hours apart (+1 h and -1 h) share one Redis: they see one
/// window, exactly, because every decision uses Redis's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skewed_proxies_share_one_window() {
    let lib = faketime_lib();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .store(&redis_store(
            &redis,
            "timeout = \"1s\"\non_error = \"deny\"",
        ))
        .upstream("app", up.addr())
        .route("skew", &route("/", "global", 5, "2s", ""))
        .build();
    let ahead = Proxy::start_with(&toml, skewed(&lib, "+1h"));
    let behind = Proxy::start_with(&toml, skewed(&lib, "-1h"));
    wait_readyz(&ahead, 200, READY_WITHIN);
    wait_readyz(&behind, 200, READY_WITHIN);

    // The skew is real, or the test proves nothing.
    let (off_a, off_b) = (clock_offset(&ahead).await, clock_offset(&behind).await);
    println!("skew: proxy A's clock is {off_a:+} s off, proxy B's {off_b:+} s");
    assert!(
        (off_a - 3600).abs() < 120,
        "proxy A's clock is {off_a:+} s off, not +3600 s: libfaketime is not effective"
    );
    assert!(
        (off_b + 3600).abs() < 120,
        "proxy B's clock is {off_b:+} s off, not -3600 s: libfaketime is not effective"
    );

    let (a, b) = (ahead.addr(), behind.addr());
    let start = Instant::now();
    // 3 via A, 2 via B, interleaved: one log, counting down across both proxies.
    for (i, addr) in [a, b, a, b, a].into_iter().enumerate() {
        let reply = get(addr, "/", &[]).await;
        assert_eq!(reply.status, 200, "request {i}: {reply:?}");
        let (r, t) = policy(&reply, "skew-2s");
        assert_eq!(r, 4 - i as u64, "request {i}: {reply:?}");
        assert!((1..=2).contains(&t), "request {i}: {reply:?}");
    }
    let filled = Instant::now();
    let mut waits = Vec::new();
    for (name, addr) in [("A", a), ("B", b), ("A", a), ("B", b)] {
        let reply = get(addr, "/", &[]).await;
        assert_eq!(violated(&reply), ["skew-2s"], "via {name}");
        let (r, t) = policy(&reply, "skew-2s");
        assert_eq!(r, 0, "{reply:?}");
        assert!((1..=2).contains(&t), "via {name}: {reply:?}");
        let wait = retry_after(&reply);
        assert!(
            (1..=2).contains(&wait),
            "via {name}: Retry-After {wait}: {reply:?}"
        );
        waits.push((name, wait));
    }
    let spent = start.elapsed();
    assert!(
        spent < Duration::from_millis(1500),
        "9 requests took {spent:?}, too slow for a 2 s window"
    );
    // After the window slides, both admit again, still from one log.
    tokio::time::sleep_until((filled + Duration::from_millis(2100)).into()).await;
    let after_a = get(a, "/", &[]).await;
    let after_b = get(b, "/", &[]).await;
    assert_eq!(after_a.status, 200, "{after_a:?}");
    assert_eq!(after_b.status, 200, "{after_b:?}");
    assert_eq!(policy(&after_a, "skew-2s").0, 4);
    assert_eq!(policy(&after_b, "skew-2s").0, 3);

    let allowed = ahead.decisions("skew", "allowed") + behind.decisions("skew", "allowed");
    println!(
        "skew: A (+1h) and B (-1h) admitted 3 + 2 of 5 per 2s, then denied with Retry-After \
         {waits:?}; after the slide A r=4, B r=3; allowed {allowed}, upstream hits {}",
        up.hits()
    );
    assert_eq!(allowed, 7);
    assert_eq!(up.hits(), 7);
}

// ---------------------------------------------------------------------------------------------
// 6. Local deny cache, exact across proxies.

/// One request of the deny-cache flood: sent, answered, admitted?
struct Shot {
    sent: Instant,
    recv: Instant,
    admitted: bool,
}

/// Two proxies (deny cache on) share 5 per 1 s; a continuous flood through both for 3.5 s.
/// The admissions never exceed 5 in any 1 s window, freed room is taken promptly (the cache
/// never denies what Redis would admit), and most denials cost no Redis call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_is_exact_across_proxies_and_saves_redis_calls() {
    const LIMIT: usize = 5;
    const WINDOW: Duration = Duration::from_secs(1);
    const FLOOD: Duration = Duration::from_millis(3500);
    const WORKERS: usize = 6;
    /// Bound on the time from a slot freeing to a flood request being admitted through it.
    const SLACK: Duration = Duration::from_millis(300);
    let _alone = ALONE.lock().await;
    let redis = RedisServer::start();
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .store(&redis_store(
            &redis,
            "timeout = \"1s\"\non_error = \"deny\"",
        ))
        .upstream("app", up.addr())
        .route("cache", &route("/", "global", LIMIT as u32, "1s", ""))
        .build();
    let proxies = [Proxy::start(&toml), Proxy::start(&toml)];
    for p in &proxies {
        wait_readyz(p, 200, READY_WITHIN);
    }
    reset_stats(&redis);

    let begin = Instant::now();
    let end = begin + FLOOD;
    let mut tasks = tokio::task::JoinSet::new();
    for p in &proxies {
        for _ in 0..WORKERS {
            let addr = p.addr();
            tasks.spawn(async move {
                let mut shots = Vec::new();
                while Instant::now() < end {
                    let sent = Instant::now();
                    let reply = get(addr, "/", &[]).await;
                    assert!(matches!(reply.status, 200 | 429), "{reply:?}");
                    shots.push(Shot {
                        sent,
                        recv: Instant::now(),
                        admitted: reply.status == 200,
                    });
                }
                shots
            });
        }
    }
    let mut shots = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        shots.extend(joined.expect("flood worker"));
    }
    let flood_end = shots.iter().map(|s| s.sent).max().expect("some requests");
    let calls = redis.script_calls();
    let mut admitted: Vec<&Shot> = shots.iter().filter(|s| s.admitted).collect();
    admitted.sort_by_key(|s| s.recv);
    let denied = shots.len() - admitted.len();
    let at = |t: Instant| t.duration_since(begin).as_millis();
    println!(
        "deny cache: {} requests through 2 proxies in {:?}: {} admitted at {:?} ms, {denied} \
         denied; Redis script calls {calls} ({:.4} per denied request); cache hits ≈ {}",
        shots.len(),
        flood_end - begin,
        admitted.len(),
        admitted.iter().map(|s| at(s.recv)).collect::<Vec<_>>(),
        calls as f64 / denied.max(1) as f64,
        shots.len() as u64 - calls.min(shots.len() as u64),
    );

    // Exact: an admission happened somewhere in [sent, recv]. Six admissions all inside one
    // interval [sent_a, sent_a + window) would prove six in one window.
    for a in &admitted {
        let inside = admitted
            .iter()
            .filter(|b| b.sent >= a.sent && b.recv < a.sent + WINDOW)
            .count();
        assert!(
            inside <= LIMIT,
            "{inside} admissions within 1 s from {} ms",
            at(a.sent)
        );
    }
    // Prompt: the slot of admission `i` frees by `recv_i + window`; the continuous flood must
    // then get one more admission in within SLACK (either through that slot, or because the
    // window was still full of later admissions).
    for a in &admitted {
        let freed = a.recv + WINDOW;
        if freed + SLACK > flood_end {
            continue;
        }
        assert!(
            admitted
                .iter()
                .any(|b| b.recv > a.recv && b.recv <= freed + SLACK),
            "slot of the admission answered at {} ms freed by {} ms but nothing was admitted \
             until {} ms",
            at(a.recv),
            at(freed),
            at(freed + SLACK)
        );
    }
    let total_allowed: u64 = proxies
        .iter()
        .map(|p| p.decisions("cache", "allowed"))
        .sum();
    let total_denied: u64 = proxies.iter().map(|p| p.decisions("cache", "denied")).sum();
    assert_eq!(total_allowed, admitted.len() as u64);
    assert_eq!(total_denied, denied as u64);
    assert_eq!(up.hits(), admitted.len() as u64);
    // Windows starting at about 0, 1, 2 and 3 s: at least three full batches.
    assert!(
        admitted.len() >= 3 * LIMIT,
        "only {} admitted",
        admitted.len()
    );
    assert!(
        denied >= 100,
        "the flood was too thin to say anything: {denied} denials"
    );
    assert!(
        (calls as f64) < 0.2 * denied as f64,
        "{calls} Redis calls for {denied} denials: the deny cache is not answering"
    );
}

/// The deny cache rests on Redis keeping its state. When Redis restarts empty, the cached
/// denials are void: once the proxy has seen the connection drop (`/readyz?store` back to 200 after
/// the restart), the next request is decided by the new, empty Redis and admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_is_dropped_when_redis_restarts_empty() {
    let _alone = ALONE.lock().await;
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .store(&redis_store(&redis, "timeout = \"1s\""))
            .upstream("app", up.addr())
            .route("r", &route("/r", "global", 2, "1m", "on_error = \"deny\""))
            .build(),
    );
    wait_readyz(&proxy, 200, READY_WITHIN);
    for _ in 0..2 {
        assert_eq!(get(proxy.addr(), "/r", &[]).await.status, 200);
    }
    // The first denial comes from Redis, the following ones from the cache.
    for _ in 0..3 {
        assert_eq!(get(proxy.addr(), "/r", &[]).await.status, 429);
    }
    redis.restart();
    // Every request until the proxy notices the restart is at worst denied from the cache or
    // refused by on_error = "deny"; poll until Redis (empty) admits again.
    let deadline = Instant::now() + READY_WITHIN;
    let mut statuses = Vec::new();
    loop {
        let status = get(proxy.addr(), "/r", &[]).await.status;
        statuses.push(status);
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still not admitted after the restart: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "after an empty Redis restart: admitted again after {} requests {statuses:?}",
        statuses.len()
    );
    assert_eq!(proxy.admin_get("/readyz?store").0, 200);
    // And the new Redis enforces the limit exactly: one more, then denied.
    assert_eq!(get(proxy.addr(), "/r", &[]).await.status, 200);
    assert_eq!(get(proxy.addr(), "/r", &[]).await.status, 429);
}
