//! SIGTERM with `server.shutdown_delay` (issue 55 item 2): `/readyz` turns 503 at once and
//! stays so until the process exits, `/healthz` stays 200, and for the delay the proxy serves
//! as before, new connections and kept ones, over HTTP/1.1, h2c and HTTP/2 over TLS; then it
//! drains and exits 0 within delay + grace period.

use std::time::{Duration, Instant};

use crate::common;
use common::config::ConfigBuilder;
use common::kept::Kept;
use common::proxy::Proxy;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

/// The status of `GET path` on a new connection of `protocol`.
async fn on_new_connection(proxy: &Proxy, ca: &TestCa, protocol: Protocol, path: &str) -> u16 {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let reply = conn.send("GET", path, &[], bytes::Bytes::new()).await;
    reply.unwrap_or_else(|e| panic!("{protocol:?}: {e}")).status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readyz_503_at_once_and_serves_every_protocol_through_the_delay() {
    let up = Upstream::start();
    let ca = TestCa::new("ca");
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("api", r#"limits = [{ requests = 100000, window = "1m" }]"#)
        .build();
    let delay = Duration::from_secs(3);
    let mut opts = tls_options(&ca, "h2c = true\nshutdown_delay = \"3s\"");
    opts.grace_period = "2s";
    let mut proxy = Proxy::start_with(&config, opts);
    assert_eq!(proxy.admin_get("/readyz").0, 200);
    let (status, body) = proxy.admin_get("/readyz?verbose");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        "ready\nphase: serving\nstore: up (memory)\n\
         route api: while the store is down, on_error = \"allow\", proxied without limits\n"
    );
    let mut kept = Vec::new();
    for p in PROTOCOLS {
        let mut conn = Kept::open(&proxy, p, &ca.ca_pem()).await;
        let reply = conn
            .send("GET", "/api/kept", &[], bytes::Bytes::new())
            .await;
        assert_eq!(reply.unwrap().status, 200, "{p:?}");
        kept.push((p, conn));
    }
    proxy.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));

    proxy.signal(libc::SIGTERM).expect("SIGTERM");
    let sent = Instant::now();
    let not_ready = common::control::poll_until(Duration::from_secs(2), || {
        proxy.admin_get("/readyz").0 == 503
    });
    let not_ready = not_ready.unwrap_or_else(|| panic!("/readyz not 503; log:\n{}", proxy.log()));
    let (_, body) = proxy.admin_get("/readyz");
    assert!(body.starts_with("not ready: draining"), "{body}");
    let (status, body) = proxy.admin_get("/readyz?verbose");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("\nphase: draining (SIGTERM received)\nstore: up (memory)\n"),
        "{body}"
    );
    // The store's own state is not the process's readiness.
    assert_eq!(proxy.admin_get("/readyz?store").0, 200);

    // Until shortly before the delay ends: every protocol, new and kept connections, answered.
    let (mut rounds, mut answered) = (0, 0);
    while sent.elapsed() < delay - Duration::from_millis(500) {
        for (p, conn) in &mut kept {
            let reply = conn
                .send("GET", "/api/kept", &[], bytes::Bytes::new())
                .await;
            let status = reply.unwrap_or_else(|e| panic!("{p:?} kept, {:?}: {e}", sent.elapsed()));
            assert_eq!(status.status, 200, "{p:?} kept");
            answered += 1;
        }
        for p in PROTOCOLS {
            assert_eq!(
                on_new_connection(&proxy, &ca, p, "/api/new").await,
                200,
                "{p:?}"
            );
            answered += 1;
        }
        assert_eq!(proxy.admin_get("/readyz").0, 503);
        assert_eq!(proxy.admin_get("/healthz").0, 200);
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rounds >= 5, "{rounds} rounds in the delay");

    // Then the drain: /readyz stays 503 while the process runs; it exits 0 after the delay.
    let mut probes = 0;
    let status = loop {
        if let Some(status) = proxy.wait_exit(Duration::from_millis(50)) {
            break status;
        }
        // No answer only as the process exits.
        match common::http::http_get_blocking(proxy.admin_addr(), "/readyz") {
            Ok((code, _)) => {
                assert_eq!(code, 503, "/readyz {:?} after SIGTERM", sent.elapsed());
                probes += 1;
            }
            Err(e) => assert!(
                proxy.wait_exit(Duration::from_secs(1)).is_some(),
                "/readyz unanswered ({e}) while the process runs; log:\n{}",
                proxy.log()
            ),
        }
        assert!(sent.elapsed() < Duration::from_secs(15), "{}", proxy.log());
    };
    let took = sent.elapsed();
    println!(
        "SIGTERM: /readyz 503 after {not_ready:?}; {answered} requests answered 200 in {rounds} \
         rounds of the {delay:?} delay; {probes} more probes 503; exit {status} after {took:?}"
    );
    assert!(status.success(), "{status}; log:\n{}", proxy.log());
    assert!(not_ready < Duration::from_millis(500), "{not_ready:?}");
    assert!(
        took >= delay,
        "exited {took:?} after SIGTERM, before the delay"
    );
    assert!(took < delay + Duration::from_secs(4), "{took:?}");
    let log = proxy.log();
    assert!(
        log.contains("SIGTERM received: /readyz answers 503 (draining)"),
        "{log}"
    );
    assert!(
        log.contains("graceful shutdown: no client connection left"),
        "{log}"
    );
}

/// A long `shutdown_delay` never traps an operator: SIGINT during it stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_during_the_delay_stops_at_once() {
    let up = Upstream::start();
    let config = ConfigBuilder::unlimited(up.addr());
    let opts = common::proxy::ProxyOptions {
        server_extra: "shutdown_delay = \"60s\"".into(),
        ..Default::default()
    };
    let mut proxy = Proxy::start_with(&config, opts);
    proxy.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    proxy.signal(libc::SIGTERM).expect("SIGTERM");
    let draining = common::control::poll_until(Duration::from_secs(2), || {
        proxy.admin_get("/readyz").0 == 503
    });
    assert!(draining.is_some(), "{}", proxy.log());
    // Still serving in the delay.
    assert_eq!(common::http::get(proxy.addr(), "/").await.status, 200);
    let sent = Instant::now();
    proxy.signal(libc::SIGINT).expect("SIGINT");
    let status = proxy.wait_exit(Duration::from_secs(5));
    println!(
        "SIGINT in a 60 s shutdown_delay: exit {status:?} {:?} after it",
        sent.elapsed()
    );
    assert!(
        status.is_some(),
        "still running 5 s after SIGINT; log:\n{}",
        proxy.log()
    );
}
