//! Issue 52 row 7, the descriptor reserve: the proxy never spends its last file descriptors on
//! HTTP/2 streams that hold upstream connections, so the admin listener and new clients stay
//! served. The audit pinned every descriptor with 12 connections × 100 streams trickling their
//! bodies (each stream holding an upstream connection): `/healthz` silent, 0 of 28 legitimate
//! requests answered.
//!
//! Through the real binary started with `RLIMIT_NOFILE` 256 (soft and hard, `prlimit
//! --nofile=256`): 6 h2c and 6 HTTP/2-over-TLS connections each open 100 streams whose bodies
//! stop after one byte, to an upstream that reads the whole body (`client_body_timeout` and the
//! upstream's `read_timeout` 30 s, so they are held). Then `/healthz` and a new client over
//! HTTP/1.1, h2c and HTTP/2 over TLS must be answered.

use crate::common;

use std::time::{Duration, Instant};

use common::http::http_get_blocking;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::{Upstream, READ_BODY_HEADER};

const CONNECTIONS: usize = 12;
const STREAMS: usize = 100;

/// What became of one hostile connection's streams.
#[derive(Debug, Default)]
struct Held {
    /// Streams opened (their head and one byte sent).
    opened: usize,
    /// Streams the proxy refused (`RST_STREAM(REFUSED_STREAM)`).
    refused: usize,
    /// The connection or its handshake failed.
    failed: Option<String>,
}

/// Open `STREAMS` trickled streams on one connection and keep them (and the connection) until
/// `done` says so (at most 40 s); what the proxy did with them.
async fn trickle(
    protocol: Protocol,
    proxy: &Proxy,
    ca_pem: &str,
    mut done: tokio::sync::watch::Receiver<bool>,
) -> Held {
    let mut held = Held::default();
    let io = common::kept::stream(proxy, protocol, ca_pem).await;
    let (client, conn) = match h2::client::handshake(io).await {
        Ok(h) => h,
        Err(e) => {
            held.failed = Some(format!("handshake: {e}"));
            return held;
        }
    };
    let driver = tokio::spawn(conn);
    let mut bodies = Vec::new();
    let mut answers = Vec::new();
    let mut client = client;
    for _ in 0..STREAMS {
        client = match tokio::time::timeout(Duration::from_secs(5), client.ready()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                held.failed = Some(format!("ready: {e}"));
                break;
            }
            Err(_) => {
                held.failed = Some("ready: timed out".into());
                break;
            }
        };
        let request = http::Request::post("http://localhost/upload")
            .header(READ_BODY_HEADER, "1")
            .body(())
            .unwrap();
        let Ok((response, mut body)) = client.send_request(request, false) else {
            held.failed = Some("send_request failed".into());
            break;
        };
        let _ = body.send_data(bytes::Bytes::from_static(b"x"), false);
        bodies.push(body);
        answers.push(tokio::spawn(response));
        held.opened += 1;
    }
    let _ = tokio::time::timeout(Duration::from_secs(40), done.wait_for(|d| *d)).await;
    for a in answers {
        if a.is_finished() {
            if let Ok(Err(e)) = a.await {
                held.refused += usize::from(e.reason() == Some(h2::Reason::REFUSED_STREAM));
            }
        }
    }
    drop(bodies);
    driver.abort();
    held
}

/// A new client's `GET /` over `protocol`: its status, or why none came within 5 s.
async fn newcomer(proxy: &Proxy, ca: &TestCa, protocol: Protocol) -> Result<u16, String> {
    let client = protocol.client(&ca.ca_pem());
    let url = common::fetch::url(proxy, protocol, "/new");
    let sent = tokio::time::timeout(Duration::from_secs(5), client.get(&url).send()).await;
    match sent {
        Ok(Ok(r)) => Ok(r.status().as_u16()),
        Ok(Err(e)) => Err(format!("{e}")),
        Err(_) => Err("no answer in 5 s".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trickled_h2_streams_never_take_the_last_descriptors() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = ConfigBuilder::new()
        .upstream_with("app", up.addr(), "read_timeout = \"30s\"")
        .route("all", "")
        .build();
    let mut options = tls_options(&ca, "h2c = true\nclient_body_timeout = \"30s\"");
    options.nofile = Some(256);
    let proxy = Proxy::start_with(&config, options);
    let log = proxy.log();
    assert!(
        log.contains("descriptor limit 256 (was 256, hard 256)"),
        "{log}"
    );

    // The hostile connections, all at once, held while the checks run.
    let (done, hold) = tokio::sync::watch::channel(false);
    let proxy_ref = &proxy;
    let pem = ca.ca_pem();
    let attack = futures::future::join_all((0..CONNECTIONS).map(|i| {
        let protocol = if i % 2 == 0 {
            Protocol::H2c
        } else {
            Protocol::H2Tls
        };
        let (pem, hold) = (pem.clone(), hold.clone());
        async move { trickle(protocol, proxy_ref, &pem, hold).await }
    }));
    let checks = async {
        // Wait until the proxy has taken all the streams it will (the upstream's count stops).
        let started = Instant::now();
        let (mut last, mut still_since) = (u64::MAX, Instant::now());
        while started.elapsed() < Duration::from_secs(8) {
            let now = up.in_flight();
            if now != last {
                (last, still_since) = (now, Instant::now());
            } else if now > 0 && still_since.elapsed() > Duration::from_millis(800) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let at_upstream = up.in_flight();
        let admin = proxy_ref.admin_addr();
        let healthz = tokio::task::spawn_blocking(move || http_get_blocking(admin, "/healthz"))
            .await
            .unwrap()
            .map(|(status, _)| status)
            .map_err(|e| e.to_string());
        let mut newcomers = Vec::new();
        for protocol in [Protocol::H1, Protocol::H2c, Protocol::H2Tls] {
            newcomers.push((protocol, newcomer(proxy_ref, &ca, protocol).await));
        }
        done.send_replace(true);
        (at_upstream, healthz, newcomers)
    };
    let (held, (at_upstream, healthz, newcomers)) = tokio::join!(attack, checks);
    let opened: usize = held.iter().map(|h| h.opened).sum();
    let refused: usize = held.iter().map(|h| h.refused).sum();
    let failed: Vec<_> = held.iter().filter_map(|h| h.failed.clone()).collect();
    let at = format!(
        "{opened} streams opened on {CONNECTIONS} connections, {at_upstream} held at the \
         upstream, {refused} refused; /healthz {healthz:?}; new clients {newcomers:?}; \
         connection failures {failed:?}"
    );
    println!("{at}");
    assert_eq!(healthz, Ok(200), "{at}");
    for (protocol, status) in &newcomers {
        assert_eq!(status, &Ok(200), "{protocol:?}: {at}");
    }
    // Held to the budget (256 less 64 kept, less 2 a connection, less the room of 64 left to
    // new clients: 116 streams, what a run alone holds), the rest refused, not left to fail.
    // Asserted: at least half the room still free (136), the promise that matters (the new
    // clients above were answered); one CI run of the whole suite held 126 (before the budget
    // took a stream's descriptor first and looked after, so two threads could not both see room).
    assert!(at_upstream > 50 && at_upstream <= 136, "{at}");
    assert!(refused >= opened - 136, "{at}");
}
