//! Edge, round 3 (issue 18), the request side, through the real binary: HTTP/2's `:authority`
//! routes like `Host`, pipelined requests are each answered and counted, IPv4 peers of a
//! dual-stack listener are IPv4, URL-rebuilding headers pass only from trusted proxies, a 101
//! that names no asked-for protocol is a 502 and opens no tunnel, a repeated key header is a
//! 400, and IPv6 clients can be keyed by prefix.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::proxy::{exchange, send, ConfigBuilder, Proxy, ProxyOptions};
use common::upstream::Upstream;

/// A limited `admin.example.com` host route (2 an hour per client) and an unlimited catch-all.
fn host_route_proxy(up: &Upstream, options: ProxyOptions) -> Proxy {
    Proxy::start_with(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "admin",
                "host = \"admin.example.com\"\nlimits = [{ requests = 2, window = \"1h\" }]",
            )
            .route("all", "path_prefix = \"/\"")
            .build(),
        options,
    )
}

/// Row 1: an h2c client sends `:authority` and no `Host`; the host route takes it, counts it
/// in the same bucket as HTTP/1.1 `Host` requests, and the upstream gets the authority as
/// `Host`.
#[tokio::test]
async fn h2_authority_routes_like_host() {
    let up = Upstream::start();
    let options = ProxyOptions {
        server_extra: "h2c = true".into(),
        ..ProxyOptions::default()
    };
    let proxy = host_route_proxy(&up, options);
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .resolve("admin.example.com", proxy.addr())
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = format!("http://admin.example.com:{}/x", proxy.addr().port());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let resp = h2.get(&url).send().await.expect("h2c request");
        assert_eq!(resp.version(), reqwest::Version::HTTP_2);
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429], "h2c on a 2-an-hour host route");
    let seen = up.last_request().expect("forwarded");
    let host = format!("admin.example.com:{}", proxy.addr().port());
    assert_eq!(
        seen.headers.get_all("host").iter().collect::<Vec<_>>(),
        [&host]
    );
    // The same bucket over HTTP/1.1 with `Host`: full.
    let h1 = send(proxy.addr(), "GET", "/x", &[("Host", "admin.example.com")]).await;
    assert_eq!(h1.status, 429);
    assert_eq!(up.hits(), 2);
}

/// Read everything until the proxy closes the connection (bounded by the read timeout).
fn read_all(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}

/// The status of every response in `text`, in order.
fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

/// Row 7: five requests in one write on a 2-a-minute route are all answered, in order, and
/// counted (RFC 9112 §9.3.2), as nginx does.
#[test]
fn pipelined_requests_are_answered_in_order_and_counted() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("login", &common::proxy::limited("/", 2, "1m"))
            .build(),
    );
    let mut burst = Vec::new();
    for i in 0..5 {
        let close = if i == 4 { "Connection: close\r\n" } else { "" };
        write!(burst, "GET /p{i} HTTP/1.1\r\nHost: a.test\r\n{close}\r\n").unwrap();
    }
    let mut s = TcpStream::connect(proxy.addr()).unwrap();
    s.write_all(&burst).unwrap();
    let text = read_all(&mut s);
    assert_eq!(statuses(&text), [200, 200, 429, 429, 429], "{text}");
    let targets: Vec<String> = up.heads().into_iter().map(|h| h.target).collect();
    assert_eq!(targets, ["/p0", "/p1"]);
}

/// Row 8: behind `listen = "[::]:<port>"` an IPv4 load balancer arrives as `::ffff:127.0.0.1`;
/// it is still inside `trusted_proxies = ["127.0.0.0/8"]`, so its `X-Forwarded-For` client is
/// the client (own bucket, `X-Real-IP`) and its `X-Forwarded-Proto` is kept.
#[tokio::test]
async fn dual_stack_ipv4_peers_are_ipv4() {
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::new()
            .trusted_proxies(&["127.0.0.0/8"])
            .upstream("app", up.addr())
            .route("all", &common::proxy::limited("/", 1, "1h"))
            .build(),
        ProxyOptions {
            dual_stack: true,
            ..ProxyOptions::default()
        },
    );
    let via_lb =
        |client: &'static str| [("X-Forwarded-For", client), ("X-Forwarded-Proto", "https")];
    let first = send(proxy.addr(), "GET", "/", &via_lb("203.0.113.9")).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let seen = up.last_request().expect("forwarded").headers;
    assert_eq!(seen["x-real-ip"], "203.0.113.9");
    assert_eq!(seen["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "https");
    assert_eq!(seen["forwarded"], "for=127.0.0.1;proto=http");
    // One bucket per client behind the balancer, not one for the balancer.
    let again = send(proxy.addr(), "GET", "/", &via_lb("203.0.113.9")).await;
    assert_eq!(again.status, 429);
    let other = send(proxy.addr(), "GET", "/", &via_lb("198.51.100.4")).await;
    assert_eq!(other.status, 200);
}

/// The URL-rebuilding headers a client may try, and one line each.
const URL_HEADERS: [(&str, &str); 6] = [
    ("X-Forwarded-Host", "evil.example"),
    ("X-Forwarded-Port", "443"),
    ("X-Forwarded-Prefix", "/evil"),
    ("X-Forwarded-Ssl", "on"),
    ("X-Original-URL", "/admin"),
    ("X-Rewrite-URL", "/admin"),
];

/// Row 9: from a client the URL-rebuilding headers are removed; from a trusted proxy they are
/// passed on as sent.
#[tokio::test]
async fn url_headers_pass_only_from_trusted_proxies() {
    let up = Upstream::start();
    for (trusted, kept) in [(&[][..], false), (&["127.0.0.0/8"][..], true)] {
        let proxy = Proxy::start(
            &ConfigBuilder::new()
                .trusted_proxies(trusted)
                .upstream("app", up.addr())
                .route("all", "")
                .build(),
        );
        let reply = send(proxy.addr(), "GET", "/x", &URL_HEADERS).await;
        assert_eq!(reply.status, 200);
        let seen = up.last_request().expect("forwarded").headers;
        for (name, value) in URL_HEADERS {
            let got = seen.get(name).map(|v| v.to_str().unwrap());
            let want = kept.then_some(value);
            assert_eq!(got, want, "{name} with trusted_proxies = {trusted:?}");
        }
    }
}

/// `Connection` naming a header the request carries (`Connection: close, X-Api-Key`) would
/// have Pingora strip that header from what the app gets, after the limiter keyed the request by
/// it: the app saw an anonymous request while the limiter counted a fresh key (8 x 200 past an
/// anonymous 429 in the audit). Only connection options stay in `Connection` now, so the key,
/// the cookie and the credentials reach the app as counted. And forwarding headers spelled with
/// `_` (`X_Forwarded_Host`, `X_Real_IP`), which CGI-style servers read as the real ones, never
/// reach the app, whoever sends them. HTTP/1.1 only: HTTP/2 refuses a `connection` field.
#[tokio::test]
async fn connection_cannot_hide_the_key_and_underscore_forwarding_headers_do_not_pass() {
    let up = Upstream::start();
    let route = "key = \"header:X-Api-Key\"\nlimits = [ { requests = 2, window = \"1m\" } ]";
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .trusted_proxies(&["127.0.0.0/8"])
            .upstream("app", up.addr())
            .route("api", route)
            .build(),
    );
    let mut statuses = Vec::new();
    for connection in [
        "close, X-Api-Key",
        "X-Api-Key, Cookie",
        "keep-alive, x-api-key",
    ] {
        let headers = [
            ("X-Api-Key", "k1"),
            ("Cookie", "sid=1"),
            ("Connection", connection),
        ];
        let reply = send(proxy.addr(), "GET", "/x", &headers).await;
        statuses.push(reply.status);
        if reply.status == 200 {
            let seen = up.last_request().expect("forwarded").headers;
            assert_eq!(
                seen.get("x-api-key").map(|v| v.to_str().unwrap()),
                Some("k1")
            );
            assert_eq!(
                seen.get("cookie").map(|v| v.to_str().unwrap()),
                Some("sid=1")
            );
        }
    }
    assert_eq!(
        statuses,
        [200, 200, 429],
        "one key, counted as the app saw it"
    );
    // A token naming a header Pingora protects, absent or not: no 400 (and no ERROR line).
    let headers = [
        ("X-Api-Key", "k3"),
        ("Connection", "close, X-Forwarded-For"),
    ];
    assert_eq!(send(proxy.addr(), "GET", "/x", &headers).await.status, 200);

    let forged = [
        ("X-Api-Key", "k2"),
        ("X_Forwarded_Host", "evil.example"),
        ("X_Forwarded_For", "6.6.6.6"),
        ("X_Real_IP", "6.6.6.6"),
        ("X_Forwarded_Proto", "https"),
        ("X_Original_URL", "/admin"),
        ("X-Forwarded_Prefix", "/evil"),
    ];
    // From a trusted proxy too: the real spellings are what a proxy sends.
    assert_eq!(send(proxy.addr(), "GET", "/x", &forged).await.status, 200);
    let seen = up.last_request().expect("forwarded").headers;
    for (name, _) in &forged[1..] {
        assert!(seen.get(*name).is_none(), "{name} reached the app");
    }
}

/// An upstream that answers every request head `101` with `upgrade` as its `Upgrade` line (or
/// none), then answers every later read with a `200 tunnel`: what an uncounted tunnel would
/// show.
struct FakeSwitch {
    addr: SocketAddr,
    heads: Arc<AtomicUsize>,
    tunnelled: Arc<AtomicUsize>,
}

impl FakeSwitch {
    fn start(upgrade: Option<&'static str>) -> FakeSwitch {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(AtomicUsize::new(0));
        let tunnelled = Arc::new(AtomicUsize::new(0));
        let (h, t) = (heads.clone(), tunnelled.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (h, t) = (h.clone(), t.clone());
                std::thread::spawn(move || switch_one(conn, upgrade, &h, &t));
            }
        });
        FakeSwitch {
            addr,
            heads,
            tunnelled,
        }
    }
}

fn switch_one(mut s: TcpStream, upgrade: Option<&str>, heads: &AtomicUsize, tunnel: &AtomicUsize) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    heads.fetch_add(1, Ordering::SeqCst);
    let upgrade = upgrade
        .map(|u| format!("Upgrade: {u}\r\n"))
        .unwrap_or_default();
    let head = format!("HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n{upgrade}\r\n");
    let _ = s.write_all(head.as_bytes());
    while let Ok(n @ 1..) = s.read(&mut buf) {
        tunnel.fetch_add(n, Ordering::SeqCst);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\ntunnel");
    }
}

/// Row 10: a `101` without the protocol the request asked for (none, or another one) is a
/// 502; the requests the client sends after it never reach the upstream uncounted.
#[test]
fn a_101_that_names_no_asked_protocol_is_502_and_no_tunnel() {
    for upgrade in [None, Some("h2c")] {
        let fake = FakeSwitch::start(upgrade);
        let proxy = Proxy::start(
            &ConfigBuilder::new()
                .upstream("app", fake.addr)
                .route("ws", &common::proxy::limited("/", 1, "1h"))
                .build(),
        );
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.write_all(
            b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .unwrap();
        let (status, text) = common::proxy::read_response(&mut s);
        assert_eq!(status, 502, "Upgrade {upgrade:?}: {text}");
        // Whatever the connection still does, later requests are not tunnelled.
        for i in 0..5 {
            let _ = write!(s, "GET /after{i} HTTP/1.1\r\nHost: a.test\r\n\r\n");
        }
        let rest = read_all(&mut s);
        assert!(!rest.contains("tunnel"), "Upgrade {upgrade:?}: {rest}");
        assert_eq!(fake.heads.load(Ordering::SeqCst), 1, "Upgrade {upgrade:?}");
        assert_eq!(
            fake.tunnelled.load(Ordering::SeqCst),
            0,
            "Upgrade {upgrade:?}"
        );
    }
}

/// Row 11: a route keyed by `X-Api-Key` refuses a request with two of them (400, as a
/// repeated `Host`) instead of counting the first while the app reads `a,b`.
#[tokio::test]
async fn a_repeated_key_header_is_400() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "api",
                "key = \"header:X-Api-Key\"\nlimits = [{ requests = 5, window = \"1h\" }]",
            )
            .build(),
    );
    let twice = [("X-Api-Key", "a"), ("X-Api-Key", "b")];
    let reply = send(proxy.addr(), "GET", "/", &twice).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(up.hits(), 0);
    let once = send(proxy.addr(), "GET", "/", &[("X-Api-Key", "a")]).await;
    assert_eq!(once.status, 200);
    assert_eq!(up.hits(), 1);
}

/// Row 13: with `ipv6_prefix = 64` every address of a /64 shares one bucket, the next /64 has
/// its own; `ipv4_prefix = 24` does the same for IPv4. (Clients named by a trusted proxy's
/// `X-Forwarded-For`: loopback has no /64 to send from.)
#[tokio::test]
async fn clients_are_keyed_by_prefix() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .trusted_proxies(&["127.0.0.0/8"])
            .client_ip("ipv6_prefix = 64\nipv4_prefix = 24")
            .upstream("app", up.addr())
            .route("all", &common::proxy::limited("/", 1, "1h"))
            .build(),
    );
    let mut got = Vec::new();
    for client in [
        "2001:db8:1:2::a",
        "2001:db8:1:2:ffff::b",
        "2001:db8:1:3::a",
        "198.51.100.1",
        "198.51.100.200",
        "198.51.101.1",
    ] {
        let reply = send(proxy.addr(), "GET", "/", &[("X-Forwarded-For", client)]).await;
        got.push((client, reply.status));
        // Logs and headers keep the address itself.
        if reply.status == 200 {
            let seen = up.last_request().expect("forwarded").headers;
            assert_eq!(seen["x-real-ip"], client);
        }
    }
    let want = [
        ("2001:db8:1:2::a", 200),
        ("2001:db8:1:2:ffff::b", 429),
        ("2001:db8:1:3::a", 200),
        ("198.51.100.1", 200),
        ("198.51.100.200", 429),
        ("198.51.101.1", 200),
    ];
    assert_eq!(got, want);
}

/// Row 13, config: a prefix longer than the address is refused, naming the key.
#[test]
fn a_prefix_past_the_address_is_a_config_error() {
    for (line, key) in [
        ("ipv6_prefix = 129", "client_ip.ipv6_prefix"),
        ("ipv4_prefix = 33", "client_ip.ipv4_prefix"),
    ] {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n{}",
            ConfigBuilder::new()
                .client_ip(line)
                .upstream("app", "127.0.0.1:9")
                .route("all", "")
                .build()
        );
        let err = slidegate::config::Config::from_toml(std::path::Path::new("t.toml"), &toml)
            .expect_err(line)
            .to_string();
        assert!(err.contains(key), "{err}");
    }
}

/// Rows 1 and 7 leave plain HTTP/1.1 alone: a Host request to the host route still counts.
#[test]
fn h1_host_route_still_counts() {
    let up = Upstream::start();
    let proxy = host_route_proxy(&up, ProxyOptions::default());
    let head = b"GET /y HTTP/1.1\r\nHost: Admin.Example.com\r\nConnection: close\r\n\r\n";
    let got: Vec<u16> = (0..3).map(|_| exchange(proxy.addr(), head).0).collect();
    assert_eq!(got, [200, 200, 429]);
}

/// An upstream's hop-by-hop response fields (its keep-alive terms, `Proxy-Connection`, `TE`,
/// `Upgrade` on a `200`, and whatever its `Connection` names) stay behind, on every client
/// protocol; the rest of its head goes on. Before, a client saw them all (the audit).
#[tokio::test]
async fn an_upstreams_hop_by_hop_fields_stay_behind() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut head = Vec::new();
                // One response per request head, on a kept connection.
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    head.extend_from_slice(&buf[..n]);
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        head.drain(..end + 4);
                        let reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
                                     Connection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\n\
                                     Proxy-Connection: keep-alive\r\nTE: trailers\r\n\
                                     Upgrade: h2c\r\nX-Secret: s\r\nX-Kept: k\r\n\r\nok";
                        if conn.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let ca = common::tls::TestCa::new("ca");
    let config = ConfigBuilder::new()
        .upstream("app", addr)
        .route("all", "")
        .build();
    let proxy = Proxy::start_with(&config, common::tls::tls_options(&ca, "h2c = true"));
    for protocol in common::tls::Protocol::ALL {
        let mut conn = common::kept::Kept::open(&proxy, protocol, &ca.ca_pem()).await;
        let reply = conn.send("GET", "/x", &[], Default::default()).await;
        let reply = reply.unwrap_or_else(|e| panic!("{protocol:?}: {e}"));
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (200, "ok"),
            "{protocol:?}"
        );
        for gone in [
            "keep-alive",
            "proxy-connection",
            "te",
            "upgrade",
            "x-secret",
        ] {
            assert!(
                reply.headers.get(gone).is_none(),
                "{protocol:?}: {gone} passed"
            );
        }
        assert_eq!(reply.headers.get("x-kept").unwrap(), "k", "{protocol:?}");
    }
}
