//! What slidegate adds to its answers, through the real binary over HTTP/1.1, h2c, and
//! HTTP/1.1 and HTTP/2 over TLS:
//! - `server.server_header` replaces the upstream's `Server` and is set on the proxy's own
//!   answers (429, 404, 502); `""` sends none;
//! - a route's `response_headers` are set on its every response, proxied or its own, and a
//!   reload changes them (and `server_header`);
//! - a denied request's small body is read and dropped, so a keep-alive client posting to a
//!   denied route keeps one connection; a 1 MiB body (or a stalled one) still closes it on
//!   HTTP/1, while on HTTP/2 only the stream ends.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::arrivals::until_metric;
use common::config::assert_invalid;
use common::http::Reply;
use common::kept::Kept;
use common::ports::closed_addr;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::{Upstream, FIELD_HEADER};

const HSTS: &str = "Strict-Transport-Security";

/// `/hsts`: one request per hour per `X-Client`, with two response fields; `/down`: an
/// upstream that refuses connections (502), with the same fields; anything else: no route.
fn config(up: &Upstream, hsts: &str) -> String {
    ConfigBuilder::new()
        .upstream("app", up.addr())
        .upstream("down", closed_addr())
        .route(
            "hsts",
            &format!(
                "path_prefix = \"/hsts\"\nkey = \"header:X-Client\"\n\
                 limits = [{{ requests = 1, window = \"1h\" }}]\n\
                 response_headers = {{ \"{HSTS}\" = \"{hsts}\", \"X-Frame-Options\" = \"DENY\" }}"
            ),
        )
        .route(
            "down",
            &format!(
                "path_prefix = \"/down\"\nupstream = \"down\"\n\
                 response_headers = {{ \"{HSTS}\" = \"{hsts}\" }}"
            ),
        )
        .build()
}

fn start(up: &Upstream, ca: &TestCa, server_lines: &str) -> Proxy {
    let lines = format!("h2c = true\n{server_lines}");
    Proxy::start_with(&config(up, "max-age=63072000"), tls_options(ca, &lines))
}

/// GET `path` on a new connection of `protocol` as client `who`, the upstream asked to send
/// its own `Server` and a weaker HSTS.
async fn get(proxy: &Proxy, ca: &TestCa, protocol: Protocol, path: &str, who: &str) -> Reply {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let headers = [
        ("x-client", who),
        (FIELD_HEADER, "Server: gunicorn"),
        (FIELD_HEADER, "Strict-Transport-Security: max-age=1"),
    ];
    let reply = conn.send("GET", path, &headers, Bytes::new()).await;
    reply.unwrap_or_else(|e| panic!("{protocol:?} GET {path}: {e}"))
}

#[tokio::test]
async fn server_and_route_fields_are_on_proxied_and_own_answers() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "");
    for protocol in Protocol::ALL {
        let who = format!("{protocol:?}");
        let proxied = get(&proxy, &ca, protocol, "/hsts", &who).await;
        let denied = get(&proxy, &ca, protocol, "/hsts", &who).await;
        let failed = get(&proxy, &ca, protocol, "/down", &who).await;
        let no_route = get(&proxy, &ca, protocol, "/nothing", &who).await;
        let statuses = [&proxied, &denied, &failed, &no_route].map(|r| r.status);
        assert_eq!(statuses, [200, 429, 502, 404], "{protocol:?}");
        for reply in [&proxied, &denied, &failed, &no_route] {
            let all: Vec<_> = reply.headers.get_all("server").iter().collect();
            assert_eq!(all, ["slidegate"], "{protocol:?} {}", reply.status);
        }
        for reply in [&proxied, &denied, &failed] {
            assert_eq!(reply.header(HSTS), Some("max-age=63072000"), "{protocol:?}");
            assert_eq!(reply.headers.get_all(HSTS).iter().count(), 1);
        }
        for reply in [&proxied, &denied] {
            assert_eq!(
                reply.header("x-frame-options"),
                Some("DENY"),
                "{protocol:?}"
            );
        }
        assert_eq!(
            no_route.header(HSTS),
            None,
            "{protocol:?}: a 404 has no route"
        );
    }
    println!("Server: slidegate on 200/429/502/404 and route fields on 200/429/502, 4 protocols");
}

#[tokio::test]
async fn an_empty_server_header_sends_none() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "server_header = \"\"");
    for protocol in Protocol::ALL {
        let who = format!("{protocol:?}");
        for (path, status) in [("/hsts", 200), ("/hsts", 429), ("/nothing", 404)] {
            let reply = get(&proxy, &ca, protocol, path, &who).await;
            assert_eq!(reply.status, status, "{protocol:?}");
            assert_eq!(reply.header("server"), None, "{protocol:?} {status}");
        }
    }
}

#[tokio::test]
async fn a_reload_swaps_the_server_header_and_route_fields() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "");
    let before = get(&proxy, &ca, Protocol::H1, "/hsts", "a").await;
    assert_eq!(before.header(HSTS), Some("max-age=63072000"));
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));
    let server = format!("{}server_header = \"edge/2\"\n", proxy.server_section());
    proxy.write_config_text(&format!("{server}{}", config(&up, "max-age=300")));
    proxy.signal(libc::SIGHUP).unwrap();
    let ok = r#"slidegate_config_reloads_total{result="ok"}"#;
    until_metric(&proxy, ok, 1.0, Duration::from_secs(10)).await;
    for protocol in Protocol::ALL {
        let who = format!("after {protocol:?}");
        for status in [200, 429] {
            let reply = get(&proxy, &ca, protocol, "/hsts", &who).await;
            assert_eq!(reply.status, status, "{protocol:?}");
            assert_eq!(reply.header("server"), Some("edge/2"), "{protocol:?}");
            assert_eq!(reply.header(HSTS), Some("max-age=300"), "{protocol:?}");
        }
    }
}

/// A denied client on one kept connection: a GET that passes, then five POSTs with a 1 KiB
/// body, all answered 429 on that connection. Then a 1 MiB POST: on HTTP/1 the proxy closes
/// (the body is not read); on HTTP/2 only that stream ends and the connection goes on.
#[tokio::test]
async fn denied_small_bodies_are_discarded_and_the_connection_kept() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "");
    let (kib, mib) = (
        Bytes::from(vec![b'k'; 1024]),
        Bytes::from(vec![b'm'; 1 << 20]),
    );
    for protocol in Protocol::ALL {
        let who = format!("poster {protocol:?}");
        let headers = [("x-client", who.as_str())];
        let mut conn = Kept::open(&proxy, protocol, &ca.ca_pem()).await;
        let first = conn.send("GET", "/hsts", &headers, Bytes::new()).await;
        assert_eq!(first.map(|r| r.status), Ok(200), "{protocol:?}");
        let started = Instant::now();
        for i in 0..5 {
            let reply = conn.send("POST", "/hsts", &headers, kib.clone()).await;
            let reply = reply.unwrap_or_else(|e| panic!("{protocol:?} POST {i}: {e}"));
            assert_eq!(reply.status, 429, "{protocol:?} POST {i}");
            assert_ne!(reply.header("connection"), Some("close"), "{protocol:?}");
        }
        let took = started.elapsed();
        assert!(
            !conn.is_closed(),
            "{protocol:?}: closed after the 1 KiB posts"
        );
        let big = conn.send("POST", "/hsts", &headers, mib.clone()).await;
        match protocol {
            Protocol::H1 | Protocol::H1Tls => {
                // The answer may be lost to the reset of the unread body; if it arrived, it
                // says the connection closes.
                if let Ok(reply) = &big {
                    assert_eq!(reply.status, 429, "{protocol:?}");
                    assert_eq!(reply.header("connection"), Some("close"), "{protocol:?}");
                }
                let after = conn.send("GET", "/hsts", &headers, Bytes::new()).await;
                assert!(
                    after.is_err(),
                    "{protocol:?}: kept after a 1 MiB body: {after:?}"
                );
            }
            Protocol::H2c | Protocol::H2Tls => {
                assert_eq!(big.map(|r| r.status), Ok(429), "{protocol:?}");
                let after = conn.send("POST", "/hsts", &headers, kib.clone()).await;
                assert_eq!(after.map(|r| r.status), Ok(429), "{protocol:?} after 1 MiB");
            }
        }
        println!("{protocol:?}: 1 GET + 5 POSTs of 1 KiB on one connection, 429s in {took:?}");
    }
    assert_eq!(up.hits(), 4, "only the GETs reach the upstream");
}

/// The raw bytes of a POST to `/hsts` as client `who`: head, then `body` framed as given.
fn post_head(who: &str, framing: &str) -> String {
    format!("POST /hsts HTTP/1.1\r\nHost: localhost\r\nX-Client: {who}\r\n{framing}\r\n")
}

/// Read one response (head and `Content-Length` body) from `s`; its status.
fn read_one(s: &mut TcpStream, pending: &mut Vec<u8>) -> u16 {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let len: usize = (head.lines())
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if pending.len() >= end + 4 + len {
                pending.drain(..end + 4 + len);
                return head[9..12].parse().unwrap();
            }
        }
        let n = s.read(&mut buf).expect("read response");
        assert!(n > 0, "closed before a whole response");
        pending.extend_from_slice(&buf[..n]);
    }
}

/// A chunked body that ends within the bound is read and dropped like a sized one: a GET
/// written right behind it on the same connection is answered.
#[tokio::test]
async fn a_small_chunked_body_is_discarded_too() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "");
    let mut s = TcpStream::connect(proxy.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut pending, who) = (Vec::new(), "chunked");
    let get = format!("GET /hsts HTTP/1.1\r\nHost: localhost\r\nX-Client: {who}\r\n\r\n");
    s.write_all(get.as_bytes()).unwrap();
    assert_eq!(read_one(&mut s, &mut pending), 200);
    let mut post = post_head(who, "Transfer-Encoding: chunked\r\n");
    post.push_str("200\r\n");
    post.push_str(&"c".repeat(0x200));
    post.push_str("\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n");
    s.write_all(post.as_bytes()).unwrap();
    assert_eq!(read_one(&mut s, &mut pending), 429);
    s.write_all(get.as_bytes()).unwrap();
    assert_eq!(read_one(&mut s, &mut pending), 429);
}

/// A body that stops halfway: the 429 goes out at once (before the body is in), and the
/// connection is closed when the discard time (5 s) runs out.
#[tokio::test]
async fn a_stalled_body_is_answered_at_once_and_closed_after_the_discard_time() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "");
    let mut s = TcpStream::connect(proxy.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut pending = Vec::new();
    let get = "GET /hsts HTTP/1.1\r\nHost: localhost\r\nX-Client: slow\r\n\r\n";
    s.write_all(get.as_bytes()).unwrap();
    assert_eq!(read_one(&mut s, &mut pending), 200);
    let sent = Instant::now();
    let post = post_head("slow", "Content-Length: 1024\r\n") + &"s".repeat(512);
    s.write_all(post.as_bytes()).unwrap();
    assert_eq!(read_one(&mut s, &mut pending), 429);
    let answered = sent.elapsed();
    assert!(answered < Duration::from_secs(2), "429 after {answered:?}");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let closed = sent.elapsed();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    assert!(
        (Duration::from_millis(4500)..Duration::from_secs(8)).contains(&closed),
        "closed after {closed:?}"
    );
    println!("stalled 1 KiB body: 429 after {answered:?}, closed after {closed:?}");
}

#[test]
fn bad_answer_keys_are_refused_with_file_line_and_key() {
    let head = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [upstreams.app]\nservers = [\"127.0.0.1:3\"]\n[[routes]]\nname = \"r\"\n\
                upstream = \"app\"\n";
    let key = |name: &str| format!("routes[0].response_headers.{name}");
    for (field, message) in [
        ("\"Content-Length\" = \"5\"", "frames the body"),
        ("\"Transfer-Encoding\" = \"chunked\"", "frames the body"),
        ("Connection = \"close\"", "hop-by-hop"),
        ("Upgrade = \"h2c\"", "hop-by-hop"),
        ("Server = \"x\"", "server.server_header"),
        ("\"Bad Name\" = \"x\"", "not a field name"),
        ("X-A = \"a\\u0001b\"", "control characters"),
    ] {
        let name = field.split(" = ").next().unwrap().trim_matches('"');
        let text = format!("{head}[routes.response_headers]\n{field}\n");
        assert_invalid(&text, &key(name), 10, message);
    }
    let twice = format!("{head}[routes.response_headers]\nX-A = \"1\"\nx-a = \"2\"\n");
    assert_invalid(&twice, &key("x-a"), 11, "given twice");
    let control = head.replace(
        "admin_listen = \"127.0.0.1:2\"\n",
        "admin_listen = \"127.0.0.1:2\"\nserver_header = \"a\\nb\"\n",
    );
    assert_invalid(&control, "server.server_header", 4, "control characters");
}

/// On HTTP/2 a denial ends only its stream: the unsent rest of the body is refused with
/// `RST_STREAM(NO_ERROR)` (RFC 9113 §8.1: "send the rest later" is not wanted), and the
/// connection serves the next stream.
#[tokio::test]
async fn an_h2_denial_resets_only_its_stream_with_no_error() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "");
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let driver = tokio::spawn(conn);
    let url = format!("http://{}/hsts", proxy.addr());
    let request = |method: &str| {
        let builder = http::Request::builder().method(method).uri(&url);
        builder.header("x-client", "h2 stream").body(()).unwrap()
    };
    let mut client = client.ready().await.unwrap();
    let (first, _) = client.send_request(request("GET"), true).unwrap();
    assert_eq!(first.await.unwrap().status(), 200);
    // 1 KiB of a body that never ends: the answer must not wait for it.
    let mut client = client.ready().await.unwrap();
    let (response, mut body) = client.send_request(request("POST"), false).unwrap();
    body.send_data(Bytes::from(vec![b'k'; 1024]), false)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("no 429 within 5 s")
        .unwrap();
    assert_eq!(response.status(), 429);
    let reset = std::future::poll_fn(|cx| body.poll_reset(cx));
    let reason = tokio::time::timeout(Duration::from_secs(5), reset)
        .await
        .expect("the stream was not reset");
    assert_eq!(reason.map_err(|e| e.to_string()), Ok(h2::Reason::NO_ERROR));
    let mut client = client.ready().await.expect("connection still open");
    let (next, _) = client.send_request(request("GET"), true).unwrap();
    assert_eq!(next.await.unwrap().status(), 429);
    driver.abort();
}
