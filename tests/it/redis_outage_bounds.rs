//! What a limit admits when the proxy, not Redis, is the bottleneck, and when Redis goes away
//! mid-window (issue 32 rows 4 and 5), through the real binary, real Redis and real h2load.
//!
//! - Row 4: Redis far away (a delay proxy) and a flood that fills the proxy's decision queue:
//!   past the queue the proxy sheds (`503`, `decision="overloaded"`), never `on_error`'s local
//!   log, so a victim already at its limit gets nothing more; store errors stay 0.
//! - Row 5: two proxies, Redis stopped after the limit was admitted: each proxy's local log
//!   starts from what it last learned of the bucket, so the outage admits at most
//!   `proxies × limit` **including** what Redis admitted.

use crate::common;

use std::time::Duration;

use common::delay_proxy::DelayProxy;
use common::http::send;
use common::load::{h2load, Burst};
use common::proxy::{start_ready, ConfigBuilder, Proxy, ProxyOptions};
use common::redis::RedisServer;
use common::upstream::Upstream;

/// The flood test would starve the outage test's proxies of CPU: one at a time.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn status(proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> u16 {
    send(proxy.addr(), "GET", path, headers).await.status
}

/// Row 4. The flood's own route admits everything (a limit it never reaches), so every one of
/// its requests needs Redis and the one queue (a single Redis has one) fills; the victim shares
/// that queue on a route of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_proxy_sheds_and_never_opens_a_limit() {
    let _permit = common::heavy::heavy();
    const VICTIM_LIMIT: usize = 7;
    let _alone = ALONE.lock().await;
    let redis = RedisServer::start();
    // 150 ms each way: Redis answers at most about 4 calls of 64 per 300 ms, far below what the
    // flood sends, so the queue of 4096 fills within a second or two.
    let far = DelayProxy::start(
        ([127, 0, 0, 1], redis.port()).into(),
        Duration::from_millis(150),
    );
    let upstream = Upstream::start();
    // A long timeout: the store always answers here, so no decision may time out.
    let store = format!(
        "backend = \"redis\"\nurl = \"redis://{}/\"\ntimeout = \"8s\"",
        far.addr()
    );
    let toml = ConfigBuilder::new()
        .store(&store)
        .upstream("app", upstream.addr())
        .route(
            "victim",
            &format!(
                "path_prefix = \"/victim\"\nkey = \"query:who\"\non_error = \"local\"\n\
                 limits = [{{ requests = {VICTIM_LIMIT}, window = \"5m\" }}]"
            ),
        )
        .route(
            "flood",
            "path_prefix = \"/flood\"\nkey = \"query:who\"\non_error = \"local\"\n\
             limits = [{ requests = 1000000, window = \"5m\" }]",
        )
        .build();
    let proxy = start_ready(&toml, ProxyOptions::h2c_two_threads());
    let mut admitted = 0;
    for _ in 0..VICTIM_LIMIT {
        admitted += usize::from(status(&proxy, "/victim?who=v", &[]).await == 200);
    }
    assert_eq!(
        admitted, VICTIM_LIMIT,
        "the victim's own quota before the flood"
    );

    // Three floods of made-up keys at once, 40 connections × 100 streams each: 12,000 streams
    // in flight against a queue of 4096 (8,000 requests each; 16,000 took about a minute).
    let addr = proxy.addr();
    let floods: Vec<_> = (0..3)
        .map(|f| {
            let burst = Burst {
                connections: 40,
                streams: 100,
                requests: 8_000,
                headers: vec![],
                path: format!("/flood?who=made-up-{f}"),
            };
            std::thread::spawn(move || h2load(addr, &burst))
        })
        .collect();
    // The victim keeps asking while the floods run (bounded: 200 requests at most).
    let mut answers = Vec::new();
    for _ in 0..200 {
        if floods.iter().all(|f| f.is_finished()) {
            break;
        }
        answers.push(status(&proxy, "/victim?who=v", &[]).await);
    }
    let results: Vec<_> = floods.into_iter().map(|f| f.join().unwrap()).collect();
    let more = answers.iter().filter(|s| **s == 200).count();
    let shed = proxy.decisions("flood", "overloaded") + proxy.decisions("victim", "overloaded");
    println!(
        "victim during the floods: {} answers, {more} admitted, {} shed; floods {results:?}; \
         overloaded decisions {shed}",
        answers.len(),
        answers.iter().filter(|s| **s == 503).count()
    );
    assert!(
        shed > 0,
        "the queue never overflowed: the test proves nothing"
    );
    assert_eq!(
        more, 0,
        "the victim got {more} more past its limit: {answers:?}"
    );
    assert!(
        answers.iter().all(|s| [429, 503].contains(s)),
        "{answers:?}"
    );
    assert_eq!(proxy.store_errors(), 0, "Redis answered all along");
    for route in ["victim", "flood"] {
        assert_eq!(proxy.decisions(route, "local_allowed"), 0, "{route}");
        assert_eq!(proxy.decisions(route, "error_allowed"), 0, "{route}");
    }
    // Shed requests carry Retry-After, and the proxy still decides once the flood is over.
    let after = send(proxy.addr(), "GET", "/victim?who=v", &[]).await;
    assert_eq!(after.status, 429);
    let fresh = status(&proxy, "/victim?who=fresh", &[]).await;
    assert_eq!(fresh, 200);
}

/// Row 5, on two shapes of limit: a log and a slotted one with a second, longer limit.
#[tokio::test]
async fn an_outage_mid_window_admits_at_most_proxies_times_the_limit() {
    let _alone = ALONE.lock().await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let toml = ConfigBuilder::new()
        .store(&format!("{}\ntimeout = \"100ms\"", redis.store_toml()))
        .upstream("app", upstream.addr())
        .route(
            "log",
            "path_prefix = \"/log\"\nkey = \"header:X-K\"\non_error = \"local\"\n\
             limits = [{ requests = 5, window = \"1m\" }]",
        )
        .route(
            "slots",
            "path_prefix = \"/slots\"\nkey = \"header:X-K\"\non_error = \"local\"\n\
             limits = [{ requests = 4, window = \"30s\", resolution = \"1s\" }, \
                       { requests = 6, window = \"10m\" }]",
        )
        .build();
    let proxies = [
        start_ready(&toml, ProxyOptions::h2c_two_threads()),
        start_ready(&toml, ProxyOptions::h2c_two_threads()),
    ];
    let cases = [("/log", "k1", 5usize), ("/slots", "k2", 4usize)];
    for (path, key, limit) in cases {
        // The limit, admitted by Redis, alternating proxies (A, B, A, ...).
        for i in 0..limit {
            let got = status(&proxies[i % 2], path, &[("x-k", key)]).await;
            assert_eq!(got, 200, "{path} request {i}");
        }
    }
    redis.kill();
    for (path, key, limit) in cases {
        let mut outage = 0;
        for i in 0..6 * limit {
            let got = status(&proxies[i % 2], path, &[("x-k", key)]).await;
            assert!([200, 429].contains(&got), "{path}: {got}");
            outage += usize::from(got == 200);
        }
        let total = limit + outage;
        println!("{path}: {limit} admitted by Redis, {outage} in the outage, {total} in all");
        assert!(
            total <= 2 * limit,
            "{path}: {total} admitted, more than 2 × {limit}"
        );
        // The proxy whose last reply was the limit's last admission learned it was full.
        assert!(
            outage < limit,
            "{path}: {outage}: a local log started empty"
        );
    }
    for p in &proxies {
        assert!(p.decisions("log", "local_denied") > 0);
    }
}

/// Issue 52 row 2: a limit many clients share (`key = "global"`, or one per org) stays full in
/// an outage for clients that arrive only then: what the proxy learned is kept per bucket, not
/// per client (before: one proxy, 20 of 20 by Redis and then 20 more for new clients).
#[tokio::test]
async fn a_shared_bucket_seen_full_stays_full_for_new_clients_in_an_outage() {
    let _alone = ALONE.lock().await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let toml = ConfigBuilder::new()
        .store(&format!("{}\ntimeout = \"100ms\"", redis.store_toml()))
        .upstream("app", upstream.addr())
        .route(
            "org",
            "path_prefix = \"/org\"\nkey = \"header:X-User\"\non_error = \"local\"\n\
             limits = [{ requests = 50, window = \"1m\" }, \
                       { requests = 7, window = \"1m\", key = \"header:X-Org\" }]",
        )
        .route(
            "all",
            "path_prefix = \"/all\"\nkey = \"client_ip\"\non_error = \"local\"\n\
             limits = [{ requests = 50, window = \"1m\" }, \
                       { requests = 6, window = \"1m\", key = \"global\" }]",
        )
        .route(
            "glob",
            "path_prefix = \"/glob\"\nkey = \"global\"\non_error = \"local\"\n\
             limits = [{ requests = 5, window = \"1m\" }]",
        )
        .build();
    let proxy = start_ready(&toml, ProxyOptions::h2c_two_threads());
    let cases = [("/org", 7usize), ("/all", 6), ("/glob", 5)];
    for (path, limit) in cases {
        // The shared limit, admitted by Redis, each request from another user of org "acme".
        for i in 0..limit {
            let user = format!("early-{i}");
            let got = status(&proxy, path, &[("x-user", &user), ("x-org", "acme")]).await;
            assert_eq!(got, 200, "{path} request {i}");
        }
    }
    redis.kill();
    for (path, limit) in cases {
        let mut outage = 0;
        for i in 0..3 * limit {
            // Users the proxy has never seen, of the same org.
            let user = format!("late-{i}");
            let got = status(&proxy, path, &[("x-user", &user), ("x-org", "acme")]).await;
            assert!([200, 429].contains(&got), "{path}: {got}");
            outage += usize::from(got == 200);
        }
        println!("{path}: {limit} admitted by Redis, {outage} in the outage");
        assert_eq!(
            outage, 0,
            "{path}: the shared bucket started empty for new clients"
        );
    }
    // Another org's bucket was never learned: its local log admits it (one proxy: N).
    let mut other = 0;
    for i in 0..10 {
        let user = format!("beta-{i}");
        let got = status(&proxy, "/org", &[("x-user", &user), ("x-org", "beta")]).await;
        other += usize::from(got == 200);
    }
    assert_eq!(other, 7, "another org in the outage");
}

/// Row 3 through the binary: a made-up-key flood of two-request clients fills what the local
/// fallback remembers (`fallback_buckets = 1024`, the least; its default 65,536 is more than a
/// CI-minute flood of the debug build reaches) three times over, then Redis dies. The clients
/// at their limit before the flood stay full in the outage: the full map sheds spent,
/// one-request and the emptiest buckets first (before the fix it cleared a shard whole: the
/// audit's victim got 10 of 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_before_an_outage_never_forgets_a_client_at_its_limit() {
    const VICTIMS: usize = 20;
    const LIMIT: usize = 5;
    let _alone = ALONE.lock().await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let toml = ConfigBuilder::new()
        .store(&format!(
            "{}\ntimeout = \"100ms\"\nfallback_buckets = 1024",
            redis.store_toml()
        ))
        .upstream("app", upstream.addr())
        .route(
            "api",
            &format!(
                "path_prefix = \"/\"\nkey = \"header:X-K\"\non_error = \"local\"\n\
                 limits = [{{ requests = {LIMIT}, window = \"10m\" }}]"
            ),
        )
        .build();
    let proxy = start_ready(&toml, ProxyOptions::h2c_two_threads());
    for v in 0..VICTIMS {
        let key = format!("victim-{v}");
        for i in 0..LIMIT {
            let got = status(&proxy, "/", &[("x-k", &key)]).await;
            assert_eq!(got, 200, "{key} request {i}");
        }
    }
    // 3,072 made-up clients, two requests each: three times what the map holds.
    let addr = proxy.addr();
    let seen = tokio::task::spawn_blocking(move || {
        common::flood::flood(addr, ("/", "X-K"), "made-up", 0, 3 * 1024, 2)
    })
    .await
    .unwrap();
    assert_eq!(seen.get(&200), Some(&(2 * 3 * 1024)), "{seen:?}");
    redis.kill();
    let mut outage = 0;
    for v in 0..VICTIMS {
        let key = format!("victim-{v}");
        for _ in 0..LIMIT {
            let got = status(&proxy, "/", &[("x-k", &key)]).await;
            assert!([200, 429].contains(&got), "{key}: {got}");
            outage += usize::from(got == 200);
        }
    }
    println!("{VICTIMS} clients at {LIMIT} of {LIMIT}, a flood of 3,072 two-request keys, then an outage: {outage} more admitted");
    assert_eq!(
        outage, 0,
        "a client at its limit was forgotten by the flood"
    );
    assert!(proxy.decisions("api", "local_denied") >= (VICTIMS * LIMIT) as u64);
}
