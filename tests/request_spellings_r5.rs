//! Issue 52 row 6, row 18 and the quota-feature notes, through the real binary over HTTP/1.1,
//! h2c, and HTTP/1.1 and HTTP/2 over TLS, each request on a connection of its own:
//!
//! - a method override is read as frameworks read it: on any method, `_method` (and
//!   `_method_override`, `__method_override__`) percent-decoded, the header fields under their
//!   CGI spelling (`X_HTTP_METHOD_OVERRIDE`); overrides naming two methods are `400`;
//! - the cost field is read under every spelling its key headers are (`X_Token_Estimate`), two
//!   spellings are `400`, and a refused cost's problem names the field and the figures;
//! - `path_prefix = "/api/"` also takes the bare `/api` (and `/api?page=2`);
//! - a cost limit's policy item names its unit (`slidegate-unit="cost"`) and its `t` is at most
//!   one resolution past `w`;
//! - `-T` prints the database of a one-Redis `url`.

mod common;

use common::config::limited;
use common::http::Reply;
use common::kept::Kept;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// One request on a fresh connection, as written.
async fn sent(
    proxy: &Proxy,
    (protocol, ca): (Protocol, &TestCa),
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let reply = conn.send(method, path, headers, Default::default()).await;
    reply.unwrap_or_else(|e| panic!("{protocol:?} {method} {path}: {e}"))
}

fn start(config: &ConfigBuilder, ca: &TestCa) -> Proxy {
    let mut options = tls_options(ca, "h2c = true");
    // The reason of every 400 in the log, should a case fail.
    (options.env).push(("RUST_LOG".into(), "info,slidegate=debug".into()));
    let proxy = Proxy::start_with(&config.build(), options);
    common::admin::wait_readyz(&proxy, 200, std::time::Duration::from_secs(10));
    proxy
}

/// A request that names an override: (sent method, header fields, query).
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Overrides an app reads as the limited method, each sent by a client that has used up its
/// limit with the real method.
const OVERRIDDEN: [Case; 9] = [
    ("POST", &[], "?_method=DEL%45TE"),
    ("POST", &[], "?a=1&_m%65thod=delete"),
    ("POST", &[], "?__METHOD_OVERRIDE__=DELETE"),
    ("PUT", &[], "?_method_override=%64elete"),
    ("POST", &[("X_HTTP_METHOD_OVERRIDE", "DELETE")], ""),
    ("GET", &[("X-HTTP-Method-Override", "DELETE")], ""),
    ("PUT", &[("x_method_override", "delete")], ""),
    ("GET", &[("X-Http_Method", "Delete")], ""),
    ("PATCH", &[("x-method-override", "DELETE, delete")], ""),
];

/// Overrides naming two methods: no one route is right (Express takes the first item, Rails
/// and Flask none, Symfony refuses).
const AMBIGUOUS: [Case; 4] = [
    ("POST", &[("X-HTTP-Method-Override", "DELETE, GET")], ""),
    ("GET", &[("X_HTTP_METHOD_OVERRIDE", "GET,DELETE")], ""),
    ("POST", &[("x-http-method", "PUT")], "?_method=DELETE"),
    ("PUT", &[], "?_method=DELETE&_method=PATCH"),
];

#[tokio::test]
async fn method_overrides_are_read_as_frameworks_read_them() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let route = format!(
        "{}\nkey = \"header:X-Client\"\nmethods = [\"DELETE\"]",
        limited("/items/", 2, "1h")
    );
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("del", &route)
        .route("default", "path_prefix = \"/\"");
    let proxy = start(&config, &ca);
    let mut forwarded = 0;
    for protocol in Protocol::ALL {
        let via = (protocol, &ca);
        for (i, (method, fields, query)) in OVERRIDDEN.iter().enumerate() {
            let who = format!("{protocol:?}-{i}");
            let client = ("x-client", who.as_str());
            for _ in 0..2 {
                let real = sent(&proxy, via, "DELETE", "/items/7", &[client]).await;
                assert_eq!(real.status, 200, "{who}");
            }
            forwarded += 2;
            let mut headers = vec![client];
            headers.extend_from_slice(fields);
            let path = format!("/items/7{query}");
            let got = sent(&proxy, via, method, &path, &headers).await;
            assert_eq!(got.status, 429, "{who}: {method} {path} {fields:?}");
        }
        for (method, fields, query) in AMBIGUOUS {
            let mut headers = vec![("x-client", "fresh")];
            headers.extend_from_slice(fields);
            let path = format!("/items/7{query}");
            let got = sent(&proxy, via, method, &path, &headers).await;
            assert_eq!(got.status, 400, "{protocol:?}: {method} {path} {fields:?}");
            assert!(got.body.contains("more than one method"), "{}", got.body);
        }
        // Not the DELETE route's: no override, one naming the sent method, or no method.
        for (method, fields) in [
            ("POST", &[][..]),
            ("GET", &[("X-HTTP-Method-Override", "GET")]),
            ("GET", &[("X-HTTP-Method-Override", "DE LETE")]),
            ("GET", &[("X-HTTP-Method-Overrides", "DELETE")]),
        ] {
            let mut headers = vec![("x-client", "fresh")];
            headers.extend_from_slice(fields);
            let got = sent(&proxy, via, method, "/items/7", &headers).await;
            assert_eq!(got.status, 200, "{protocol:?}: {method} {fields:?}");
            forwarded += 1;
        }
    }
    assert_eq!(up.hits(), forwarded);
}
