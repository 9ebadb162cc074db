//! Protocol details seen with real apps, through the real binary: the forwarding headers the
//! upstream gets (forged ones replaced), a slow `Content-Length` body streamed as it arrives,
//! close-delimited bodies for HTTP/1.0 clients, and a websocket tunnel counted once.

use crate::common;

use std::time::Duration;

use common::proxy::{send, ConfigBuilder, Proxy, ProxyOptions};
use common::tls::{Protocol, TestCa};
use common::upstream::{Upstream, CHUNKED_HEADER, GATED_HEADER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn header(req: &common::upstream::SeenRequest, name: &str) -> Vec<String> {
    req.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

const FORGED: [(&str, &str); 3] = [
    ("X-Forwarded-Proto", "https"),
    ("X-Real-IP", "6.6.6.6"),
    ("Forwarded", "for=6.6.6.6;proto=https"),
];

/// An upstream and, in front of it, a proxy with one unlimited route on its plain and its TLS
/// listener (certificate for `localhost`, signed by the returned CA).
fn proxy_with_tls() -> (TestCa, Upstream, Proxy) {
    let ca = TestCa::new("ca");
    let leaf = ca.issue("proxy", &["localhost"]);
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::unlimited(up.addr()),
        ProxyOptions {
            tls: Some((leaf.cert, leaf.key)),
            ..ProxyOptions::default()
        },
    );
    (ca, up, proxy)
}

/// A client that is not a trusted proxy cannot tell the app it came over https or from
/// another address: on the plain listener the app sees `http` and the socket peer, on the TLS
/// listener `https`, whatever the client sent.
#[tokio::test]
async fn forged_forwarding_headers_are_replaced_on_both_listeners() {
    let (ca, up, proxy) = proxy_with_tls();
    // Plain HTTP/1.1.
    let r = send(proxy.addr(), "GET", "/", &FORGED).await;
    assert_eq!(r.status, 200);
    let seen = up.last_request().unwrap();
    assert_eq!(header(&seen, "x-forwarded-proto"), ["http"]);
    assert_eq!(header(&seen, "x-real-ip"), ["127.0.0.1"]);
    assert_eq!(header(&seen, "forwarded"), ["for=127.0.0.1;proto=http"]);
    assert_eq!(header(&seen, "x-forwarded-for"), ["127.0.0.1"]);

    // HTTP/2 over TLS, with the same forgeries.
    let client = Protocol::H2Tls.client(&ca.ca_pem());
    let mut req = client.get(format!("https://localhost:{}/", proxy.tls_addr().port()));
    for (k, v) in FORGED {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let seen = up.last_request().unwrap();
    assert_eq!(header(&seen, "x-forwarded-proto"), ["https"]);
    assert_eq!(header(&seen, "x-real-ip"), ["127.0.0.1"]);
    assert_eq!(header(&seen, "forwarded"), ["for=127.0.0.1;proto=https"]);
}

/// Behind a trusted proxy (here: loopback) the client's scheme and address come from that
/// proxy's headers: `X-Forwarded-Proto` is kept, `X-Real-IP` is the client it names in
/// `X-Forwarded-For`, and our hop is appended to its `Forwarded`.
#[tokio::test]
async fn a_trusted_proxy_keeps_its_scheme_and_forwarded_chain() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .trusted_proxies(&["127.0.0.1/32"])
            .upstream("app", up.addr())
            .route("all", "")
            .build(),
    );
    let r = send(
        proxy.addr(),
        "GET",
        "/",
        &[
            ("X-Forwarded-For", "203.0.113.9"),
            ("X-Forwarded-Proto", "https"),
            ("X-Real-IP", "6.6.6.6"),
            ("Forwarded", "for=203.0.113.9;proto=https"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let seen = up.last_request().unwrap();
    assert_eq!(header(&seen, "x-forwarded-proto"), ["https"]);
    assert_eq!(header(&seen, "x-real-ip"), ["203.0.113.9"]);
    assert_eq!(
        header(&seen, "forwarded"),
        ["for=203.0.113.9;proto=https, for=127.0.0.1;proto=http"]
    );
    assert_eq!(header(&seen, "x-forwarded-for"), ["203.0.113.9, 127.0.0.1"]);
}

/// Read from `stream` until `buf` contains `needle`, at most 10 s.
async fn read_until(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, needle: &[u8]) {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while !buf.windows(needle.len()).any(|w| w == needle) {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(
                n > 0,
                "connection closed; got {:?}",
                String::from_utf8_lossy(buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "no {:?} within 10 s; got {:?}",
        String::from_utf8_lossy(needle),
        String::from_utf8_lossy(buf)
    );
}

/// The upstream sends `Content-Length: 2`, the first byte at once, and the second only after
/// the test has seen the first one through the proxy: a proxy that holds a Content-Length
/// response until it is complete never shows the first byte and fails here (no timing
/// involved). Checked over HTTP/1.1, and over HTTP/1.1 and HTTP/2 with TLS.
#[tokio::test]
async fn a_slow_content_length_body_streams_as_it_arrives() {
    let (ca, up, proxy) = proxy_with_tls();
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(format!("GET /drip HTTP/1.1\r\nHost: x\r\n{GATED_HEADER}: 1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    read_until(&mut stream, &mut buf, b"\r\n\r\na").await;
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(head.contains("content-length: 2"), "{head}");
    up.release();
    read_until(&mut stream, &mut buf, b"\r\n\r\nab").await;

    // Over TLS, HTTP/1.1 and HTTP/2: the first byte arrives before the upstream finishes.
    for protocol in [Protocol::H1Tls, Protocol::H2Tls] {
        let client = protocol.client(&ca.ca_pem());
        let url = format!("https://localhost:{}/drip", proxy.tls_addr().port());
        let mut resp = client
            .get(url)
            .header(GATED_HEADER, "1")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), protocol.version());
        let first = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .unwrap_or_else(|_| panic!("first byte not streamed over {protocol:?} within 10 s"))
            .unwrap()
            .expect("a body chunk");
        assert_eq!(&first[..], b"a");
        up.release();
        let rest = resp.bytes().await.unwrap();
        assert_eq!(&rest[..], b"b");
    }
}

/// An HTTP/1.0 client cannot parse chunked framing: a body the upstream sends without a length
/// reaches it close-delimited (no `Transfer-Encoding`, connection closed at the end), while an
/// HTTP/1.1 client still gets it chunked.
#[tokio::test]
async fn http10_clients_get_close_delimited_bodies() {
    let up = Upstream::start();
    let proxy = Proxy::start(&ConfigBuilder::unlimited(up.addr()));
    let addr = proxy.addr();
    let exchange = |version: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let close = if version == "HTTP/1.1" {
            "Connection: close\r\n"
        } else {
            ""
        };
        stream
            .write_all(
                format!("GET /stream {version}\r\nHost: x\r\n{close}{CHUNKED_HEADER}: 1\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
            .await
            .expect("the proxy must close the connection after the body")
            .unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("a response");
        (head.to_ascii_lowercase(), body.to_string())
    };
    let (head, body) = exchange("HTTP/1.0").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert_eq!(body, "hello world");

    let (head, body) = exchange("HTTP/1.1").await;
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(
        body.contains("hello ") && body.ends_with("0\r\n\r\n"),
        "{body:?}"
    );
}

/// A websocket upgrade is limited and counted as one request: the 101 carries the rate-limit
/// fields, any number of messages then flow through the tunnel without being counted, and the
/// next upgrade over the limit gets 429.
#[tokio::test]
async fn a_websocket_tunnel_is_counted_once_at_the_upgrade() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("ws", "limits = [ { requests = 1, window = \"1m\" } ]")
            .build(),
    );
    let upgrade = "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                   Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    stream.write_all(upgrade.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    read_until(&mut stream, &mut buf, b"\r\n\r\n").await;
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("ratelimit: \"ws-60s\";r=0"), "{head}");
    for i in 0..20 {
        let msg = format!("message {i};");
        stream.write_all(msg.as_bytes()).await.unwrap();
        buf.clear();
        read_until(&mut stream, &mut buf, msg.as_bytes()).await;
    }
    assert_eq!(proxy.decisions("ws", "allowed"), 1);
    assert_eq!(proxy.decisions("ws", "denied"), 0);

    let second = send(
        proxy.addr(),
        "GET",
        "/ws",
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
    )
    .await;
    assert_eq!(second.status, 429, "{second:?}");
    assert_eq!(proxy.decisions("ws", "denied"), 1);
    assert_eq!(up.hits(), 1);
}
