//! `count_status` through the real binary, on the memory and Redis stores: a login route of 5
//! failed logins per 15 minutes (`count_status = [401, 403]`) in front of an app whose answer
//! the test picks per request (`x-upstream-status`). Successful logins give their admission back,
//! failed ones keep it; exact under an h2c burst; a client that leaves before its response
//! keeps its admission; config errors name file, line and key.

use crate::common;

use std::time::{Duration, Instant};

use common::cli::check_config;
use common::fetch::url;
use common::load::{h2load, Burst};
use common::proxy::{ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::{Upstream, DELAY_HEADER, STATUS_HEADER};

fn start(store_lines: &str, up: &Upstream, ca: &TestCa) -> Proxy {
    let config = ConfigBuilder::new()
        .store(store_lines)
        .upstream("app", up.addr())
        .route(
            "login",
            "path_prefix = \"/login\"\nkey = \"header:X-Client\"\n\
             limits = [{ requests = 5, window = \"15m\" }]\ncount_status = [401, 403]",
        )
        .build();
    Proxy::start_with(&config, tls_options(ca, "h2c = true"))
}

fn refunds(proxy: &Proxy) -> u64 {
    proxy
        .metric("slidegate_refunds_total{route=\"login\",result=\"ok\"}")
        .unwrap_or(0.0) as u64
}

/// Wait (bounded) until `n` refunds of the login route went through: they run after the
/// response, so a test that counts admissions waits for them, never sleeps.
fn refunds_reach(proxy: &Proxy, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = refunds(proxy);
        if got >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{got} refunds of {n} after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn get(client: &reqwest::Client, url: &str, who: &str, status: u16) -> u16 {
    client
        .get(url)
        .header("x-client", who)
        .header(STATUS_HEADER, status.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e:?}"))
        .status()
        .as_u16()
}

async fn exercise(proxy: &Proxy, ca: &TestCa) {
    let mut refunded = 0;
    for protocol in Protocol::ALL {
        let client = protocol.client(&ca.ca_pem());
        let (url, who) = (url(proxy, protocol, "/login"), format!("{protocol:?}"));
        // Twenty successful logins in a row pass a limit of 5: each gives its admission back.
        for _ in 0..20 {
            assert_eq!(get(&client, &url, &who, 200).await, 200, "{protocol:?}");
        }
        refunded += 20;
        refunds_reach(proxy, refunded);
        // Failed logins count: 5 reach the app, the 6th is refused, and so is a success now.
        for _ in 0..5 {
            assert_eq!(get(&client, &url, &who, 401).await, 401, "{protocol:?}");
        }
        assert_eq!(get(&client, &url, &who, 401).await, 429, "{protocol:?}");
        assert_eq!(get(&client, &url, &who, 200).await, 429, "{protocol:?}");
    }
    let n = Protocol::ALL.len() as u64;
    assert_eq!(proxy.decisions("login", "allowed"), 25 * n);
    assert_eq!(proxy.decisions("login", "denied"), 2 * n);
    println!("{n} protocols: 20 successes each passed a limit of 5 (all refunded), then exactly 5 failures");
}

#[tokio::test]
async fn successes_give_their_admission_back_on_the_memory_store() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    exercise(&start("backend = \"memory\"", &up, &ca), &ca).await;
}

#[tokio::test]
async fn successes_give_their_admission_back_on_the_redis_store() {
    let (redis, up, ca) = (RedisServer::start(), Upstream::start(), TestCa::new("ca"));
    exercise(&start(&redis.store_toml(), &up, &ca), &ca).await;
}

#[test]
fn failed_logins_are_exact_under_an_h2_burst() {
    let _permit = common::heavy::heavy();
    let redis = RedisServer::start();
    // A store timeout well above a debug build's queueing under this burst: the local log
    // (on_error = "local") never has to decide, so the count is the shared store's alone.
    let redis_store = format!("{}\ntimeout = \"2s\"", redis.store_toml());
    for store in ["backend = \"memory\"".to_string(), redis_store] {
        let (up, ca) = (Upstream::start(), TestCa::new("ca"));
        let proxy = start(&store, &up, &ca);
        let burst = |who: &str, status: u16| Burst {
            path: "/login".into(),
            headers: vec![
                format!("X-Client: {who}"),
                format!("{STATUS_HEADER}: {status}"),
            ],
            ..Burst::keyed(300, "unused")
        };
        let failed = h2load(proxy.addr(), &burst("attacker", 401));
        assert_eq!(
            (failed.s4xx, failed.s2xx, failed.failed),
            (4000, 0, 0),
            "{store}: {failed:?}"
        );
        // Exactly 5 reached the app, whichever store decided (a store too slow under this
        // load is answered by the local log, on_error = "local", and counted local_*).
        assert_eq!(up.hits(), 5, "{store}");
        let denied: u64 = ["denied", "local_denied"]
            .iter()
            .map(|d| {
                proxy
                    .metric(&format!(
                        "slidegate_requests_total{{route=\"login\",decision=\"{d}\"}}"
                    ))
                    .unwrap_or(0.0) as u64
            })
            .sum();
        assert_eq!(denied, 3995, "{store}");
        // Successes under the same burst: at most 5 are in flight at once, each gives its admission
        // back when answered, so more than 5 pass, and the route's count returns to 0.
        let ok = h2load(proxy.addr(), &burst("user", 200));
        assert_eq!(ok.s2xx + ok.s4xx, 4000, "{store}: {ok:?}");
        assert!(ok.s2xx > 5, "{store}: {ok:?}");
        refunds_reach(&proxy, ok.s2xx);
        println!(
            "{store}: 4000 failed logins at 300 x 10 streams: 5 reached the app; 4000 successes: \
             {} passed, {} refused while 5 were in flight",
            ok.s2xx, ok.s4xx
        );
    }
}

#[tokio::test]
async fn a_client_that_leaves_before_its_answer_keeps_its_admission() {
    let (redis, up, ca) = (RedisServer::start(), Upstream::start(), TestCa::new("ca"));
    let proxy = start(&redis.store_toml(), &up, &ca);
    let client = Protocol::H1.client(&ca.ca_pem());
    let url = url(&proxy, Protocol::H1, "/login");
    // Five successes whose client gives up before the app answers (after 1 s).
    for _ in 0..5 {
        let sent = client
            .get(&url)
            .header("x-client", "quitter")
            .header(DELAY_HEADER, "1000")
            .timeout(Duration::from_millis(200))
            .send()
            .await;
        assert!(sent.is_err(), "answered before the client left: {sent:?}");
    }
    // The app answers 200 after 1 s, but no response goes out whole: once the proxy has
    // finished all five requests (its duration histogram counts them), the admissions stay counted.
    let done = "slidegate_request_duration_seconds_count{route=\"login\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.metric(done).unwrap_or(0.0) < 5.0 {
        assert!(
            Instant::now() < deadline,
            "requests not finished: {:?}",
            proxy.metric(done)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(&client, &url, "quitter", 200).await, 429);

    assert_eq!(refunds(&proxy), 0);
}

#[test]
fn bad_count_status_names_file_line_and_key() {
    let base = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\n\
                upstream = \"app\"\nlimits = [{ requests = 5, window = \"15m\" }]\n";
    for (value, message) in [
        ("[]", "empty list"),
        ("[401, 99]", "from 100 to 599"),
        ("[401, 401]", "listed twice"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("{base}count_status = {value}\n")).unwrap();
        let checked = check_config(&path, &[]);
        let out = checked.output();
        assert!(!checked.ok, "{value}: {out}");
        assert!(
            out.contains("bad.toml:10")
                && out.contains("routes[0].count_status")
                && out.contains(message),
            "{value}: {out}"
        );
    }
}
