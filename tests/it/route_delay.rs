//! Smoothing bursts (issue 21 item 4: `max_delay`, `max_queue`) through the real binary on the
//! memory and Redis stores, over HTTP/1.1, h2c, and HTTP/1.1 and HTTP/2 over TLS. On a route
//! of 2 requests per second with `max_delay = "1s"`:
//! - a third request waits until the first entry leaves the window, then gets 200 (`decision="delayed"`);
//! - with `max_queue = 1`, of three concurrent extra requests one waits, two get 429 at once;
//! - a request for which room frees after `max_delay` (a 1-per-10s route) gets 429 at once;
//! - a client that disconnects mid-wait frees its place: the next request can queue;
//! - the upstream never sees more than 2 requests of one client within any second.
//!
//! And an h2c burst of 1000 streams on a `max_queue = 8` route: 8 wait, the rest 429 at once.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::arrivals::{arrivals, tightest_span, until_metric};
use common::config::assert_invalid;
use common::fetch::{fetch, url};
use common::load::{h2load, Burst};
use common::proxy::{ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;
use slidegate::config::{Config, ConfigError};

const SECOND: Duration = Duration::from_secs(1);
/// An answer "at once": no wait for room (a debug build on a shared 2-core machine).
const AT_ONCE: Duration = Duration::from_millis(400);
/// Forwarding jitter allowed between the store's admission and the upstream's arrival.
const JITTER: Duration = Duration::from_millis(60);
const WAITING: &str = "slidegate_requests_waiting";

/// Routes keyed by `X-Client`: `/smooth` 2 per 1s with `max_delay = "1s"` (default queue),
/// `/one` the same with `max_queue = 1`, `/far` 1 per 10s with `max_delay = "1s"`, `/burst` 2
/// per 3s with `max_delay = "3s"` (the queue of 8 from `[store]`).
fn start(store_lines: &str, up: &Upstream, ca: &TestCa) -> Proxy {
    let route = |path: &str, limit: &str, extra: &str| {
        format!(
            "path_prefix = \"/{path}\"\nkey = \"header:X-Client\"\n\
             limits = [{{ {limit} }}]\n{extra}"
        )
    };
    let config = ConfigBuilder::new()
        .store(&format!("{store_lines}\nmax_queue = 8"))
        .upstream("app", up.addr())
        .route(
            "smooth",
            &route(
                "smooth",
                "requests = 2, window = \"1s\"",
                "max_delay = \"1s\"",
            ),
        )
        .route(
            "one",
            &route(
                "one",
                "requests = 2, window = \"1s\"",
                "max_delay = \"1s\"\nmax_queue = 1",
            ),
        )
        .route(
            "far",
            &route(
                "far",
                "requests = 1, window = \"10s\"",
                "max_delay = \"1s\"",
            ),
        )
        .route(
            "burst",
            &route(
                "burst",
                "requests = 2, window = \"3s\"",
                "max_delay = \"3s\"",
            ),
        )
        .build();
    let proxy = Proxy::start_with(&config, tls_options(ca, "h2c = true"));
    // Decide nothing before the store answers (until then `on_error` would).
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    proxy
}

/// One GET of `path` as client `who`: its status and how long it took.
async fn timed(
    proxy: &Proxy,
    client: &reqwest::Client,
    p: Protocol,
    path: &str,
    who: &str,
) -> (u16, Duration) {
    let started = Instant::now();
    let seen = fetch(client, &url(proxy, p, path), who, p.version()).await;
    (seen.status, started.elapsed())
}

/// A third request waits until the first of two admitted frees, and no sooner: returns how
/// much later than the earliest possible instant it was answered.
async fn waits_for_room(proxy: &Proxy, client: &reqwest::Client, p: Protocol) -> Duration {
    let who = format!("smooth-{p:?}");
    let first_sent = Instant::now();
    assert_eq!(timed(proxy, client, p, "/smooth", &who).await.0, 200);
    let first_answered = Instant::now();
    assert_eq!(timed(proxy, client, p, "/smooth", &who).await.0, 200);
    let sent = Instant::now();
    let (status, took) = timed(proxy, client, p, "/smooth", &who).await;
    assert_eq!(
        status, 200,
        "{p:?}: the third waits for room instead of a 429"
    );
    // The first request was recorded between its sending and its answer: room frees
    // one window after some instant in there.
    let (earliest, latest) = (first_sent + SECOND, first_answered + SECOND);
    let answered = sent + took;
    assert!(answered >= earliest, "{p:?}: answered before room freed");
    assert!(
        answered <= latest + AT_ONCE,
        "{p:?}: {took:?} is well past the instant room freed ({:?} after it)",
        answered - latest
    );
    println!(
        "{p:?}: waited {took:?}; room freed {:?}..{:?} after it was sent",
        earliest.saturating_duration_since(sent),
        latest.saturating_duration_since(sent)
    );
    answered - earliest
}

/// With `max_queue = 1`, three concurrent extra requests: one waits and is admitted, two are
/// denied at once.
async fn a_full_queue_denies_at_once(proxy: &Proxy, client: &reqwest::Client, p: Protocol) {
    let who = format!("one-{p:?}");
    for _ in 0..2 {
        assert_eq!(timed(proxy, client, p, "/one", &who).await.0, 200);
    }
    let extra = (0..3).map(|_| timed(proxy, client, p, "/one", &who));
    let mut answers = futures::future::join_all(extra).await;
    answers.sort();
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 429, 429], "{p:?}: {answers:?}");
    for (_, took) in &answers[1..] {
        assert!(
            *took < AT_ONCE,
            "{p:?}: a 429 past a full queue waited {took:?}"
        );
    }
    assert!(answers[0].1 > AT_ONCE, "{p:?}: the waiter {answers:?}");
}

/// Room that frees after `max_delay` is not waited for.
async fn beyond_max_delay_denies_at_once(proxy: &Proxy, client: &reqwest::Client, p: Protocol) {
    let who = format!("far-{p:?}");
    assert_eq!(timed(proxy, client, p, "/far", &who).await.0, 200);
    let (status, took) = timed(proxy, client, p, "/far", &who).await;
    assert_eq!(status, 429, "{p:?}");
    assert!(took < AT_ONCE, "{p:?}: waited {took:?} for room 10 s away");
}

/// A client that leaves mid-wait gives its place back: with `max_queue = 1`, the next request
/// waits (and is admitted) instead of a 429.
async fn a_client_that_leaves_frees_its_place(proxy: &Proxy, ca: &TestCa, p: Protocol) {
    let who = format!("gone-{p:?}");
    let client = p.client(&ca.ca_pem());
    for _ in 0..2 {
        assert_eq!(timed(proxy, &client, p, "/one", &who).await.0, 200);
    }
    let leaving = {
        // Its own client, so that dropping the request closes its connection (HTTP/1) or
        // resets its stream (HTTP/2).
        let (client, url, who) = (p.client(&ca.ca_pem()), url(proxy, p, "/one"), who.clone());
        tokio::spawn(async move { client.get(url).header("x-client", who).send().await })
    };
    until_metric(proxy, WAITING, 1.0, 5 * SECOND).await;
    leaving.abort();
    until_metric(proxy, WAITING, 0.0, 5 * SECOND).await;
    let (status, took) = timed(proxy, &client, p, "/one", &who).await;
    assert_eq!(status, 200, "{p:?}: the freed place was taken ({took:?})");
}

async fn exercise(store: &str) -> Vec<Duration> {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(store, &up, &ca);
    let mut lateness = Vec::new();
    for p in Protocol::ALL {
        let client = p.client(&ca.ca_pem());
        lateness.push(waits_for_room(&proxy, &client, p).await);
        a_full_queue_denies_at_once(&proxy, &client, p).await;
        beyond_max_delay_denies_at_once(&proxy, &client, p).await;
        a_client_that_leaves_frees_its_place(&proxy, &ca, p).await;
        for (prefix, requests) in [("smooth", 2), ("one", 2), ("gone", 2), ("far", 1)] {
            let seen = arrivals(&up, "x-client", &format!("{prefix}-{p:?}"));
            let limit = if prefix == "far" { 10 * SECOND } else { SECOND };
            if let Some(span) = tightest_span(&seen, requests) {
                assert!(
                    span + JITTER >= limit,
                    "{p:?} {prefix}: {} arrivals within {span:?}",
                    requests + 1
                );
            }
        }
    }
    let n = Protocol::ALL.len() as u64;
    // Per protocol: the third /smooth request, the /one waiter, the request after the leaver.
    assert_eq!(proxy.decisions("smooth", "delayed"), n, "{store}");
    assert_eq!(proxy.decisions("one", "delayed"), 2 * n, "{store}");
    // Two past the full queue and the client that left, per protocol.
    assert_eq!(proxy.decisions("one", "denied"), 3 * n, "{store}");
    assert_eq!(proxy.decisions("far", "denied"), n, "{store}");
    let waits = proxy.counter("slidegate_delay_seconds_count{route=\"one\"}");
    assert_eq!(waits, 3 * n, "{store}: the leaver's wait is observed too");
    lateness.sort();
    println!(
        "{store}: answered after the earliest instant room frees by min {:?} / p50 {:?} / max {:?}",
        lateness[0],
        lateness[lateness.len() / 2],
        lateness[lateness.len() - 1]
    );
    lateness
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoothing_on_the_memory_store() {
    exercise("backend = \"memory\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoothing_on_the_redis_store() {
    let redis = RedisServer::start();
    exercise(&redis.store_toml()).await;
}

/// 1000 concurrent h2c streams of one client on a route of 2 per 3 s, `max_delay = "3s"`,
/// queue 8: 2 admitted at once, 8 wait (2 of them get the room that frees 3 s later, 6
/// find the next room beyond their budget), the other 990 get 429 without waiting; the
/// upstream never sees 3 within 3 s.
#[test]
fn an_h2_burst_queues_max_queue_and_denies_the_rest_at_once() {
    let redis = RedisServer::start();
    for store in ["backend = \"memory\"".to_string(), redis.store_toml()] {
        let (up, ca) = (Upstream::start(), TestCa::new("ca"));
        let proxy = start(&store, &up, &ca);
        let burst = Burst {
            connections: 10,
            streams: 100,
            requests: 1000,
            headers: vec!["X-Client: burst".into()],
            path: "/burst".into(),
        };
        let started = Instant::now();
        let r = h2load(proxy.addr(), &burst);
        let took = started.elapsed();
        assert_eq!((r.s2xx, r.s4xx, r.failed), (4, 996, 0), "{store}: {r:?}");
        assert_eq!(proxy.decisions("burst", "delayed"), 2, "{store}");
        assert_eq!(proxy.decisions("burst", "denied"), 996, "{store}");
        let waited = proxy.counter("slidegate_delay_seconds_count{route=\"burst\"}");
        assert_eq!(waited, 8, "{store}: exactly max_queue waited");
        let seen = arrivals(&up, "x-client", "burst");
        assert_eq!(seen.len(), 4);
        let span = tightest_span(&seen, 2).expect("4 arrivals");
        // Each waiter is admitted at least 3 s after one of the first two admissions, which came
        // after `started`; so any 3 arrivals span at least 3 s less the lag of the first two
        // arrivals behind `started` (94 ms measured on an idle machine, 650 ms on a busy one,
        // while the proxy answers the other 998 streams). That lag is measured, not guessed: a
        // waiter admitted early still fails this, at any load.
        let mut sorted = seen.clone();
        sorted.sort();
        let jitter = sorted[1].saturating_duration_since(started) + Duration::from_millis(1);
        assert!(
            span + jitter >= 3 * SECOND,
            "{store}: 3 arrivals within {span:?}"
        );
        println!(
            "{store}: 1000 h2c streams in {took:?}: 4 x 200 (2 after waiting), 996 x 429, \
             8 waited; slowest {:?}; tightest 3 arrivals {span:?}; arrivals after the start {:?}",
            r.max_latency,
            seen.iter()
                .map(|t| t.duration_since(started))
                .collect::<Vec<_>>()
        );
    }
}

/// Each bad value is refused with the file, its line and its key.
#[test]
fn bad_smoothing_keys_name_file_line_and_key() {
    let base = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\n\
                upstream = \"app\"\n";
    for (extra, key, message) in [
        (
            "max_delay = \"61s\"\n",
            "routes[0].max_delay",
            "longer than 1m",
        ),
        (
            "max_delay = \"soon\"\n",
            "routes[0].max_delay",
            "invalid duration",
        ),
        (
            "max_delay = \"1s\"\nmax_queue = 0\n",
            "routes[0].max_queue",
            "1 to 1000",
        ),
        (
            "max_delay = \"1s\"\nmax_queue = 1001\n",
            "routes[0].max_queue",
            "1 to 1000",
        ),
        ("max_queue = 4\n", "routes[0].max_queue", "max_delay"),
        (
            "max_delay = \"0s\"\nmax_queue = 4\n",
            "routes[0].max_queue",
            "max_delay",
        ),
    ] {
        let text = format!("{base}{extra}");
        let line = 9 + extra.lines().count() - 1;
        assert_invalid(&text, key, line, message);
    }
    let with_store =
        |store: &str| base.replace("[upstreams", &format!("[store]\n{store}[upstreams"));
    match Config::from_toml(Path::new("d.toml"), &with_store("max_queue = 0\n")) {
        Err(ConfigError::Invalid { line, key, .. }) => {
            assert_eq!((key.as_str(), line), ("store.max_queue", Some(5)));
        }
        other => panic!("{other:?}"),
    }
    // The store's defaults reach the route; the route's own values win; "0s" turns it off.
    let store = "max_delay = \"500ms\"\nmax_queue = 3\n";
    let config = Config::from_toml(Path::new("d.toml"), &with_store(store)).unwrap();
    let s = config.routes[0].smoothing.expect("inherited");
    assert_eq!((s.max_delay, s.max_queue), (Duration::from_millis(500), 3));
    let own = format!("{}max_queue = 5\n", with_store(store));
    let s = Config::from_toml(Path::new("d.toml"), &own).unwrap().routes[0].smoothing;
    assert_eq!(s.map(|s| s.max_queue), Some(5));
    let off = format!("{}max_delay = \"0s\"\n", with_store(store));
    let config = Config::from_toml(Path::new("d.toml"), &off).unwrap();
    assert_eq!(config.routes[0].smoothing, None);
    let plain = Config::from_toml(Path::new("d.toml"), base).unwrap();
    assert_eq!(
        plain.routes[0].smoothing, None,
        "no max_delay: today's behaviour"
    );
}
