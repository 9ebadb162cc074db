//! Hostile clients against the real binary: floods of distinct keys, oversized and malformed
//! requests over raw TCP, slowloris connections; and the memory store's bound at a million keys.
//!
//! Pingora 0.9 limits that apply before slidegate sees a request (pingora-core
//! `protocols/http/v1`): a request header section may be at most 1 MiB - 1 (`MAX_HEADER_SIZE`,
//! checked before each further read, so one large first read can exceed it a little) with at
//! most 256 header lines (`MAX_HEADERS`); each read of a new connection's request times out
//! after 60 s. slidegate adds a deadline for the header section as a whole
//! (`server.client_header_timeout`, 10 s by default; tested in `edge_hardening.rs`).

use crate::common;

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::status_of;
use common::proxy::{get, send, ConfigBuilder, Proxy};
use common::store::ROUTE;
use common::upstream::Upstream;
use slidegate::limiter::memory::MemoryStore;
use slidegate::limiter::{Buckets, Limit, Store};

/// A proxy keyed by `X-Api-Key` (1 request per minute per key) on every path.
fn keyed_proxy(up: &Upstream) -> Proxy {
    Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "keys",
                "path_prefix = \"/\"\nkey = \"header:X-Api-Key\"\n\
                 limits = [ { requests = 1, window = \"10m\" } ]",
            )
            .build(),
    )
}

/// Resident set size of process `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_string();
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// The value of the `i`th key: mostly short, every 100th 10 KB long (and so hashed).
fn api_key(i: usize) -> String {
    if i % 100 == 7 {
        format!("{i:08}-{}", "k".repeat(10_000))
    } else {
        format!("key-{i}")
    }
}

/// 10 000 distinct `X-Api-Key` values, 100 of them 10 KB long, over keep-alive connections: every
/// first request is admitted, a repeat of any key (long ones included) is denied, the proxy stays
/// up and its counters agree. (20 000 took 40-100 s of the debug build and proved nothing more.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_distinct_keys_are_each_limited_on_their_own() {
    let _permit = common::heavy::heavy();
    const KEYS: usize = 10_000;
    const WORKERS: usize = 16;
    let up = Upstream::start();
    let mut proxy = keyed_proxy(&up);
    let rss_before = rss_kib(proxy.pid());
    let url = format!("http://{}/k", proxy.addr());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(WORKERS)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
            let mut errors = Vec::new();
            for i in (w..KEYS).step_by(WORKERS) {
                match client
                    .get(&url)
                    .header("x-api-key", api_key(i))
                    .send()
                    .await
                {
                    Ok(r) => *statuses.entry(r.status().as_u16()).or_default() += 1,
                    Err(e) => errors.push(format!("key {i}: {e}")),
                }
            }
            (statuses, errors)
        });
    }
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (s, e) = joined.expect("worker");
        for (k, v) in s {
            *statuses.entry(k).or_default() += v;
        }
        errors.extend(e);
    }
    let elapsed = started.elapsed();
    assert!(
        errors.is_empty(),
        "{} transport errors, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert_eq!(statuses.get(&200), Some(&KEYS), "statuses {statuses:?}");

    // Every key, short or hashed, has its own bucket holding one request: a repeat is denied.
    let mut repeats = BTreeMap::<u16, usize>::new();
    for i in (0..KEYS).step_by(97).chain((7..KEYS).step_by(1000)) {
        let r = client
            .get(&url)
            .header("x-api-key", api_key(i))
            .send()
            .await
            .expect("repeat");
        assert_eq!(r.status(), 429, "repeat of key {i}");
        *repeats.entry(r.status().as_u16()).or_default() += 1;
    }
    let denied = repeats.values().sum::<usize>() as u64;
    // A request without the key is keyed by the client address instead.
    assert_eq!(get(proxy.addr(), "/no-key").await.status, 200);
    assert_eq!(get(proxy.addr(), "/no-key").await.status, 429);

    let rss_after = rss_kib(proxy.pid());
    println!(
        "{KEYS} distinct keys in {elapsed:?} ({:.0} req/s); proxy RSS {rss_before} KiB -> \
         {rss_after} KiB (+{:.0} B per key)",
        KEYS as f64 / elapsed.as_secs_f64(),
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / KEYS as f64
    );
    assert!(proxy.is_running());
    assert_eq!(up.hits(), KEYS as u64 + 1);
    assert_eq!(proxy.decisions("keys", "allowed"), KEYS as u64 + 1);
    assert_eq!(proxy.decisions("keys", "denied"), denied + 1);
}

/// The memory store stays bounded: a quarter of a million one-off clients with a short window
/// (a million took 50 s of the debug build and proved nothing more), and once the window has
/// passed a sweep leaves nothing behind.
#[test]
fn a_flood_of_one_off_keys_is_all_swept_after_its_window() {
    let _permit = common::heavy::heavy();
    const KEYS: usize = 250_000;
    const THREADS: usize = 2;
    let window = Duration::from_millis(200);
    let limits = [Limit::log(1, window)];
    let store = Arc::new(MemoryStore::new());
    let rss_before = rss_kib(std::process::id());
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let store = store.clone();
            s.spawn(move || {
                let mut key = String::new();
                for i in (t..KEYS).step_by(THREADS) {
                    key.clear();
                    key.push_str("route:h:");
                    key.push_str(&i.to_string());
                    let v = futures::executor::block_on(store.check(
                        ROUTE,
                        &Buckets::one(&key),
                        &limits,
                    ))
                    .expect("memory store decides");
                    assert!(v.admitted, "{key} denied on its first request");
                }
            });
        }
    });
    let filled = started.elapsed();
    let filled_at = Instant::now();
    assert_eq!(store.len(), KEYS);
    assert_eq!(store.entries(), KEYS);
    let rss_full = rss_kib(std::process::id());

    // The last key recorded at `filled_at` at the latest; its entry leaves at + window.
    std::thread::sleep(window.saturating_sub(filled_at.elapsed()) + Duration::from_millis(20));
    let sweep_started = Instant::now();
    store.sweep();
    let swept_in = sweep_started.elapsed();
    assert_eq!(store.len(), 0, "expired buckets survived the sweep");
    assert_eq!(store.entries(), 0);
    assert!(store.is_empty());
    let rss_swept = rss_kib(std::process::id());
    println!(
        "memory store: {KEYS} keys filled in {filled:?} ({THREADS} threads, {} build), swept \
         in {swept_in:?}; test-process RSS {rss_before} -> {rss_full} -> {rss_swept} KiB \
         (shared with the other tests of this crate)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    // The store is usable again and starts from nothing.
    let v = futures::executor::block_on(store.check(ROUTE, &Buckets::one("route:h:0"), &limits))
        .expect("decides");
    assert!(v.admitted);
    assert_eq!(store.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Raw TCP.

/// What a raw exchange got back.
enum Outcome {
    /// A response: its status (0 when the status line does not parse) and first line.
    Status(u16, String),
    /// The connection was closed (or reset) without a response.
    Closed(String),
    /// Nothing within the read timeout, connection still open.
    Silent,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Status(_, line) => write!(f, "answered {line:?}"),
            Outcome::Closed(how) => write!(f, "closed without an answer ({how})"),
            Outcome::Silent => write!(f, "no answer, still open"),
        }
    }
}

impl Outcome {
    fn is_success(&self) -> bool {
        matches!(self, Outcome::Status(s, _) if (200..300).contains(s))
    }
}

/// Send `bytes` on a new connection (ignoring write errors: the proxy may close early), half-close
/// it, and read whatever comes back within `timeout`.
fn raw_exchange(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> Outcome {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream.set_write_timeout(Some(timeout)).expect("timeout");
    stream.set_read_timeout(Some(timeout)).expect("timeout");
    let write_error = stream.write_all(bytes).err();
    let _ = stream.shutdown(Shutdown::Write);
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let read_error = loop {
        match stream.read(&mut buf) {
            Ok(0) => break None,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.len() > 1 << 20 {
                    break None;
                }
            }
            Err(e) => break Some(e),
        }
    };
    if !got.is_empty() {
        let line = String::from_utf8_lossy(&got[..got.len().min(200)])
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        return Outcome::Status(status_of(&line), line);
    }
    match read_error {
        Some(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            Outcome::Silent
        }
        Some(e) => Outcome::Closed(format!("read: {e}; write: {write_error:?}")),
        None => Outcome::Closed(format!("EOF; write: {write_error:?}")),
    }
}

/// A GET whose header section is `header_lines` (each `Name: value`).
fn request_with(header_lines: &[String]) -> Vec<u8> {
    let mut out = b"GET /big HTTP/1.1\r\nHost: localhost\r\n".to_vec();
    for l in header_lines {
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Header sections over Pingora's limits (more than 1 MiB, in one value or many; more than 256
/// lines) are refused or the connection closed, nothing reaches the upstream, and the next
/// normal request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused_and_the_proxy_keeps_serving() {
    let up = Upstream::start();
    let mut proxy = keyed_proxy(&up);
    let addr = proxy.addr();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "one 1.2 MB value",
            request_with(&[format!("X-Api-Key: {}", "v".repeat(1_200_000))]),
        ),
        (
            "20 values of 64 KB",
            request_with(
                &(0..20)
                    .map(|i| format!("X-Big-{i}: {}", "b".repeat(64 * 1024)))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "300 header lines",
            request_with(&(0..300).map(|i| format!("X-H-{i}: v")).collect::<Vec<_>>()),
        ),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let bytes = bytes.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            raw_exchange(addr, &bytes, Duration::from_secs(10))
        })
        .await
        .expect("raw exchange");
        println!("{what}: {outcome:?}");
        assert!(!outcome.is_success(), "{what}: {outcome:?}");
        assert!(
            !matches!(outcome, Outcome::Silent),
            "{what}: no answer and no close in 10 s"
        );
        assert!(proxy.is_running(), "{what} killed the proxy");
        assert_eq!(up.hits(), i as u64, "{what} reached the upstream");
        let ok = send(addr, "GET", "/after", &[("x-api-key", what)]).await;
        assert_eq!(ok.status, 200, "after {what}: {ok:?}");
    }
    assert_eq!(up.hits(), cases.len() as u64);
}

/// Malformed requests over raw TCP: none crashes the proxy, none of the invalid ones is
/// answered 2xx, and a normal request right after each is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_do_not_crash_the_proxy() {
    let up = Upstream::start();
    let mut proxy = keyed_proxy(&up);
    let addr = proxy.addr();
    // A fixed pseudo-random byte soup (xorshift), so a failure is reproducible.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let garbage: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    // (what, bytes, must not be answered 2xx)
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("binary garbage", garbage, true),
        ("NUL bytes in the request line", b"G\0T /\0 HTTP/1.1\r\n\r\n".to_vec(), true),
        ("request line without a target", b"GET\r\nHost: x\r\n\r\n".to_vec(), true),
        ("unknown HTTP version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(), true),
        ("extra request line words", b"GET / HTTP/1.1 extra\r\nHost: x\r\n\r\n".to_vec(), true),
        ("space in a header name", b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n".to_vec(), true),
        ("non-ASCII header name", "GET / HTTP/1.1\r\nHost: x\r\nH\u{e9}ader: v\r\n\r\n".as_bytes().to_vec(), true),
        ("empty header name", b"GET / HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n".to_vec(), true),
        ("control byte in a header value", b"GET / HTTP/1.1\r\nHost: x\r\nX-Api-Key: a\x01b\r\n\r\n".to_vec(), true),
        (
            "absurd Content-Length",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999999\r\n\r\nabc".to_vec(),
            true,
        ),
        ("negative Content-Length", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec(), true),
        (
            "two different Content-Lengths",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde".to_vec(),
            true,
        ),
        // The ones below are well-formed up to the point where the body goes wrong, each with a
        // key of its own so that it is admitted and forwarded: what the client sees depends on
        // when the proxy notices, so only survival is checked.
        (
            "truncated chunked body",
            b"POST / HTTP/1.1\r\nHost: x\r\nX-Api-Key: body-1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc".to_vec(),
            false,
        ),
        (
            "invalid chunk size",
            b"POST / HTTP/1.1\r\nHost: x\r\nX-Api-Key: body-2\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(),
            false,
        ),
        (
            "body shorter than Content-Length",
            b"POST / HTTP/1.1\r\nHost: x\r\nX-Api-Key: body-3\r\nContent-Length: 100\r\n\r\nshort".to_vec(),
            false,
        ),
        ("header section cut off", b"GET / HTTP/1.1\r\nHost: x\r\nX-Api-Key: par".to_vec(), false),
    ];
    let mut report = Vec::new();
    for (i, (what, bytes, must_fail)) in cases.into_iter().enumerate() {
        let outcome = tokio::task::spawn_blocking(move || {
            raw_exchange(addr, &bytes, Duration::from_secs(10))
        })
        .await
        .expect("raw exchange");
        report.push(format!("{what}: {outcome:?}"));
        if must_fail {
            assert!(!outcome.is_success(), "{what}: {outcome:?}");
        }
        assert!(
            !matches!(outcome, Outcome::Silent),
            "{what}: no answer and no close in 10 s"
        );
        assert!(
            proxy.is_running(),
            "{what} killed the proxy; log:\n{}",
            proxy.log()
        );
        let key = format!("after-{i}");
        let ok = send(addr, "GET", "/after", &[("x-api-key", &key)]).await;
        assert_eq!(ok.status, 200, "after {what}: {ok:?}");
    }
    println!("{}", report.join("\n"));
    assert!(!proxy.log().contains("panicked"), "log:\n{}", proxy.log());
}

/// Slowloris: 200 connections dribbling an endless header section one byte at a time do not
/// slow normal requests down, which keep being served promptly meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_do_not_starve_normal_requests() {
    const SLOW: usize = 200;
    const DURATION: Duration = Duration::from_secs(3);
    let up = Upstream::start();
    let mut proxy = keyed_proxy(&up);
    let addr = proxy.addr();

    let started = Instant::now();
    let mut slow = tokio::task::JoinSet::new();
    for i in 0..SLOW {
        slow.spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut s = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let head = format!("GET /slow/{i} HTTP/1.1\r\nHost: localhost\r\nX-Slow: ");
            let mut sent = 0usize;
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            for b in head.bytes().chain(std::iter::repeat(b'a')) {
                if started.elapsed() > DURATION {
                    break;
                }
                tick.tick().await;
                s.write_all(&[b])
                    .await
                    .map_err(|e| format!("after {sent} bytes: {e}"))?;
                sent += 1;
            }
            Ok::<usize, String>(sent)
        });
    }

    // Meanwhile: normal requests, one after another, each on a new connection.
    let mut latencies = Vec::new();
    let mut n = 0;
    while started.elapsed() < DURATION {
        let t = Instant::now();
        let key = format!("normal-{n}");
        let reply = send(addr, "GET", "/normal", &[("x-api-key", &key)]).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        latencies.push(t.elapsed());
        n += 1;
    }
    let mut dribbled = 0;
    while let Some(r) = slow.join_next().await {
        dribbled += r
            .expect("slow task")
            .expect("a slowloris connection was cut early");
    }
    latencies.sort();
    let max = *latencies.last().expect("some requests");
    let p50 = latencies[latencies.len() / 2];
    println!(
        "slowloris: {SLOW} connections dribbled {dribbled} bytes over {DURATION:?}; meanwhile \
         {n} normal requests, p50 {p50:?}, max {max:?}"
    );
    assert!(n >= 20, "only {n} normal requests in {DURATION:?}");
    assert!(
        max < Duration::from_secs(2),
        "a normal request took {max:?}"
    );
    assert!(proxy.is_running());
    assert_eq!(
        up.hits(),
        n as u64,
        "no slowloris request reached the upstream"
    );
}
