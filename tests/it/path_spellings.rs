//! Paths that apps read apart never reach a limited route's handler unlimited, through the
//! real binary on every protocol (HTTP/1.1, h2c, HTTP/1.1 and HTTP/2 over TLS), each request
//! on a connection of its own sent as written (no client-side URL cleanup):
//!
//! - a dot segment (`/x/../login`, `/api/%2e%2e`, Tomcat's `/x/..;/login`) or a backslash
//!   (`/x%5C..%5Clogin`; raw over HTTP/1.1) is `400`, counted nowhere and never forwarded:
//!   Node's `URL` and servlet containers resolve them, Flask and Express serve them as written;
//! - `;parameters` of a segment are dropped for matching, as servlet containers drop them:
//!   `/;a/login` and `/login;jsessionid=1` are the login route's;
//! - a request whose override (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`,
//!   `?_method=`) names a method is the route of that method too (Rails, Laravel, Symfony,
//!   Flask and Express's `method-override` serve it as that method).

use crate::common;

use common::config::limited;
use common::http::exchange;
use common::kept::Kept;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// Paths that must be refused, whatever the protocol.
const REFUSED: [&str; 9] = [
    "/x/../login",
    "/./login",
    "/x/%2e%2E/login",
    "/x/..;/login",
    "/x/..%3B/login",
    "/api/..",
    "/api/v1/../..",
    "/x%5C..%5Clogin",
    "/api/%2e",
];

/// Paths the login route takes: `;parameters` dropped for matching.
const LOGIN: [&str; 3] = ["/;a/login", "/login;jsessionid=1", "/login%3Bx"];

async fn status(proxy: &Proxy, protocol: Protocol, ca: &TestCa, path: &str, who: &str) -> u16 {
    sent(proxy, (protocol, ca), "GET", path, &[("x-client", who)]).await
}

async fn sent(
    proxy: &Proxy,
    (protocol, ca): (Protocol, &TestCa),
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let reply = conn.send(method, path, headers, Default::default()).await;
    reply
        .unwrap_or_else(|e| panic!("{protocol:?} {path}: {e}"))
        .status
}

#[tokio::test]
async fn dot_segments_and_backslashes_are_refused_and_parameters_dropped() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let route = |path: &str| format!("{}\nkey = \"header:X-Client\"", limited(path, 1, "1h"));
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("login", &route("/login"))
        .route("api", &route("/api/"))
        .route(
            "del",
            &format!("{}\nmethods = [\"DELETE\"]", route("/items/")),
        )
        .route("default", "path_prefix = \"/\"")
        .build();
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    let mut forwarded = 0;
    for protocol in Protocol::ALL {
        let who = format!("{protocol:?}");
        assert_eq!(status(&proxy, protocol, &ca, "/login", &who).await, 200);
        assert_eq!(status(&proxy, protocol, &ca, "/api/v1", &who).await, 200);
        forwarded += 2;
        for path in REFUSED {
            let got = status(&proxy, protocol, &ca, path, &who).await;
            assert_eq!(got, 400, "{protocol:?} {path}");
        }
        for path in LOGIN {
            let got = status(&proxy, protocol, &ca, path, &who).await;
            assert_eq!(got, 429, "{protocol:?} {path} is the login route's");
        }
        // Method overrides: a POST read as a DELETE is the DELETE route's (limit 1).
        let via = (protocol, &ca);
        let client = ("x-client", who.as_str());
        assert_eq!(
            sent(&proxy, via, "DELETE", "/items/1", &[client]).await,
            200
        );
        for (field, value) in [
            ("x-http-method-override", "DELETE"),
            ("x-http-method", "delete"),
            ("x-method-override", "Delete"),
        ] {
            let got = sent(&proxy, via, "POST", "/items/1", &[client, (field, value)]).await;
            assert_eq!(got, 429, "{protocol:?} {field}");
        }
        let q = sent(&proxy, via, "POST", "/items/1?_method=DELETE", &[client]).await;
        assert_eq!(q, 429, "{protocol:?} _method");
        // A plain POST is not the DELETE route's; an override on a GET is (Flask and Slim
        // override any method: tests/it/request_spellings_r5.rs has the rest).
        let plain = sent(&proxy, via, "POST", "/items/1", &[client]).await;
        let get = [client, ("x-http-method-override", "DELETE")];
        let on_get = sent(&proxy, via, "GET", "/items/1", &get).await;
        assert_eq!((plain, on_get), (200, 429), "{protocol:?}");
        forwarded += 2;
        // Not dot segments: served by the catch-all.
        for path in ["/.well-known/x", "/a/...", "/a/..b"] {
            assert_eq!(
                status(&proxy, protocol, &ca, path, &who).await,
                200,
                "{path}"
            );
            forwarded += 1;
        }
    }
    // A raw backslash (HTTP/1.1 lets one through; clients never send it).
    for path in ["/x\\..\\login", "/login\\"] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-Client: raw\r\n\r\n");
        let (code, text) = exchange(proxy.addr(), head.as_bytes());
        assert_eq!(code, 400, "{path}: {text}");
    }
    assert_eq!(up.hits(), forwarded);
    assert!(proxy.counter("slidegate_bad_requests_total") >= 4 * REFUSED.len() as u64 + 2);
}

/// Under a burst of 300 h2c connections × 10 streams (4000 requests): a dot-segment path is
/// refused every time and never forwarded, and a `;parameter` spelling of the limited route
/// admits exactly its limit.
#[test]
fn the_path_rules_hold_under_an_h2_burst() {
    use common::load::{h2load, Burst};
    let up = Upstream::start();
    let route = format!("{}\nkey = \"header:X-K\"", limited("/login", 5, "1h"));
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("login", &route)
        .route("default", "path_prefix = \"/\"")
        .build();
    let opts = common::proxy::ProxyOptions {
        server_extra: "h2c = true".into(),
        ..Default::default()
    };
    let proxy = Proxy::start_with(&config, opts);
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    let burst = |path: &str| Burst {
        path: path.into(),
        ..Burst::keyed(300, "burst")
    };
    let dotted = h2load(proxy.addr(), &burst("/x/%2e%2e/login"));
    assert_eq!(
        (dotted.s4xx, dotted.s2xx, dotted.failed),
        (4000, 0, 0),
        "{dotted:?}"
    );
    assert_eq!(up.hits(), 0);
    let params = h2load(proxy.addr(), &burst("/;a/login;v=1"));
    assert_eq!(
        (params.s2xx, params.s4xx, params.failed),
        (5, 3995, 0),
        "{params:?}"
    );
    assert_eq!(up.hits(), 5);
}
