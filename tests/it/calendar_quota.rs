//! Calendar quotas (`{ quota = 3, per = "day", time_zone = "Europe/Berlin" }`, issue 53) through
//! the real binary on the memory store, one Redis and a Redis Cluster, each process on a faked
//! wall clock (`common::fake_clock`: an `LD_PRELOAD` shim) set just before a calendar boundary:
//! a quota counts per period, its `t` and a denial's `Retry-After` are the time to the period's
//! end, it starts again at midnight in its zone, a Berlin day is 23 or 25 hours when the clocks
//! change, two proxies on one Redis share it exactly, Redis's clock decides when a proxy's is
//! ahead, it stacks all or nothing with a window, and it counts cost; over HTTP/1.1, h2c and
//! HTTP/2 over TLS. Config errors name file, line and key.

use crate::common;

use std::time::{Duration, Instant};

use common::config::assert_invalid;
use common::fake_clock;
use common::fetch::{fetch_with, url, Seen};
use common::proxy::{ConfigBuilder, Proxy};
use common::ratelimit::parse_ratelimit;
use common::redis::{RedisCluster, RedisServer};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// 2026-03-29 00:00:30 CET (23:00:30Z the day before): 30 s into a 23-hour Berlin day.
const SPRING_DAY_MS: i64 = 1_774_738_830_000;
/// 2026-10-25 00:00 CEST (2026-10-24T22:00Z): midnight before a 25-hour Berlin day.
const AUTUMN_MIDNIGHT_MS: i64 = 1_792_879_200_000;
/// How long before a boundary the processes start: their start-up (measured: under 1 s for a
/// proxy, 1 s for a Redis, about 5 s for a Cluster on a loaded 2-core machine) plus the 4 s
/// the test needs before the boundary, with room to spare; each test asserts it was enough.
fn lead(kind: &str) -> Duration {
    Duration::from_secs(match kind {
        "memory" => 8,
        "redis" => 9,
        _ => 14,
    })
}

/// Where the quota is counted: the proxies' own memory, one Redis, or a Cluster (each Redis on
/// the same faked clock as the proxies).
enum Backend {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    fn start(kind: &str, env: &[(String, String)]) -> Backend {
        match kind {
            "memory" => Backend::Memory,
            "redis" => Backend::Redis(RedisServer::start_env(&[], env)),
            _ => Backend::Cluster(RedisCluster::start_env(3, env)),
        }
    }

    fn store_toml(&self) -> String {
        match self {
            Backend::Memory => "backend = \"memory\"".into(),
            Backend::Redis(r) => r.store_toml(),
            Backend::Cluster(c) => format!("backend = \"redis_cluster\"\nurls = {:?}", c.urls()),
        }
    }
}

/// `n` proxies on `backend` with the routes of these tests, each on every protocol (TLS and
/// h2c beside HTTP/1.1) and started with `env` (its faked clock).
fn proxies(
    up: &Upstream,
    ca: &TestCa,
    backend: &Backend,
    env: &[(String, String)],
    n: usize,
) -> Vec<Proxy> {
    let config = ConfigBuilder::new()
        .store(&backend.store_toml())
        .upstream("app", up.addr())
        .route(
            "cal",
            "path_prefix = \"/cal\"\nkey = \"header:X-Client\"\n\
             limits = [{ quota = 3, per = \"day\", time_zone = \"Europe/Berlin\" }]",
        )
        .route(
            "both",
            "path_prefix = \"/both\"\nkey = \"header:X-Client\"\n\
             limits = [{ quota = 3, per = \"week\", time_zone = \"Europe/Berlin\" }, \
             { requests = 2, window = \"1s\" }]",
        )
        .route(
            "tokens",
            "path_prefix = \"/tokens\"\nkey = \"header:X-Client\"\ncost = \"header:X-Cost\"\n\
             limits = [{ quota = 10, per = \"month\", unit = \"cost\" }]",
        )
        .build();
    (0..n)
        .map(|_| {
            let mut options = tls_options(ca, "h2c = true");
            options.env = env.to_vec();
            let proxy = Proxy::start_with(&config, options);
            common::admin::wait_readyz(&proxy, 200, Duration::from_secs(30));
            proxy
        })
        .collect()
}

/// One request of client `who` to `path` over `p`, with `extra` headers.
async fn get(
    proxy: &Proxy,
    ca: &TestCa,
    p: Protocol,
    path: &str,
    who: &str,
    extra: &[(&str, &str)],
) -> Seen {
    let mut headers = vec![("x-client", who)];
    headers.extend_from_slice(extra);
    fetch_with(
        &p.client(&ca.ca_pem()),
        &url(proxy, p, path),
        &headers,
        p.version(),
    )
    .await
}

/// `r` and `t` of the one RateLimit item of `seen`.
fn r_t(seen: &Seen) -> (u64, u64) {
    let field = seen
        .ratelimit
        .as_deref()
        .unwrap_or_else(|| panic!("no RateLimit: {seen:?}"));
    let items = parse_ratelimit(field);
    (items[0].r, items[0].t)
}

const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

/// A 23-hour day: 30 s into Berlin's 2026-03-29, `t` is 23 h less 30 s; stacked with a window
/// all or nothing (a denial by the window costs the weekly quota nothing); cost units.
async fn spring_day(kind: &str) {
    let env = fake_clock::env(SPRING_DAY_MS);
    let started = Instant::now();
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let backend = Backend::start(kind, &env);
    let proxy = proxies(&up, &ca, &backend, &env, 1).remove(0);
    let since = |at: Instant| at.elapsed().as_secs();
    let first = get(&proxy, &ca, Protocol::H1, "/cal", "spring", &[]).await;
    assert_eq!(first.status, 200, "{kind}: {first:?}");
    let (r, t) = r_t(&first);
    let want = 23 * 3600 - 30 - since(started);
    assert_eq!(r, 2, "{kind}");
    assert!(
        t <= want + 1 && t + 2 >= want,
        "{kind}: t = {t}, the 23-hour day ends in {want}"
    );
    assert_eq!(
        first.policy.as_deref(),
        Some("\"cal-day\";q=3"),
        "{kind}: no `w`"
    );

    // Two by the window, the third denied by it, so the week still counts two.
    for _ in 0..2 {
        assert_eq!(
            get(&proxy, &ca, Protocol::H1, "/both", "s", &[])
                .await
                .status,
            200
        );
    }
    let by_window = get(&proxy, &ca, Protocol::H2c, "/both", "s", &[]).await;
    assert_eq!(by_window.status, 429, "{kind}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let third = get(&proxy, &ca, Protocol::H2Tls, "/both", "s", &[]).await;
    assert_eq!(
        third.status, 200,
        "{kind}: the window's denial counted in the week: {third:?}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fourth = get(&proxy, &ca, Protocol::H1, "/both", "s", &[]).await;
    assert_eq!(
        fourth.status, 429,
        "{kind}: the week's quota of 3 is used: {fourth:?}"
    );

    // Cost: 4 + 4 fit in 10, 4 more does not, 2 does.
    let cost = |c: &'static str| [("x-cost", c)];
    for (c, want) in [("4", 200), ("4", 200), ("4", 429), ("2", 200), ("1", 429)] {
        let seen = get(&proxy, &ca, Protocol::H1, "/tokens", "c", &cost(c)).await;
        assert_eq!(seen.status, want, "{kind}: cost {c}: {seen:?}");
    }
}

/// Midnight before a 25-hour day, on every protocol: three admitted (on two proxies sharing a
/// Redis), the fourth denied with `Retry-After` the time to midnight; after midnight admitted
/// again with `t` 25 h. The inspector names the period.
async fn autumn_midnight(kind: &str) {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    // Two proxies share a Redis; the memory store is one proxy's.
    let n = if kind == "memory" { 1 } else { 2 };
    // Started too late for the 4 s the test needs before midnight (a machine busier than the
    // lead allows for): everything is started again with twice the lead. Start-up is not what
    // this test is about; what happens at midnight is.
    let mut lead = lead(kind);
    let (midnight, _backend, proxies, left) = loop {
        let env = fake_clock::env(AUTUMN_MIDNIGHT_MS - lead.as_millis() as i64);
        let midnight = Instant::now() + lead;
        let backend = Backend::start(kind, &env);
        let proxies = proxies(&up, &ca, &backend, &env, n);
        let left = midnight.saturating_duration_since(Instant::now());
        if left > Duration::from_secs(4) {
            break (midnight, backend, proxies, left);
        }
        assert!(
            lead < Duration::from_secs(60),
            "{kind}: started too late ({left:?} to midnight) with a lead of {lead:?}"
        );
        eprintln!("{kind}: started {left:?} before midnight, again with twice {lead:?}");
        lead *= 2;
    };
    tokio::time::sleep(left - Duration::from_secs(3)).await;

    for (i, p) in PROTOCOLS.iter().enumerate() {
        let proxy = &proxies[i % n];
        let seen = get(proxy, &ca, *p, "/cal", "autumn", &[]).await;
        assert_eq!(seen.status, 200, "{kind} {p:?}: {seen:?}");
        let (r, t) = r_t(&seen);
        assert_eq!(r, 2 - i as u64, "{kind} {p:?}: one quota across proxies");
        assert!(
            (1..=3).contains(&t),
            "{kind} {p:?}: t = {t}, midnight is in 3 s or less"
        );
    }
    for (i, p) in PROTOCOLS.iter().enumerate() {
        let seen = get(&proxies[i % n], &ca, *p, "/cal", "autumn", &[]).await;
        assert_eq!(seen.status, 429, "{kind} {p:?}: {seen:?}");
        let retry: u64 = seen.retry_after.as_deref().unwrap().parse().unwrap();
        assert!(
            (1..=3).contains(&retry),
            "{kind} {p:?}: Retry-After {retry}"
        );
        assert_eq!(r_t(&seen), (0, retry), "{kind} {p:?}");
    }
    let inspector = common::admin::window(&proxies[0], "cal", "autumn").await;
    let about = inspector["limits"][0]["about"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        about.starts_with("day in Europe/Berlin from 2026-10-24T00:00:00 to 2026-10-25T00:00:00"),
        "{kind}: {inspector}"
    );

    let past = midnight.saturating_duration_since(Instant::now()) + Duration::from_millis(500);
    tokio::time::sleep(past).await;
    for (i, p) in PROTOCOLS.iter().enumerate() {
        let seen = get(&proxies[i % n], &ca, *p, "/cal", "autumn", &[]).await;
        assert_eq!(seen.status, 200, "{kind} {p:?}: a new day: {seen:?}");
        let (r, t) = r_t(&seen);
        assert_eq!(r, 2 - i as u64, "{kind} {p:?}");
        assert!(
            t > 25 * 3600 - 10 && t <= 25 * 3600,
            "{kind} {p:?}: t = {t}, a 25-hour day"
        );
    }
    assert_eq!(up.hits(), 6, "{kind}: denials never reached the upstream");
}

/// The store's clock decides, not the proxy's: a proxy 10 s ahead of its Redis is already in
/// the next Berlin day when Redis is 8 s before midnight, yet its quota counts in Redis's day,
/// with `t` and `Retry-After` to Redis's midnight, and starts again only at that midnight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counts_in_its_own_period_when_the_proxy_clock_is_ahead() {
    let lead = Duration::from_secs(8);
    let redis_env = fake_clock::env(AUTUMN_MIDNIGHT_MS - lead.as_millis() as i64);
    let proxy_env = fake_clock::env(AUTUMN_MIDNIGHT_MS - lead.as_millis() as i64 + 10_000);
    let midnight = Instant::now() + lead;
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let backend = Backend::Redis(RedisServer::start_env(&[], &redis_env));
    let proxy = proxies(&up, &ca, &backend, &proxy_env, 1).remove(0);
    let left = midnight.saturating_duration_since(Instant::now());
    assert!(
        left > Duration::from_secs(4),
        "started too late ({left:?} to midnight)"
    );
    tokio::time::sleep(left - Duration::from_secs(3)).await;
    for r in [2, 1, 0] {
        let seen = get(&proxy, &ca, Protocol::H1, "/cal", "skew", &[]).await;
        let (got, t) = r_t(&seen);
        assert_eq!((seen.status, got), (200, r), "{seen:?}");
        assert!(
            (1..=3).contains(&t),
            "t = {t}: Redis's midnight, not the proxy's day"
        );
    }
    let denied = get(&proxy, &ca, Protocol::H2c, "/cal", "skew", &[]).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    let retry: u64 = denied.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "Retry-After {retry}");
    let past = midnight.saturating_duration_since(Instant::now()) + Duration::from_millis(500);
    tokio::time::sleep(past).await;
    let seen = get(&proxy, &ca, Protocol::H2Tls, "/cal", "skew", &[]).await;
    assert_eq!(seen.status, 200, "Redis's new day: {seen:?}");
    let (r, t) = r_t(&seen);
    assert!(
        r == 2 && t > 25 * 3600 - 10 && t <= 25 * 3600,
        "r = {r}, t = {t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_23_hour_day_stacked_and_by_cost() {
    spring_day("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_23_hour_day_stacked_and_by_cost() {
    spring_day("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_23_hour_day_stacked_and_by_cost() {
    spring_day("cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_resets_at_midnight_before_a_25_hour_day() {
    autumn_midnight("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_resets_at_midnight_before_a_25_hour_day_across_two_proxies() {
    autumn_midnight("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_resets_at_midnight_before_a_25_hour_day_across_two_proxies() {
    let _permit = common::heavy::heavy();
    autumn_midnight("cluster").await;
}

/// A bad `per`, an unknown `time_zone`, a quota of 0 and a window beside `per` are refused,
/// naming the file's line and key.
#[test]
fn config_errors_name_line_and_key() {
    let route = |limit: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
             [upstreams.app]\nservers = [\"127.0.0.1:3\"]\n[[routes]]\nname = \"r\"\n\
             upstream = \"app\"\nlimits = [\n  {limit},\n]\n"
        )
    };
    let key = |k: &str| format!("routes[0].limits[0].{k}");
    assert_invalid(
        &route("{ quota = 5, per = \"year\" }"),
        &key("per"),
        10,
        "no period",
    );
    assert_invalid(
        &route("{ quota = 5, per = \"day\", time_zone = \"Europe/Atlantis\" }"),
        &key("time_zone"),
        10,
        "no IANA time zone",
    );
    assert_invalid(
        &route("{ quota = 0, per = \"day\" }"),
        &key("quota"),
        10,
        "",
    );
    assert_invalid(
        &route("{ quota = 5, per = \"day\", window = \"1d\" }"),
        &key("window"),
        10,
        "has no `window`",
    );
}
