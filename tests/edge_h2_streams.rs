//! HTTP/2 streams that hold a connection without finishing (issue 18 row 2, the "per stream"
//! part), through the real binary over h2c:
//! - a header block left open (HEADERS without END_HEADERS, no CONTINUATION): no stream exists
//!   until the block completes, so nothing is in flight and the connection's idle deadline
//!   (`keepalive_timeout`, Pingora's `h2_idle_timeout`) closes it;
//! - a request body that stops: Pingora 0.9 has no HTTP/2 read timeout, so what bounds it is the
//!   upstream's `read_timeout` (504), and the stream's flow-control window bounds its memory.
//!
//! Frames are written by hand where a client library cannot send them (an unfinished header
//! block); the stalled body uses the `h2` client.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::proxy::{ConfigBuilder, Proxy, ProxyOptions};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::{Upstream, DELAY_HEADER};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;

/// One HTTP/2 frame: 9-byte header (RFC 9113 §4.1), then `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The frame types in `bytes` (what the server sent), in order; a trailing partial frame is
/// ignored.
fn frame_types(bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        types.push(rest[3]);
        rest = &rest[(9 + len).min(rest.len())..];
    }
    types
}

fn start(server_extra: &str, config: String) -> Proxy {
    let opts = ProxyOptions {
        server_extra: server_extra.into(),
        ..ProxyOptions::default()
    };
    Proxy::start_with(&config, opts)
}

/// A header block that never completes holds no stream, so the connection is idle: it is
/// closed `keepalive_timeout` after the block started (as nginx closes it at
/// `client_header_timeout`), and the gauge returns to 0.
#[test]
fn an_unfinished_h2_header_block_is_closed_at_the_idle_deadline() {
    let up = Upstream::start();
    let proxy = start(
        "h2c = true\nclient_header_timeout = \"500ms\"\nkeepalive_timeout = \"1s\"",
        ConfigBuilder::unlimited(up.addr()),
    );
    let mut s = TcpStream::connect(proxy.addr()).expect("connect");
    // :method GET, :scheme http, :path / (static table 2, 6, 4), then END_STREAM but no
    // END_HEADERS: the server must wait for a CONTINUATION that never comes.
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    hello.extend(frame(HEADERS, END_STREAM, 1, &[0x82, 0x86, 0x84]));
    s.write_all(&hello).unwrap();
    let sent = Instant::now();

    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed_after = loop {
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "an unfinished header block kept the connection open for 5 s"
        );
        match s.read(&mut buf) {
            Ok(0) => break sent.elapsed(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break sent.elapsed(),
        }
    };
    assert!(
        closed_after >= Duration::from_millis(900),
        "closed before keepalive_timeout: {closed_after:?}"
    );
    assert!(
        closed_after < Duration::from_millis(2500),
        "closed late: {closed_after:?}"
    );
    let types = frame_types(&got);
    assert_eq!(types.first(), Some(&SETTINGS), "server frames: {types:?}");
    assert_eq!(up.hits(), 0, "an unfinished request reached the upstream");
    println!(
        "unfinished h2 header block: closed after {closed_after:?} (keepalive_timeout 1 s); \
         server frames {types:?}; GOAWAY sent: {}",
        types.contains(&GOAWAY)
    );
}

/// A request body that stops after one byte, to an app that waits for it: the upstream's
/// `read_timeout` answers 504 on that stream, and the connection stays usable for the next
/// request (no HTTP/2 body deadline of our own exists; see the module doc).
#[tokio::test]
async fn a_stalled_h2_body_is_bounded_by_the_upstream_read_timeout() {
    let up = Upstream::start();
    let config = ConfigBuilder::new()
        .upstream_with("app", up.addr(), "read_timeout = \"1s\"")
        .route("all", "")
        .build();
    let proxy = start("h2c = true\nclient_body_timeout = \"500ms\"", config);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let driver = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();

    let request = http::Request::post(format!("http://{}/upload", proxy.addr()))
        .header(DELAY_HEADER, "5000")
        .body(())
        .unwrap();
    let started = Instant::now();
    let (response, mut body) = client.send_request(request, false).unwrap();
    body.send_data(bytes::Bytes::from_static(b"x"), false)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("no answer within 10 s to a stalled h2 body")
        .expect("h2 response");
    let took = started.elapsed();
    assert_eq!(response.status(), 504, "after {took:?}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // The connection still serves.
    let mut client = client.ready().await.unwrap();
    let next = http::Request::get(format!("http://{}/next", proxy.addr()))
        .body(())
        .unwrap();
    let (next, _) = client.send_request(next, true).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("next request timed out")
        .unwrap();
    assert_eq!(next.status(), 200);
    drop(client);
    driver.abort();
    println!(
        "stalled h2 body (1 byte, then nothing): {} after {took:?} (upstream read_timeout 1 s); \
         same connection then 200",
        response.status()
    );
}

/// A client that grants a stream no flow-control window (and keeps its connection alive) gets
/// no body byte, and the socket never blocks, so the edge's `send_timeout` (which watches the
/// socket) never fires: each write of an HTTP/2 body is bounded by `send_timeout` itself, so
/// the stream is reset and its upstream connection let go, over h2c and HTTP/2 over TLS (over
/// HTTP/1.1 a client that takes nothing blocks the socket, which the edge bounds). Before, it
/// was held for as long as the client stayed (the audit: 10 connections × 100 such streams
/// held 984 upstream connections and every descriptor).
#[tokio::test]
async fn a_stream_granted_no_window_is_cut_at_send_timeout() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("all", "")
        .build();
    let proxy = Proxy::start_with(
        &config,
        tls_options(&ca, "h2c = true\nsend_timeout = \"1s\""),
    );
    for protocol in [Protocol::H2c, Protocol::H2Tls] {
        let io = common::kept::stream(&proxy, protocol, &ca.ca_pem()).await;
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, bytes::Bytes>(io)
            .await
            .expect("h2 handshake");
        let driver = tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let mut streams = Vec::new();
        for i in 0..5 {
            let request = http::Request::get(format!("http://localhost/held-{i}"))
                .body(())
                .unwrap();
            let (response, _) = client.send_request(request, true).unwrap();
            streams.push(response);
            client = client.ready().await.unwrap();
        }
        let started = Instant::now();
        for response in streams {
            let response = tokio::time::timeout(Duration::from_secs(10), response)
                .await
                .expect("no head within 10 s")
                .expect("h2 response head");
            assert_eq!(response.status(), 200, "{protocol:?}");
            let mut body = response.into_body();
            // The head came (HEADERS are not flow-controlled); the body cannot, and the stream
            // must end with an error, not hang.
            let end = tokio::time::timeout(Duration::from_secs(10), body.data()).await;
            let end = end.unwrap_or_else(|_| panic!("{protocol:?}: still held 10 s later"));
            assert!(!matches!(end, Some(Ok(ref d)) if !d.is_empty()), "{end:?}");
        }
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{protocol:?}: {took:?}");
        driver.abort();
    }
}

/// One request on `client` to `path` (with `headers`), its body read to the end: the status,
/// or the stream's error (`REFUSED_STREAM`, a GOAWAY).
async fn h2_get(
    mut client: h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<u16, h2::Error> {
    let mut request = http::Request::get(format!("http://localhost{path}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let (response, _) = client.send_request(request.body(()).unwrap(), true)?;
    let response = response.await?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk?.len());
    }
    Ok(status)
}

/// What became of the requests of [`h2_burst`].
#[derive(Debug, Default)]
struct Burst {
    ok: usize,
    refused: usize,
    /// Not sent: the connection was going away.
    unsent: usize,
    other: Vec<String>,
}

/// Up to `n` requests on one connection, `depth` at a time, until the server says GOAWAY.
async fn h2_burst(
    mut client: h2::client::SendRequest<bytes::Bytes>,
    n: usize,
    depth: usize,
) -> Burst {
    let mut burst = Burst::default();
    let mut running = tokio::task::JoinSet::new();
    let mut sent = 0;
    while sent < n || !running.is_empty() {
        while sent < n && running.len() < depth {
            match client.clone().ready().await {
                Ok(ready) => client = ready,
                Err(_) => {
                    burst.unsent = n - sent;
                    sent = n;
                    break;
                }
            }
            let c = client.clone();
            running.spawn(async move { h2_get(c, &format!("/r{sent}"), &[]).await });
            sent += 1;
        }
        match running.join_next().await {
            Some(Ok(Ok(200))) => burst.ok += 1,
            Some(Ok(Err(e))) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                burst.refused += 1
            }
            Some(Ok(Err(e))) if e.is_go_away() => burst.unsent += 1,
            Some(other) => burst.other.push(format!("{other:?}")),
            None => {}
        }
    }
    burst
}

/// An HTTP/2 connection is capped at 1000 requests like an HTTP/1.1 one (nginx's
/// `keepalive_requests`): GOAWAY after the 1000th, streams opened past it refused
/// (`REFUSED_STREAM`: not processed, safe to retry), and the connection closed once its streams
/// have ended. Before: 1,123 requests and 3,000 resets on one connection, no GOAWAY.
#[tokio::test(flavor = "multi_thread")]
async fn an_h2_connection_is_capped_at_1000_requests() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = ConfigBuilder::unlimited(up.addr());
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    for protocol in [Protocol::H2c, Protocol::H2Tls] {
        let io = common::kept::stream(&proxy, protocol, &ca.ca_pem()).await;
        let (client, conn) = h2::client::handshake(io).await.expect("h2 handshake");
        let driver = tokio::spawn(conn);
        let started = Instant::now();
        let burst = h2_burst(client, 1500, 10).await;
        let closed = tokio::time::timeout(Duration::from_secs(10), driver).await;
        println!("{protocol:?}: 1500 requests 10 at a time on one connection: {burst:?}, connection closed {:?} after the first ({})", started.elapsed(), closed.is_ok());
        assert_eq!(burst.ok, 1000, "{protocol:?}: {burst:?}");
        assert!(burst.other.is_empty(), "{protocol:?}: {burst:?}");
        assert_eq!(burst.ok + burst.refused + burst.unsent, 1500, "{burst:?}");
        assert!(burst.refused < 10, "{protocol:?}: {burst:?}");
        assert!(
            closed.is_ok(),
            "{protocol:?}: the connection was still open 10 s after its last stream"
        );
    }
}

/// `[server] keepalive_requests` sets the cap for every protocol: 50 requests one after the
/// other on one kept connection get 50 answers, then the connection is gone (HTTP/1.1 closed
/// after the 50th response, HTTP/2 after its GOAWAY), in the clear and over TLS.
#[tokio::test(flavor = "multi_thread")]
async fn keepalive_requests_caps_every_protocol() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = ConfigBuilder::unlimited(up.addr());
    let options = tls_options(&ca, "h2c = true\nkeepalive_requests = 50");
    let proxy = Proxy::start_with(&config, options);
    for protocol in [
        Protocol::H1,
        Protocol::H1Tls,
        Protocol::H2c,
        Protocol::H2Tls,
    ] {
        let mut kept = common::kept::Kept::open(&proxy, protocol, &ca.ca_pem()).await;
        let mut answered = 0;
        for i in 0..60 {
            let path = format!("/k{i}");
            match kept.send("GET", &path, &[], bytes::Bytes::new()).await {
                Ok(r) if r.status == 200 => answered += 1,
                Ok(r) => panic!("{protocol:?}: {}", r.status),
                Err(_) => break,
            }
        }
        assert_eq!(answered, 50, "{protocol:?}");
    }
}

/// Resets count as requests: paced resets (HEADERS, then RST_STREAM once the upstream has the
/// request) against an upstream that takes 3 s reach it at most 1000 times per connection, which
/// then gets GOAWAY; and never more than the connection's 100 streams are at the upstream at once
/// (a reset stream's task holds its place until its upstream request has ended; Pingora closes
/// the upstream connection of a reset stream). Before: 3,000 in 8.5 s from one connection.
#[tokio::test(flavor = "multi_thread")]
async fn paced_h2_resets_are_capped_per_connection() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = ConfigBuilder::unlimited(up.addr());
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    for protocol in [Protocol::H2Tls, Protocol::H2c] {
        let before = up.hits();
        let io = common::kept::stream(&proxy, protocol, &ca.ca_pem()).await;
        let (client, conn) = h2::client::handshake(io).await.expect("h2 handshake");
        let driver = tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let started = Instant::now();
        let mut sent = 0;
        for i in 0..1200 {
            client = match client.ready().await {
                Ok(c) => c,
                Err(_) => break,
            };
            let request = http::Request::get(format!("http://localhost/reset-{i}"))
                .header(DELAY_HEADER, "3000")
                .body(())
                .unwrap();
            let Ok((response, mut stream)) = client.send_request(request, true) else {
                break;
            };
            sent += 1;
            // Paced: until the upstream has it, or 20 ms (a stream refused never gets there).
            let paced = Instant::now();
            while up.hits() < before + sent && paced.elapsed() < Duration::from_millis(20) {
                tokio::task::yield_now().await;
            }
            stream.send_reset(h2::Reason::CANCEL);
            drop(response);
        }
        let took = started.elapsed();
        let reached = up.hits() - before;
        let closed = tokio::time::timeout(Duration::from_secs(10), driver).await;
        println!(
            "{protocol:?}: paced resets on one connection: {sent} sent of 1200 before GOAWAY in \
             {took:?}, {reached} reached the upstream, upstream max in flight {}, connection \
             closed: {}",
            up.max_in_flight(),
            closed.is_ok()
        );
        assert!(
            reached <= 1000,
            "{protocol:?}: {reached} reached the upstream"
        );
        assert!(sent < 1200, "{protocol:?}: no GOAWAY after {sent} streams");
        assert!(up.max_in_flight() <= 100, "{}", up.max_in_flight());
        assert!(closed.is_ok(), "{protocol:?}: still open 10 s after GOAWAY");
    }
}
