//! Logs an operator can read, through the real binary: the access log's request fields over
//! HTTP/1.1, h2c and HTTP/2 over TLS; `X-Request-Id` kept or generated, sent upstream and
//! returned on every answer (the upstream's and slidegate's own 404, 429, 502); and a flood of
//! what clients can cause (garbage on the TLS port, illegal SNI names, a refused upstream, an
//! upstream that hangs up, a frozen Redis) that moves the counters while the process log stays
//! within its documented rate bound.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fetch::url;
use common::log_file::wait_lines;
use common::proxy::{closed_addr, ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{client_hello_with_sni, tls_options, Protocol, TestCa};
use common::upstream::{Upstream, UPSTREAM_BODY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The protocols a request-path feature is checked over.
const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

/// One POST with a body, a user agent with quotes, a referer with a query and an
/// `X-Request-Id` per protocol: each JSON line names the protocol as nginx's
/// `$server_protocol`, the TLS version, the body bytes both ways, the upstream and its time,
/// the id as sent, and the two header values escaped as nginx does.
#[tokio::test]
async fn access_log_fields_over_h1_h2c_and_h2_tls() {
    let ca = TestCa::new("slidegate test CA");
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let proxy = Proxy::start_with(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("all", "")
            .raw(&format!("[log]\naccess = {access:?}\nformat = \"json\""))
            .build(),
        tls_options(&ca, "h2c = true"),
    );
    for protocol in PROTOCOLS {
        let resp = protocol
            .client(&ca.ca_pem())
            .post(url(&proxy, protocol, "/p?secret=1"))
            .header("user-agent", "t/1 \"x\"")
            .header("referer", "https://r.example/a?b=c")
            .header("x-request-id", format!("id-{protocol:?}"))
            .body("hello body")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), protocol.version());
    }
    let lines = wait_lines(&access, PROTOCOLS.len());
    for (protocol, line) in PROTOCOLS.iter().zip(&lines) {
        let l: serde_json::Value = serde_json::from_str(line).unwrap();
        let (want_protocol, want_tls) = match protocol {
            Protocol::H1 => ("HTTP/1.1", None),
            Protocol::H2c => ("HTTP/2.0", None),
            _ => ("HTTP/2.0", Some("TLSv1.3")),
        };
        assert_eq!(l["protocol"], want_protocol, "{line}");
        assert_eq!(l["tls_version"].as_str(), want_tls, "{line}");
        assert_eq!(l["method"], "POST");
        assert_eq!(l["path"], "/p", "{line}");
        assert_eq!(l["status"], 200);
        assert_eq!(l["bytes_received"], "hello body".len(), "{line}");
        assert_eq!(l["bytes_sent"], UPSTREAM_BODY.len(), "{line}");
        assert_eq!(l["request_id"], format!("id-{protocol:?}"), "{line}");
        assert_eq!(l["user_agent"], "t/1 \\x22x\\x22", "{line}");
        assert_eq!(l["referer"], "https://r.example/a?b=c", "{line}");
        assert_eq!(l["upstream"], up.addr().to_string());
        assert!(l["upstream_ms"].as_f64().unwrap() >= 0.0, "{line}");
    }
    assert!(!std::fs::read_to_string(&access).unwrap().contains("secret"));
}

/// What a client and the upstream saw of one request's id.
async fn id_of(client: &reqwest::Client, url: &str, sent: Option<&str>) -> (u16, Option<String>) {
    let mut req = client.get(url);
    if let Some(id) = sent {
        req = req.header("x-request-id", id);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let id = resp
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_string());
    (resp.status().as_u16(), id)
}

fn is_generated(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// Over each protocol: a valid id is kept, sent upstream and returned; none, or one with a
/// space, gets a generated one (the same upstream and back); slidegate's own 404, 429 and
/// 502 carry the id too.
#[tokio::test]
async fn request_id_round_trips_on_h1_h2c_and_h2_tls() {
    let ca = TestCa::new("slidegate test CA");
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .upstream("dead", closed_addr())
            .route("dead", "path_prefix = \"/dead\"\nupstream = \"dead\"")
            .route(
                "lim",
                "path_prefix = \"/lim\"\nkey = \"header:X-Client\"\n\
                 limits = [ { requests = 1, window = \"1m\" } ]",
            )
            .route("ok", "path_prefix = \"/ok\"")
            .build(),
        tls_options(&ca, "h2c = true"),
    );
    let upstream_saw = || {
        let last = up.last_request().expect("a request reached the upstream");
        let ids: Vec<String> = (last.headers.get_all("x-request-id").iter())
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        ids
    };
    for protocol in PROTOCOLS {
        let client = protocol.client(&ca.ca_pem());
        let at = |path: &str| url(&proxy, protocol, path);
        let kept = format!("client-{protocol:?}-42");
        assert_eq!(
            id_of(&client, &at("/ok"), Some(&kept)).await,
            (200, Some(kept.clone()))
        );
        assert_eq!(upstream_saw(), vec![kept.clone()], "{protocol:?}");

        for sent in [None, Some("has space"), Some("x\"y")] {
            let (status, id) = id_of(&client, &at("/ok"), sent).await;
            let id = id.unwrap_or_else(|| panic!("{protocol:?} {sent:?}: no id"));
            assert_eq!(status, 200);
            assert!(is_generated(&id), "{protocol:?} {sent:?}: {id}");
            assert_eq!(upstream_saw(), vec![id.clone()], "{protocol:?}");
        }

        let (status, id) = id_of(&client, &at("/nowhere"), Some("own-404")).await;
        assert_eq!(
            (status, id.as_deref()),
            (404, Some("own-404")),
            "{protocol:?}"
        );
        let (status, id) = id_of(&client, &at("/dead"), None).await;
        assert_eq!(status, 502, "{protocol:?}");
        assert!(
            is_generated(&id.unwrap()),
            "{protocol:?}: 502 without an id"
        );
        let lim = client
            .get(at("/lim"))
            .header("x-client", format!("{protocol:?}"));
        assert_eq!(lim.send().await.unwrap().status(), 200);
        let lim = (client.get(at("/lim")))
            .header("x-client", format!("{protocol:?}"))
            .header("x-request-id", "own-429");
        let resp = lim.send().await.unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["x-request-id"], "own-429", "{protocol:?}");
    }
}

/// A TCP server that accepts connections and closes them at once: an upstream that hangs up
/// before answering (Pingora's error line per request, which only the bucket bounds).
fn hang_up_upstream() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    addr
}

/// Open a connection to the TLS port, send `bytes`, read until the server closes; `false`
/// if it could not connect.
async fn tls_port_noise(addr: SocketAddr, bytes: &[u8]) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let _ = s.write_all(bytes).await;
    let mut sink = [0u8; 1024];
    let read = async { while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    true
}

/// The `N` of every "suppressed N lines" summary in `log`.
fn summarised(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            l.split_once("suppressed ")?
                .1
                .split_once(" lines")?
                .0
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Three seconds of what clients can cause, in parallel: HTTP on the TLS port, ClientHellos
/// with an illegal SNI name, requests (HTTP/1.1, h2c, HTTP/2 over TLS) to a refused upstream,
/// to an upstream that hangs up, and to a route whose Redis is frozen. Every handshake
/// failure, failed connect and store error is counted; no TLS or SNI line reaches the log;
/// the refused upstream and the store are one WARN line each; and the whole log grows by at
/// most the bucket (100 + 20 per second) plus its summaries, which add up to the suppressed
/// counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_client_noise_is_counted_and_the_log_stays_bounded() {
    let _permit = common::heavy::heavy();
    let ca = TestCa::new("slidegate test CA");
    let up = Upstream::start();
    let redis = RedisServer::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::new()
            .store(&format!("{}\ntimeout = \"50ms\"", redis.store_toml()))
            .upstream("app", up.addr())
            .upstream("dead", closed_addr())
            .upstream("hangup", hang_up_upstream())
            .route("dead", "path_prefix = \"/dead\"\nupstream = \"dead\"")
            .route("hangup", "path_prefix = \"/hangup\"\nupstream = \"hangup\"")
            .route(
                "store",
                "path_prefix = \"/store\"\non_error = \"allow\"\n\
                 limits = [ { requests = 1000000, window = \"1m\" } ]",
            )
            .build(),
        tls_options(&ca, "h2c = true"),
    );
    let client = Protocol::H1.client(&ca.ca_pem());
    assert_eq!(
        client
            .get(url(&proxy, Protocol::H1, "/store"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    redis.freeze();

    let before = proxy.log().lines().count();
    let started = Instant::now();
    let flood_for = Duration::from_secs(3);
    let sent = Arc::new([(); 5].map(|()| AtomicU64::new(0)));
    let (tls, hello) = (
        proxy.tls_addr(),
        client_hello_with_sni(b"bad_name!.example"),
    );
    let mut tasks = Vec::new();
    for worker in 0..4usize {
        let sent = sent.clone();
        let hello = hello.clone();
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < flood_for {
                let (kind, bytes): (usize, &[u8]) = match worker % 2 {
                    0 => (0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
                    _ => (1, &hello),
                };
                if tls_port_noise(tls, bytes).await {
                    sent[kind].fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for (i, path) in ["/dead", "/hangup", "/store"].into_iter().enumerate() {
        for protocol in PROTOCOLS {
            for _ in 0..2 {
                let client = protocol.client(&ca.ca_pem());
                let url = url(&proxy, protocol, path);
                let sent = sent.clone();
                tasks.push(tokio::spawn(async move {
                    while started.elapsed() < flood_for {
                        if client.get(&url).send().await.is_ok() {
                            sent[2 + i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = |i: usize| sent[i].load(Ordering::Relaxed);
    println!(
        "flood: {} HTTP-on-TLS, {} illegal SNI, {} to /dead, {} to /hangup, {} to /store in {:?}",
        n(0),
        n(1),
        n(2),
        n(3),
        n(4),
        started.elapsed()
    );

    // Every failed handshake is counted (each connection's own count comes before its close).
    let handshakes = "slidegate_tls_handshake_failures_total{reason=\"error\"}";
    assert_eq!(proxy.counter(handshakes), n(0) + n(1), "{}", proxy.log());
    let dead = "slidegate_upstream_connect_failures_total{upstream=\"dead\"}";
    assert_eq!(proxy.counter(dead), n(2));
    let store_errors = proxy.counter("slidegate_store_errors_total{kind=\"timeout\"}")
        + proxy.counter("slidegate_store_errors_total{kind=\"unavailable\"}");
    assert!(store_errors > 0, "no store error counted");
    assert!(proxy.counter("slidegate_log_lines_suppressed_total") > 0);

    // The summaries add up to the counter once the last one is out (at most 10 s apart).
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        let suppressed = proxy.counter("slidegate_log_lines_suppressed_total");
        if summarised(&proxy.log()) == suppressed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "summaries do not add up to {suppressed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    let log = proxy.log();
    let flood_lines: Vec<&str> = log.lines().skip(before).collect();
    let summaries = flood_lines
        .iter()
        .filter(|l| l.contains("suppressed "))
        .count();
    let mut by_source = std::collections::BTreeMap::<&str, usize>::new();
    for line in &flood_lines {
        let source = line
            .split(']')
            .next()
            .unwrap_or("")
            .rsplit(' ')
            .next()
            .unwrap_or("");
        *by_source.entry(source).or_default() += 1;
    }
    println!("flood lines by target: {by_source:?}");
    let bound = 100 + 20 * (elapsed.as_secs() as usize + 1);
    println!(
        "{} log lines in {elapsed:?} ({summaries} summaries), bound {bound}; suppressed {}",
        flood_lines.len(),
        proxy.counter("slidegate_log_lines_suppressed_total")
    );
    assert!(
        flood_lines.len() <= bound + summaries,
        "{} lines over the bound {bound}",
        flood_lines.len()
    );
    for banned in ["SNI", "andshake", "TLS"] {
        let hit = flood_lines.iter().find(|l| l.contains(banned));
        assert!(hit.is_none(), "a {banned} line reached the log: {hit:?}");
    }
    let dead_lines = flood_lines
        .iter()
        .filter(|l| l.contains("upstream dead:") && l.contains("failed connect"))
        .count();
    assert_eq!(
        dead_lines, 1,
        "one line for the refused upstream's connects"
    );
    // Its one server taken out (passive ejection): one line, not one per refused request.
    let down_lines = flood_lines
        .iter()
        .filter(|l| l.contains("upstream dead:") && l.contains("is down: out for"))
        .count();
    assert_eq!(down_lines, 1, "one line for the refused upstream's server");
    let store_lines: Vec<&&str> = (flood_lines.iter())
        .filter(|l| l.contains("route store:"))
        .collect();
    assert!(
        !store_lines.is_empty()
            && store_lines.len() <= 3
            && store_lines[0].contains("admitting unrecorded")
            && store_lines[0].contains("last error: store"),
        "{store_lines:#?}"
    );
    redis.thaw();
}
