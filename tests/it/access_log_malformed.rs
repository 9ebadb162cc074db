//! Issue 32 row 8: heads Pingora refuses before any hook runs (a bad request line, a bad header
//! name, a head over its 1 MiB limit) and the edge's own `408` for a head that did not arrive in
//! time are each one access log line with the client address, the status and what was wrong,
//! in JSON and in nginx's `combined` (compared with a real nginx's line); a flood of them is
//! every line in the access log and a bounded number of lines in the process log.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::log_file::{wait_line_containing, wait_lines};
use common::proxy::{exchange, ConfigBuilder, Proxy, ProxyOptions};
use common::upstream::{Upstream, DELAY_HEADER};

/// Shorter than the tests' 5 s read timeout, so the `408` arrives within it.
const HEAD_TIMEOUT: &str = "500ms";

/// A proxy with one unlimited route to `up`, its access log in `format` to a file in `dir`.
fn proxy_logging(up: &Upstream, dir: &Path, format: &str) -> (Proxy, PathBuf) {
    let access = dir.join("access.log");
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("all", "")
        .raw(&format!(
            "[log]\naccess = {access:?}\nformat = \"{format}\""
        ))
        .build();
    let opts = ProxyOptions {
        server_extra: format!("client_header_timeout = \"{HEAD_TIMEOUT}\""),
        ..ProxyOptions::default()
    };
    (Proxy::start_with(&config, opts), access)
}

/// A head of more than 1 MiB (Pingora's limit): one header field of 1.1 MiB.
fn oversized_head() -> Vec<u8> {
    let mut head = b"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    head.resize(head.len() + 1_100_000, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    head
}

/// The malformed heads, each with the status it gets and what its line says.
fn malformed() -> Vec<(&'static str, Vec<u8>, u16)> {
    vec![
        ("bad request line", b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            "bad header name",
            b"GET /h?token=s3cr3t HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n".to_vec(),
            400,
        ),
        ("oversized head", oversized_head(), 400),
        (
            "head timeout",
            b"GET /slow HTTP/1.1\r\nHost: x\r\n".to_vec(),
            408,
        ),
    ]
}

/// Send each malformed head on its own connection, then a normal request; after each, wait for
/// its line, so the file holds them in order. Returns the lines. `nginx`: nginx closes a head
/// that timed out without an answer (slidegate sends its `408`).
fn send_each(addr: SocketAddr, access: &Path, nginx: bool) -> Vec<String> {
    for (i, (what, bytes, status)) in malformed().into_iter().enumerate() {
        let (got, text) = exchange(addr, &bytes);
        // The oversized head's answer can be lost to the reset its unread bytes cause.
        let silent_ok = what == "oversized head" || (nginx && what == "head timeout");
        assert!(
            got == status || (silent_ok && got == 0),
            "{what}: {got} {text:?}"
        );
        wait_lines(access, i + 1);
    }
    let (status, text) = exchange(
        addr,
        b"GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{text}");
    wait_line_containing(access, "/fine")
}

/// JSON: one line per refused head, with the client, the status, what was wrong, and never the
/// query string; then the normal request's line.
#[test]
fn each_refused_head_is_one_json_line() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, access) = proxy_logging(&up, dir.path(), "json");
    let lines = send_each(proxy.addr(), &access, false);
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let want = [
        (400, "-", "-", "invalid request line"),
        (400, "GET", "/h", "invalid request header"),
        (400, "GET", "/big", "request head too large"),
        (
            408,
            "GET",
            "/slow",
            "client_header_timeout: request head not received in time",
        ),
    ];
    for (line, (status, method, path, error)) in parsed.iter().zip(want) {
        assert_eq!(line["client"], "127.0.0.1", "{line}");
        assert_eq!(line["status"], status, "{line}");
        assert_eq!(line["method"], method, "{line}");
        assert_eq!(line["path"], path, "{line}");
        assert_eq!(line["error"], error, "{line}");
        assert_eq!(line["bytes_sent"], 0, "{line}");
        assert!(
            line["route"].is_null() && line["upstream"].is_null(),
            "{line}"
        );
    }
    assert_eq!(parsed[4]["status"], 200);
    assert!(parsed[4]["error"].is_null(), "{}", parsed[4]);
    assert!(!lines.concat().contains("s3cr3t"), "{lines:#?}");
}

/// `combined`: the same lines as nginx writes for the same bytes (the raw request line as
/// `$request`), but for the time of day and `$body_bytes_sent` (nginx's `400` has an HTML body,
/// Pingora's none).
#[test]
fn each_refused_head_is_one_combined_line_as_nginx_writes_it() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, access) = proxy_logging(&up, dir.path(), "combined");
    let ours = send_each(proxy.addr(), &access, false);
    let nginx = common::nginx::Nginx::start(
        &format!(
            "    access_log @DIR@/access.log combined;\n    client_header_timeout {HEAD_TIMEOUT};"
        ),
        &format!("        location / {{ proxy_pass http://{}; }}", up.addr()),
    );
    let theirs_path = nginx.dir().join("access.log");
    let theirs = send_each(nginx.addr(), &theirs_path, true);
    // 127.0.0.1 - - [01/Dec/2026:08:26:38 +0000] "GET ..." 400 0 "-" "-": the time and
    // $body_bytes_sent blanked. `"` inside $request is escaped, so `" ` ends it.
    let comparable = |line: &str| {
        let (head, rest) = line.split_once(" [").unwrap();
        let (_time, tail) = rest.split_once("] ").unwrap();
        let (request, after) = tail.split_once("\" ").unwrap();
        let fields: Vec<&str> = after.splitn(3, ' ').collect();
        format!("{head} [-] {request}\" {} - {}", fields[0], fields[2])
    };
    for (o, t) in ours.iter().zip(&theirs).take(4) {
        println!("slidegate: {:.120}\nnginx:     {:.120}", o, t);
        assert_eq!(
            comparable(o),
            comparable(t),
            "ours:  {o:.200}\nnginx: {t:.200}"
        );
    }
    assert!(
        ours[0].ends_with("\"GARBAGE\" 400 0 \"-\" \"-\""),
        "{}",
        ours[0]
    );
    assert!(
        ours[3].ends_with("\"GET /slow HTTP/1.1\" 408 0 \"-\" \"-\""),
        "{}",
        ours[3]
    );
    assert_eq!(ours.len(), 5, "{ours:#?}");
}

/// 2000 malformed heads from 4 clients at once: 2000 access log lines, one per head, and a
/// bounded number of process log lines (one per 10 s with the count); a normal request is
/// still answered afterwards.
#[test]
fn a_flood_is_every_line_in_the_access_log_and_bounded_in_the_process_log() {
    const CLIENTS: usize = 4;
    const EACH: usize = 500;
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, access) = proxy_logging(&up, dir.path(), "json");
    let log_before = proxy.log().lines().count();
    let addr = proxy.addr();
    let started = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            s.spawn(move || {
                for i in 0..EACH {
                    let bytes: &[u8] = match (c + i) % 2 {
                        0 => b"GARBAGE\r\n\r\n",
                        _ => b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
                    };
                    let (status, text) = exchange(addr, bytes);
                    assert_eq!(status, 400, "{text}");
                }
            });
        }
    });
    let took = started.elapsed();
    let (status, _) = exchange(
        addr,
        b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "the proxy still answers");
    let lines = wait_line_containing(&access, "/after");
    let refused = lines
        .iter()
        .filter(|l| l.contains("\"status\":400"))
        .count();
    assert_eq!(refused, CLIENTS * EACH, "one access line per refused head");
    assert_eq!(lines.len(), CLIENTS * EACH + 1);
    assert!(lines.iter().all(|l| l.contains("\"client\":\"127.0.0.1\"")));
    let log = proxy.log();
    let added: Vec<&str> = log.lines().skip(log_before).collect();
    // One line at the first refusal, then at most one per 10 s.
    let bound = 2 + took.as_secs() as usize / 10;
    println!(
        "{} refused heads in {took:?}: {} access lines, {} process log lines",
        CLIENTS * EACH,
        lines.len(),
        added.len()
    );
    assert!(
        added.len() <= bound,
        "{} lines (bound {bound}):\n{}",
        added.len(),
        added.join("\n")
    );
    assert!(
        added
            .iter()
            .any(|l| l.contains("request head(s) refused before routing")),
        "{log}"
    );
    assert_eq!(proxy.counter("slidegate_access_log_dropped_total"), 0);
}

/// The class, not the examples: a malformed head pipelined after a good request (parsed from
/// bytes the first request's read brought in, so no head read of its own) and `CONNECT`
/// (Pingora's `405`) are logged too, one line each after the good request's.
#[test]
fn pipelined_and_connect_refusals_are_logged_too() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let (proxy, access) = proxy_logging(&up, dir.path(), "json");
    let (status, text) = exchange(
        proxy.addr(),
        b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n",
    );
    assert_eq!(status, 200, "{text}");
    wait_lines(&access, 2);
    let (status, text) = exchange(
        proxy.addr(),
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    );
    assert_eq!(status, 405, "{text}");
    let lines = wait_lines(&access, 3);
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(parsed[0]["path"], "/first");
    assert_eq!(parsed[1]["status"], 400, "{}", parsed[1]);
    assert_eq!(parsed[1]["client"], "127.0.0.1");
    assert!(parsed[1]["error"].is_string(), "{}", parsed[1]);
    assert_eq!(parsed[2]["status"], 405, "{}", parsed[2]);
    assert_eq!(parsed[2]["method"], "CONNECT", "{}", parsed[2]);
    assert_eq!(parsed[2]["error"], "method not allowed (CONNECT)");
    assert_eq!(lines.len(), 3, "{lines:#?}");
}

/// The edge's other `408`, a body not received within `client_body_timeout`: the proxy's hooks
/// saw that request, and its one line says `408`, as the client was answered.
#[test]
fn a_body_timeout_is_one_line_with_its_408() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("all", "")
        .raw(&format!("[log]\naccess = {access:?}\nformat = \"json\""))
        .build();
    let opts = ProxyOptions {
        server_extra: "client_body_timeout = \"500ms\"".into(),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::start_with(&config, opts);
    // The upstream waits (its answer would otherwise come before the body's deadline).
    let head = format!(
        "POST /body HTTP/1.1\r\nHost: x\r\n{DELAY_HEADER}: 10000\r\nContent-Length: 10\r\n\r\nab"
    );
    let (status, text) = exchange(proxy.addr(), head.as_bytes());
    assert_eq!(status, 408, "{text}");
    let (status, _) = exchange(
        proxy.addr(),
        b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    let lines = wait_line_containing(&access, "/after");
    println!("{lines:#?}");
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let body: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(body["path"], "/body");
    assert_eq!(body["status"], 408, "{body}");
    assert_eq!(
        body["error"], "client_body_timeout: request body not received in time",
        "{body}"
    );
}

/// slidegate's own `400`s (a head Pingora accepted that slidegate refuses: a bad `Host`, a
/// lower-case method, an HTTP/1.1 request without `Host`, the route's key named twice) are one
/// line each too, with the client address (resolved before the checks) and the reason.
#[test]
fn slidegate_refusals_carry_the_client_and_the_reason() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "keyed",
            "key = \"query:who\"\nlimits = [{ requests = 5, window = \"1m\" }]",
        )
        .raw(&format!("[log]\naccess = {access:?}\nformat = \"json\""))
        .build();
    let proxy = Proxy::start(&config);
    let cases: [(&[u8], &str); 4] = [
        (b"GET / HTTP/1.1\r\nHost: a:b:c\r\n\r\n", "invalid host"),
        (
            b"get / HTTP/1.1\r\nHost: x\r\n\r\n",
            "method must be upper-case",
        ),
        (b"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 request without Host"),
        (
            b"GET /?who=a&who=b HTTP/1.1\r\nHost: x\r\n\r\n",
            "the route's key is given twice with different values",
        ),
    ];
    for (i, (bytes, _)) in cases.iter().enumerate() {
        let (status, text) = exchange(proxy.addr(), bytes);
        assert_eq!(status, 400, "{text}");
        wait_lines(&access, i + 1);
    }
    let lines = wait_lines(&access, cases.len());
    for (line, (_, why)) in lines.iter().zip(cases) {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["status"], 400, "{line}");
        assert_eq!(line["client"], "127.0.0.1", "{line}");
        assert_eq!(line["error"], why, "{line}");
    }
}
