//! `resolve_interval` through the binary (issue 55 item 1): an upstream named `app.test`, whose
//! addresses the test sets through `getaddrinfo` (`common::fake_resolver`, an `LD_PRELOAD` shim
//! reading a file), is followed without a reload: moved from one server to another, then to
//! both, the proxy's requests follow within two intervals; a name that stops resolving keeps
//! its last addresses (nginx's `resolve` does the same).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common;
use common::config::ConfigBuilder;
use common::fake_resolver::{env, point};
use common::http::get;
use common::ports::free_port;
use common::proxy::{Proxy, ProxyOptions};
use common::upstream::Upstream;

/// Send requests (200 each) until `done` holds, at most `within`; how many were sent.
async fn until(proxy: &Proxy, within: Duration, done: impl Fn() -> bool) -> usize {
    let deadline = Instant::now() + within;
    let mut sent = 0;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "not within {within:?} ({sent} sent)"
        );
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_whose_addresses_change_is_followed_without_a_reload() {
    let port = free_port();
    let at = |ip: &str| -> SocketAddr { format!("{ip}:{port}").parse().unwrap() };
    let (a, b) = (
        Upstream::start_on(at("127.0.0.2")),
        Upstream::start_on(at("127.0.0.3")),
    );
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("app.hosts");
    point(&hosts, &["127.0.0.2"]);
    let config = ConfigBuilder::new()
        .upstream_with(
            "app",
            format!("app.test:{port}"),
            "resolve_interval = \"1s\"",
        )
        .route("all", "")
        .build();
    let opts = ProxyOptions {
        env: env("app.test", &hosts),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::start_with(&config, opts);
    for _ in 0..5 {
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
    }
    assert_eq!((a.hits(), b.hits()), (5, 0), "the name's one address");

    // Moved: within two intervals every request goes to the new address.
    point(&hosts, &["127.0.0.3"]);
    let moved = Instant::now();
    until(
        &proxy,
        Duration::from_secs(2) + Duration::from_millis(500),
        || b.hits() > 0,
    )
    .await;
    println!("followed the move after {:?}", moved.elapsed());
    let a_before = a.hits();
    for _ in 0..10 {
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
    }
    assert_eq!(
        a.hits(),
        a_before,
        "the old address gets nothing once it is gone"
    );

    // Both: the balancer takes the added address in.
    point(&hosts, &["127.0.0.2", "127.0.0.3"]);
    let a_before = a.hits();
    until(&proxy, Duration::from_secs(3), || a.hits() > a_before).await;

    // Nothing: the look-up fails (logged), and the last addresses stay.
    point(&hosts, &[]);
    let said = format!("upstream app: app.test:{port} does not resolve");
    common::control::poll_until(Duration::from_secs(5), || proxy.log().contains(&said))
        .unwrap_or_else(|| panic!("no failed look-up logged: {}", proxy.log()));
    assert!(
        proxy.log().contains("keeping its last addresses"),
        "{}",
        proxy.log()
    );
    let total = a.hits() + b.hits();
    for _ in 0..10 {
        assert_eq!(get(proxy.addr(), "/").await.status, 200);
    }
    assert_eq!(a.hits() + b.hits(), total + 10);
}
