//! `/readyz` as a load balancer's readiness probe, through the real binary and a real Redis that
//! is killed and restarted:
//!
//! - with a route on `on_error = "local"` (and one on `"deny"` beside it, as in the example
//!   config), `/readyz` stays 200 through the whole outage, while `/readyz?store`, the body and
//!   `slidegate_store_ready` say the store is down, and the local route keeps limiting;
//! - when every route fails closed (`on_error = "deny"`), `/readyz` is 503 while the store is
//!   down (each request would be refused anyway) and 200 again once it answers;
//! - between SIGTERM and exit the probe fails: 503 *draining*, the admin listener answering
//!   until the process exits.

use crate::common;

use std::time::{Duration, Instant};

use common::admin::wait_readyz;
use common::proxy::{get, request, ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::upstream::{Upstream, DELAY_HEADER};

const READY_WITHIN: Duration = Duration::from_secs(20);

fn store(redis: &RedisServer) -> String {
    format!("{}\ntimeout = \"100ms\"", redis.store_toml())
}

/// A limited route on `path` with `on_error`.
fn route(path: &str, requests: u32, on_error: &str) -> String {
    format!(
        "path_prefix = \"{path}\"\non_error = \"{on_error}\"\n\
         limits = [{{ requests = {requests}, window = \"1m\" }}]"
    )
}

/// `(status, body)` of `/readyz`.
fn readyz(proxy: &Proxy) -> (u16, String) {
    proxy.admin_get("/readyz")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_what_the_routes_answer_through_a_redis_kill() {
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    // As the example config: a login route failing closed beside an API failing over to this
    // process's own limits.
    let mixed = Proxy::start(
        &ConfigBuilder::new()
            .store(&store(&redis))
            .upstream("app", up.addr())
            .route("login", &route("/login", 100, "deny"))
            .route("api", &route("/api", 3, "local"))
            .build(),
    );
    // Every route failing closed.
    let closed = Proxy::start(
        &ConfigBuilder::new()
            .store(&store(&redis))
            .upstream("app", up.addr())
            .route("login", &route("/login", 100, "deny"))
            .route("admin", &route("/admin", 100, "deny"))
            .build(),
    );
    for p in [&mixed, &closed] {
        wait_readyz(p, 200, READY_WITHIN);
        assert_eq!(readyz(p), (200, "ready\nstore: up\n".to_string()));
        assert_eq!(p.metric("slidegate_store_ready"), Some(1.0));
    }

    redis.kill();
    let killed = Instant::now();
    // Until both proxies have seen the store go (`/readyz?store` 503), and one second more,
    // every probe of the mixed proxy says ready.
    let mut probes = 0;
    let mut store_down_after = None;
    while store_down_after.is_none_or(|t: Duration| killed.elapsed() < t + Duration::from_secs(1)) {
        let (status, body) = readyz(&mixed);
        probes += 1;
        assert_eq!(
            status,
            200,
            "probe {probes}, {:?} after the kill: {body}",
            killed.elapsed()
        );
        let down = [&mixed, &closed]
            .iter()
            .all(|p| p.admin_get("/readyz?store").0 == 503);
        if down && store_down_after.is_none() {
            store_down_after = Some(killed.elapsed());
        }
        assert!(
            killed.elapsed() < READY_WITHIN,
            "the store still answers after the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, body) = readyz(&mixed);
    println!(
        "Redis killed: /readyz?store 503 after {store_down_after:?}; /readyz 200 on {probes} of \
         {probes} probes; its body:\n{body}"
    );
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "ready\nstore: down\nroute login: on_error = \"deny\", 503\n\
         route api: on_error = \"local\", limited by this process alone\n"
    );
    assert_eq!(
        mixed.admin_get("/readyz?store"),
        (503, "store: down\n".to_string())
    );
    assert_eq!(mixed.metric("slidegate_store_ready"), Some(0.0));
    // Traffic flows as the probe says: the local route limits by itself, the login route is
    // refused as configured.
    let mut api = Vec::new();
    for _ in 0..5 {
        api.push(get(mixed.addr(), "/api/x").await.status);
    }
    assert_eq!(api, [200, 200, 200, 429, 429]);
    assert_eq!(get(mixed.addr(), "/login").await.status, 503);
    assert_eq!(mixed.decisions("api", "local_allowed"), 3);

    let (status, body) = readyz(&closed);
    println!("every route on deny: /readyz {status}:\n{body}");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: the store is down and every route has on_error = \"deny\"\n"),
        "{body}"
    );
    assert_eq!(get(closed.addr(), "/login").await.status, 503);

    redis.restart();
    let back = wait_readyz(&closed, 200, READY_WITHIN);
    let t = common::control::poll_until(READY_WITHIN, || readyz(&closed).0 == 200);
    println!("Redis restarted: /readyz?store 200 after {back:?}, all-deny /readyz 200 after {t:?}");
    assert!(
        t.is_some(),
        "all-deny proxy not ready again; log:\n{}",
        closed.log()
    );
    wait_readyz(&mixed, 200, READY_WITHIN);
    assert_eq!(readyz(&mixed), (200, "ready\nstore: up\n".to_string()));
    assert_eq!(get(closed.addr(), "/login").await.status, 200);
}

/// Between SIGTERM and exit (a request in flight holds the drain), the probe fails: `/readyz`
/// answers 503 *draining* at once (no `shutdown_delay` here) and keeps answering so until the
/// process exits, so a load balancer reads a refusal, never a dead listener it might retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_fails_between_sigterm_and_exit() {
    let up = Upstream::start();
    let mut proxy = Proxy::start(&ConfigBuilder::unlimited(up.addr()));
    proxy.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    assert_eq!(readyz(&proxy).0, 200);
    let addr = proxy.addr();
    let slow =
        tokio::spawn(async move { request(addr, "GET", "/slow", &[(DELAY_HEADER, "800")]).await });
    let reached = common::control::poll_until(Duration::from_secs(10), || up.hits() == 1);
    assert!(
        reached.is_some(),
        "the slow request never reached the upstream"
    );
    let sent = Instant::now();
    proxy.signal(libc::SIGTERM).expect("SIGTERM");
    let refused = common::control::poll_until(Duration::from_secs(1), || readyz(&proxy).0 == 503);
    assert!(refused.is_some(), "/readyz still 200 1 s after SIGTERM");
    let (_, body) = readyz(&proxy);
    assert!(body.starts_with("not ready: draining"), "{body}");
    assert!(
        !slow.is_finished(),
        "the drain ended before the probe was refused"
    );
    // While the request is in flight the probe keeps answering 503.
    let mut probes = 0;
    while !slow.is_finished() && sent.elapsed() < Duration::from_secs(5) {
        // The process may exit as soon as the request is answered: no answer is fine then.
        let probe = common::http::http_get_blocking(proxy.admin_addr(), "/readyz");
        if !slow.is_finished() {
            let status = probe
                .expect("/readyz answers while the request is in flight")
                .0;
            assert_eq!(status, 503, "{:?} after SIGTERM", sent.elapsed());
            probes += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(probes >= 5, "{probes} probes during the drain");
    let reply = slow
        .await
        .expect("slow request task")
        .expect("in-flight request answered");
    assert_eq!(reply.status, 200);
    let exit = proxy
        .wait_exit(Duration::from_secs(10))
        .expect("exit after the drain");
    println!(
        "SIGTERM: /readyz 503 {refused:?} after it and in {probes} probes of the drain, \
         in-flight request answered, exit {exit} {:?} after it",
        sent.elapsed()
    );
    assert_eq!(exit.code(), Some(0));
}
