//! Customer plans (issue 56 item 1), through the real binary: `[plans.free]` 3 and
//! `[plans.pro]` 6 requests a minute, a route keyed by `X-Client` taking its limits from the
//! client's plan.
//! - From a file (memory store): a plain key and a `sha256:` one on pro, an unknown key on the
//!   default plan, one client per protocol (HTTP/1.1, HTTP/2 over TLS, h2c); the RateLimit
//!   fields, the inspector and `slidegate_plan_requests_total` name the plan. Changed in the
//!   file and reloaded (SIGHUP, then `--watch`): an upgrade gets the difference at once, a
//!   downgrade is refused until its window allows (usage carries over both ways).
//! - From Redis, two proxies: `HSET <prefix>:plans <key> <plan>` applies on both within 5 s
//!   without a reload, usage carries over both ways; a plan the config lacks gives the default,
//!   counted and logged; a flood of 2,000 made-up keys is read once each, all on the default.
//! - A bad `plan` names its file, line and key; so does a bad plan file (`slidegate -t`).
//! - The inspector page (headless chromium) lists each plan's limits and a client's plan.
//! - A plan's windows survive a restart with `[store] state_file`.
//! - Under an h2load burst (300 x 10 streams on each of two proxies) a client gets exactly its plan.

use crate::common;

use std::time::{Duration, Instant};

use common::admin::{wait_reloads, window};
use common::cli::check_config;
use common::config::{assert_invalid, ConfigBuilder};
use common::fetch::{fetch, url, Seen};
use common::proxy::Proxy;
use common::redis::RedisServer;
use common::tls::{ready_on_every_protocol, tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// sha256("bob"): the file names bob without holding his key.
const BOB_SHA256: &str = "81b637d8fcd2c6da6359e6963113a1170de795e4b725b84d1e0b4cfd9ec58ce9";

/// The config: plans free (3/min) and pro (6/min), route `api` keyed by `X-Client`, its plan
/// `from` as given (a `refresh` line may follow).
fn config(up: &Upstream, store: &str, from: &str) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .raw(
            "[plans.free]\nlimits = [{ requests = 3, window = \"1m\" }]\n\n\
             [plans.pro]\nlimits = [{ requests = 6, window = \"1m\" }]\n",
        )
        .route(
            "api",
            &format!("key = \"header:X-Client\"\nplan = {{ from = {from}, default = \"free\" }}"),
        )
        .build()
}

/// `n` requests of `who` over `protocol`, one after another.
async fn send(proxy: &Proxy, ca: &TestCa, protocol: Protocol, who: &str, n: usize) -> Vec<Seen> {
    let client = protocol.client(&ca.ca_pem());
    let target = url(proxy, protocol, "/");
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        seen.push(fetch(&client, &target, who, protocol.version()).await);
    }
    seen
}

fn admitted(seen: &[Seen]) -> usize {
    seen.iter().filter(|s| s.status == 200).count()
}

/// Send `who`'s requests over `protocol` until one is answered with `status` (at most 5 s: the
/// issue's bound for a plan change to apply); the answers seen.
async fn until_status(
    proxy: &Proxy,
    ca: &TestCa,
    protocol: Protocol,
    who: &str,
    status: u16,
) -> Vec<Seen> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    loop {
        let mut one = send(proxy, ca, protocol, who, 1).await;
        let done = one[0].status == status;
        seen.append(&mut one);
        if done {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{who}: no {status} within 5 s of the plan change: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_from_a_file_on_every_protocol_and_changed_by_a_reload() {
    let up = Upstream::start();
    let ca = TestCa::new("plans");
    let dir = tempfile::tempdir().unwrap();
    let plans = dir.path().join("plans.toml");
    let write = |text: &str| std::fs::write(&plans, text).unwrap();
    write(&format!(
        "\"alice\" = \"pro\"\n\"sha256:{BOB_SHA256}\" = \"pro\"\n\"dave\" = \"free\"\n"
    ));
    let from = format!("\"file:{}\"", plans.display());
    let proxy = &ready_on_every_protocol(&config(&up, "backend = \"memory\"", &from), &ca, 1)[0];

    // One client per protocol: alice (plain key) and bob (hashed) on pro, carol (unknown) on
    // the default plan.
    let clients = [
        ("alice", Protocol::H1, 6, "api-pro-60s"),
        ("bob", Protocol::H2Tls, 6, "api-pro-60s"),
        ("carol", Protocol::H2c, 3, "api-free-60s"),
    ];
    for (who, protocol, want, policy) in clients {
        let seen = send(proxy, &ca, protocol, who, 8).await;
        assert_eq!(admitted(&seen), want, "{who} over {protocol:?}: {seen:?}");
        for s in &seen {
            let field = s.policy.as_deref().unwrap_or_default();
            assert!(
                field.starts_with(&format!("\"{policy}\"")),
                "{who}: {field}"
            );
            assert!(s.ratelimit.as_deref().unwrap_or_default().contains(policy));
        }
        let v = window(proxy, "api", who).await;
        assert_eq!(v["limits"][0]["name"], policy, "{v}");
        assert_eq!(v["limits"][0]["count"], want, "{v}");
        let plan = policy.trim_start_matches("api-").trim_end_matches("-60s");
        assert_eq!(v["plan"], plan, "{v}");
    }
    // The top limited clients name each client's own plan's limit (one summary for the
    // route, every plan's policy names in it).
    let mut top = serde_json::Value::Null;
    let named = |v: &serde_json::Value, who: &str| {
        let clients = v["clients"].as_array().cloned().unwrap_or_default();
        let c = clients.into_iter().find(|c| c["key"] == who)?;
        Some((c["denied"].as_u64()?, c["limits"].clone()))
    };
    common::control::poll_until(Duration::from_secs(10), || {
        top = serde_json::from_str(&proxy.admin_get("/api/v1/top?route=api&minutes=5").1)
            .unwrap_or_default();
        named(&top, "carol").is_some() && named(&top, "alice").is_some()
    });
    let pro = serde_json::json!(["api-pro-60s"]);
    let free = serde_json::json!(["api-free-60s"]);
    assert_eq!(named(&top, "alice"), Some((2, pro.clone())), "{top}");
    assert_eq!(named(&top, "bob"), Some((2, pro)), "{top}");
    assert_eq!(named(&top, "carol"), Some((5, free)), "{top}");
    let count = |plan: &str| {
        proxy.counter(&format!(
            "slidegate_plan_requests_total{{plan=\"{plan}\",route=\"api\"}}"
        ))
    };
    assert_eq!((count("pro"), count("free")), (16, 8));

    // dave, on free, uses his 3; upgraded in the file and reloaded: exactly 3 more.
    assert_eq!(
        admitted(&send(proxy, &ca, Protocol::H2c, "dave", 4).await),
        3
    );
    write(&format!(
        "\"alice\" = \"free\"\n\"sha256:{BOB_SHA256}\" = \"pro\"\n\"dave\" = \"pro\"\n"
    ));
    proxy.signal(libc::SIGHUP).expect("SIGHUP");
    wait_reloads(proxy, "ok", 1, Duration::from_secs(10));
    let seen = send(proxy, &ca, Protocol::H2Tls, "dave", 5).await;
    assert_eq!(
        admitted(&seen),
        3,
        "the upgrade gives the difference: {seen:?}"
    );
    // alice, downgraded with 6 used in the window, is refused under free's 3.
    let seen = send(proxy, &ca, Protocol::H1, "alice", 2).await;
    assert_eq!(admitted(&seen), 0, "{seen:?}");
    assert!(seen[0]
        .policy
        .as_deref()
        .unwrap_or_default()
        .contains("api-free-60s"));

    // A plan file naming a plan the config lacks is refused: the running plans stay.
    write("\"dave\" = \"gold\"\n");
    proxy.signal(libc::SIGHUP).expect("SIGHUP");
    wait_reloads(proxy, "error", 1, Duration::from_secs(10));
    let v = window(proxy, "api", "dave").await;
    assert_eq!(v["plan"], "pro", "{v}");
    let checked = check_config(proxy.config_path(), &[]);
    assert!(!checked.ok, "{}", checked.output());
    let want = format!("{}:1: dave: no [plans.gold] is defined", plans.display());
    assert!(checked.stderr.contains(&want), "{}", checked.output());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_plan_file_applies_without_a_signal() {
    let up = Upstream::start();
    let ca = TestCa::new("plans-watch");
    let dir = tempfile::tempdir().unwrap();
    let plans = dir.path().join("plans.toml");
    std::fs::write(&plans, "\"erin\" = \"free\"\n").unwrap();
    let from = format!("\"file:{}\"", plans.display());
    let mut opts = tls_options(&ca, "h2c = true");
    opts.args.push("--watch".into());
    let proxy = Proxy::start_with(&config(&up, "backend = \"memory\"", &from), opts);
    common::admin::wait_readyz(&proxy, 200, Duration::from_secs(20));
    assert_eq!(
        admitted(&send(&proxy, &ca, Protocol::H1, "erin", 4).await),
        3
    );
    std::fs::write(&plans, "\"erin\" = \"pro\"\n").unwrap();
    // The watcher applies a file once it has stayed the same for a poll (about 2 s).
    let seen = until_status(&proxy, &ca, Protocol::H2c, "erin", 200).await;
    let more = send(&proxy, &ca, Protocol::H2Tls, "erin", 4).await;
    assert_eq!(admitted(&seen) + admitted(&more), 3, "{seen:?} {more:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_from_redis_apply_on_every_proxy_within_five_seconds() {
    let up = Upstream::start();
    let ca = TestCa::new("plans-redis");
    let redis = RedisServer::start();
    let store = redis.store_toml();
    let text = config(&up, &store, "\"redis\", refresh = \"1s\"");
    let proxies = ready_on_every_protocol(&text, &ca, 2);
    let (a, b) = (&proxies[0], &proxies[1]);
    let mut conn = redis.connection();
    let hset = |conn: &mut ::redis::Connection, key: &str, plan: &str| {
        let _: i64 = ::redis::cmd("HSET")
            .arg("slidegate:plans")
            .arg(key)
            .arg(plan)
            .query(conn)
            .expect("HSET");
    };

    // Unknown to the hash: the default plan, on both proxies together.
    let first = send(a, &ca, Protocol::H1, "gus", 2).await;
    let second = send(b, &ca, Protocol::H2c, "gus", 2).await;
    assert_eq!(
        admitted(&first) + admitted(&second),
        3,
        "{first:?} {second:?}"
    );

    // Upgraded by the billing system: within 5 s on each proxy, and exactly the difference.
    hset(&mut conn, "gus", "pro");
    let on_a = until_status(a, &ca, Protocol::H2Tls, "gus", 200).await;
    let on_b = until_status(b, &ca, Protocol::H1, "gus", 200).await;
    let rest = send(a, &ca, Protocol::H2c, "gus", 3).await;
    let total = admitted(&on_a) + admitted(&on_b) + admitted(&rest);
    assert_eq!(total, 3, "{on_a:?} {on_b:?} {rest:?}");
    assert!(rest
        .last()
        .unwrap()
        .policy
        .as_deref()
        .unwrap_or_default()
        .contains("api-pro-60s"));

    // hank on pro uses 4 of 6; downgraded to free (3), he is refused on both within 5 s and
    // never gets past pro's 6 meanwhile.
    hset(&mut conn, "hank", "pro");
    let used = send(b, &ca, Protocol::H2Tls, "hank", 4).await;
    assert_eq!(admitted(&used), 4, "{used:?}");
    hset(&mut conn, "hank", "free");
    let mut seen = Vec::new();
    for proxy in [a, b] {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let one = send(proxy, &ca, Protocol::H1, "hank", 1).await.remove(0);
            let free = one
                .policy
                .as_deref()
                .unwrap_or_default()
                .contains("api-free-60s");
            let done = free && one.status == 429;
            seen.push(one);
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "hank still on pro after 5 s: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(admitted(&used) + admitted(&seen) <= 6, "{seen:?}");
    let v = window(a, "api", "hank").await;
    assert_eq!(
        (v["plan"].as_str(), v["limits"][0]["requests"].as_u64()),
        (Some("free"), Some(3))
    );

    // A plan name the config lacks: the default plan, counted and logged.
    hset(&mut conn, "ivy", "gold");
    let seen = send(a, &ca, Protocol::H2c, "ivy", 4).await;
    assert_eq!(admitted(&seen), 3, "{seen:?}");
    let fallbacks =
        a.counter("slidegate_plan_fallbacks_total{reason=\"unknown_plan\",route=\"api\"}");
    assert!(fallbacks >= 1, "{}", a.metrics_text());
    assert!(
        a.log().contains("unknown plan (latest \"gold\")"),
        "{}",
        a.log()
    );

    // A flood of made-up keys: each read once and given the default plan (every answer 200
    // under free's 3), no read failed, the hash untouched, and the pro client still on pro.
    let hgets = |conn: &mut ::redis::Connection| -> u64 {
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .unwrap();
        let line = info.lines().find(|l| l.starts_with("cmdstat_hget:"));
        let calls = line.and_then(|l| l.split("calls=").nth(1)?.split(',').next()?.parse().ok());
        calls.unwrap_or(0)
    };
    let before = hgets(&mut conn);
    let seen = common::flood::flood(b.addr(), ("/", "X-Client"), "made-up", 0, 2000, 1);
    assert_eq!(seen.get(&200), Some(&2000), "{seen:?}");
    assert_eq!(hgets(&mut conn) - before, 2000, "one read per made-up key");
    let errors = b.counter("slidegate_plan_fallbacks_total{reason=\"store_error\",route=\"api\"}");
    assert_eq!(errors, 0);
    let entries: u64 = ::redis::cmd("HLEN")
        .arg("slidegate:plans")
        .query(&mut conn)
        .unwrap();
    assert_eq!(entries, 3, "gus, hank and ivy only");
    let v = window(b, "api", "gus").await;
    assert_eq!(v["plan"], "pro", "{v}");
}

#[test]
fn a_bad_plan_names_its_key_and_line() {
    let head = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [upstreams.app]\nservers = [\"127.0.0.1:3\"]\n\
                [plans.free]\nlimits = [{ requests = 3, window = \"1m\" }]\n";
    let route =
        |lines: &str| format!("{head}[[routes]]\nname = \"api\"\nupstream = \"app\"\n{lines}\n");
    // Lines: 1-7 the head, 8 `[[routes]]`, 9 name, 10 upstream, 11 on: the route's lines.
    let cases = [
        (
            "key = \"header:X-Client\"\nplan = { from = \"redis\", default = \"free\" }",
            ("routes[0].plan.from", 12),
            "need backend = \"redis\"",
        ),
        (
            "key = \"header:X-Client\"\nplan = { from = \"file:/p\", default = \"gold\" }",
            ("routes[0].plan.default", 12),
            "no [plans.gold] is defined",
        ),
        (
            "key = \"header:X-Client\"\nplan = { from = \"ldap\", default = \"free\" }",
            ("routes[0].plan.from", 12),
            "\"file:<path>\"",
        ),
        (
            "key = \"header:X-Client\"\n\
             plan = { from = \"file:/p\", default = \"free\", refresh = \"1s\" }",
            ("routes[0].plan.refresh", 12),
            "for plans read from Redis",
        ),
        (
            "key = [\"header:X-Client\", \"client_ip\"]\n\
             plan = { from = \"file:/p\", default = \"free\" }",
            ("routes[0].key", 11),
            "a key naming one customer",
        ),
        (
            "key = \"header:X-Client\"\nplan = { from = \"file:/p\", default = \"free\" }\n\
             limits = [{ requests = 9, window = \"1m\" }]",
            ("routes[0].limits[0].window", 13),
            "duplicate window 1m in the limits of \"api-free\"",
        ),
        (
            "key = \"header:X-Client\"\nplan = { from = \"file:/p\", default = \"free\" }\n\
             [plans.pro]\nlimits = [{ requests = 3 }]",
            ("plans.pro.limits[0].window", 14),
            "need a `window`",
        ),
    ];
    for (lines, (key, line), message) in cases {
        assert_invalid(&route(lines), key, line, message);
    }
}

/// The inspector page in headless chromium: the routes table lists each plan's limits, and a
/// pro client's window shows its plan's policy (`api-pro-60s`, 2 of 6 used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_page_shows_each_plan_and_the_clients() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let plans = dir.path().join("plans.toml");
    std::fs::write(&plans, "\"alice\" = \"pro\"\n").unwrap();
    let from = format!("\"file:{}\"", plans.display());
    let proxy = Proxy::start(&config(&up, "backend = \"memory\"", &from));
    for _ in 0..2 {
        let reply = common::http::send(proxy.addr(), "GET", "/", &[("x-client", "alice")]).await;
        assert_eq!(reply.status, 200);
    }
    let browser = common::browser::Browser::start().await;
    let url = format!("http://{}/?route=api&client=alice", proxy.admin_addr());
    browser.goto(&url).await;
    let cell = browser
        .wait_for(
            "the plans listed",
            "const r = document.querySelector('#routes tbody tr[data-route=\"api\"]');
             return r ? r.querySelectorAll('td')[1].textContent : null;",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(cell, "free: 3 per 1m; pro: 6 per 1m");
    let card = browser
        .wait_for(
            "the client's plan",
            "const c = document.querySelector('[data-limit=\"api-pro-60s\"]');
             return c ? c.querySelector('.remaining').textContent : null;",
            Duration::from_secs(10),
        )
        .await;
    assert!(card.as_str().unwrap_or_default().contains('4'), "{card}");
}

/// `[store] state_file` keeps a plan's windows across a restart: a pro client at 6 of 6, in a
/// window the default plan lacks, is still refused by the next process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_windows_survive_a_restart_with_a_state_file() {
    let up = Upstream::start();
    let ca = TestCa::new("plans-state");
    let dir = tempfile::tempdir().unwrap();
    let plans = dir.path().join("plans.toml");
    std::fs::write(&plans, "\"alice\" = \"pro\"\n").unwrap();
    let state = dir.path().join("windows.state");
    let store = format!(
        "backend = \"memory\"\nstate_file = {:?}",
        state.display().to_string()
    );
    // Pro's window is one the default plan lacks: the file must know every plan's limits.
    let from = format!("\"file:{}\"", plans.display());
    let text = config(&up, &store, &from).replace(
        "[plans.pro]\nlimits = [{ requests = 6, window = \"1m\" }]",
        "[plans.pro]\nlimits = [{ requests = 6, window = \"2m\" }]",
    );
    assert!(text.contains("\"2m\""), "{text}");
    let mut first = Proxy::start_with(&text, tls_options(&ca, "h2c = true"));
    common::admin::wait_readyz(&first, 200, Duration::from_secs(20));
    assert_eq!(
        admitted(&send(&first, &ca, Protocol::H2c, "alice", 7).await),
        6
    );
    first.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    first.signal(libc::SIGTERM).unwrap();
    assert!(
        first.wait_exit(Duration::from_secs(10)).is_some(),
        "{}",
        first.log()
    );
    let next = Proxy::start_with(&text, tls_options(&ca, "h2c = true"));
    common::admin::wait_readyz(&next, 200, Duration::from_secs(20));
    let seen = send(&next, &ca, Protocol::H2Tls, "alice", 1).await;
    assert_eq!(seen[0].status, 429, "{seen:?}\n{}", next.log());
    assert!(seen[0]
        .policy
        .as_deref()
        .unwrap_or_default()
        .contains("api-pro-120s"));
    let v = window(&next, "api", "alice").await;
    assert_eq!(v["limits"][0]["count"], 6, "{v}");
}

/// Under an h2load burst (300 connections x 10 streams, 4,000 requests on each of two proxies
/// sharing Redis, at once), a pro client gets exactly pro's 6 and an unknown one the default's
/// 3: the plan read and the decision hold under concurrency.
#[test]
fn a_burst_on_two_proxies_gets_exactly_the_clients_plan() {
    let _permit = common::heavy::heavy();
    use common::load::{h2load_each, Burst};
    common::require_tool("h2load", "nghttp2-client");
    let up = Upstream::start();
    let ca = TestCa::new("plans-burst");
    let redis = RedisServer::start();
    let text = config(&up, &redis.store_toml(), "\"redis\"");
    let proxies = ready_on_every_protocol(&text, &ca, 2);
    let mut conn = redis.connection();
    let _: i64 = ::redis::cmd("HSET")
        .arg("slidegate:plans")
        .arg("burst-pro")
        .arg("pro")
        .query(&mut conn)
        .unwrap();
    for (key, want) in [("burst-pro", 6), ("burst-unknown", 3)] {
        let mut burst = Burst::keyed(300, key);
        burst.headers = vec![format!("X-Client: {key}")];
        let addrs: Vec<_> = proxies.iter().map(|p| p.addr()).collect();
        let results = h2load_each(&addrs, &burst);
        let admitted: u64 = results.iter().map(|r| r.s2xx).sum();
        let failed: u64 = results.iter().map(|r| r.failed).sum();
        assert_eq!((admitted, failed), (want, 0), "{key}: {results:?}");
        println!(
            "{key}: {admitted} of 8,000 admitted (max {:?})",
            results[0].max_latency
        );
    }
}
