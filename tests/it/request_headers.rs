//! `server.forwarded_headers` and `server.request_id` through the real binary, over HTTP/1.1,
//! HTTP/1.1 over TLS, h2c and HTTP/2 over TLS: a forwarding header outside the set never
//! reaches the upstream (a client's forgery is removed, not passed on); `request_id =
//! "upstream"` sends an id upstream but none back; `"off"` leaves the client's field alone;
//! a reload swaps both.

use crate::common;

use std::time::Duration;

use common::arrivals::until_metric;
use common::fetch::url;
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// What a client that is not a trusted proxy sends to pass for another client.
const FORGED: [(&str, &str); 5] = [
    ("x-forwarded-for", "6.6.6.6"),
    ("x-forwarded-proto", "https"),
    ("x-real-ip", "6.6.6.6"),
    ("forwarded", "for=6.6.6.6"),
    ("x-request-id", "not kept"),
];

/// One route, `/app`: anything else is slidegate's own 404.
fn config(up: &Upstream) -> String {
    ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("app", "path_prefix = \"/app\"")
        .build()
}

fn start(up: &Upstream, ca: &TestCa, server: &str) -> Proxy {
    let config = config(up);
    Proxy::start_with(&config, tls_options(ca, &format!("h2c = true\n{server}")))
}

/// The values of `name` the upstream saw on its last request.
fn upstream_saw(up: &Upstream, name: &str) -> Vec<String> {
    let last = up.last_request().expect("a request reached the upstream");
    (last.headers.get_all(name).iter())
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// A forged GET over `protocol`: the status and the `X-Request-Id` of the answer.
async fn forged_get(
    proxy: &Proxy,
    ca: &TestCa,
    protocol: Protocol,
    path: &str,
) -> (u16, Option<String>) {
    let mut req = protocol
        .client(&ca.ca_pem())
        .get(url(proxy, protocol, path));
    for (k, v) in FORGED {
        req = req.header(k, v);
    }
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{protocol:?}: {e}"));
    assert_eq!(resp.version(), protocol.version(), "{protocol:?}");
    let id = (resp.headers().get("x-request-id")).map(|v| v.to_str().unwrap().to_string());
    (resp.status().as_u16(), id)
}

#[tokio::test]
async fn only_listed_forwarding_headers_reach_the_upstream_and_ids_stay_upstream() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(
        &up,
        &ca,
        "forwarded_headers = [\"X-Forwarded-For\"]\nrequest_id = \"upstream\"",
    );
    for protocol in Protocol::ALL {
        assert_eq!(
            forged_get(&proxy, &ca, protocol, "/app").await,
            (200, None),
            "{protocol:?}"
        );
        assert_eq!(
            upstream_saw(&up, "x-forwarded-for"),
            ["6.6.6.6, 127.0.0.1"],
            "{protocol:?}"
        );
        for name in ["x-forwarded-proto", "x-real-ip", "forwarded"] {
            assert!(
                upstream_saw(&up, name).is_empty(),
                "{protocol:?}: {name} passed on"
            );
        }
        // The client's id has a space: replaced by a generated one, sent upstream only.
        let ids = upstream_saw(&up, "x-request-id");
        assert!(
            ids.len() == 1 && ids[0].len() == 32,
            "{protocol:?}: {ids:?}"
        );
        assert_eq!(
            forged_get(&proxy, &ca, protocol, "/nothing").await,
            (404, None)
        );
    }

    // A reload back to the defaults: all four set, the id returned.
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));
    let server: String = (proxy.server_section().lines())
        .filter(|l| !l.starts_with("forwarded_headers") && !l.starts_with("request_id"))
        .map(|l| format!("{l}\n"))
        .collect();
    proxy.write_config_text(&format!("{server}{}", config(&up)));
    proxy.signal(libc::SIGHUP).unwrap();
    let ok = r#"slidegate_config_reloads_total{result="ok"}"#;
    until_metric(&proxy, ok, 1.0, Duration::from_secs(10)).await;
    for protocol in Protocol::ALL {
        let (status, id) = forged_get(&proxy, &ca, protocol, "/app").await;
        assert_eq!(status, 200, "{protocol:?}");
        assert_eq!(id.map(|i| i.len()), Some(32), "{protocol:?}");
        assert_eq!(
            upstream_saw(&up, "x-real-ip"),
            ["127.0.0.1"],
            "{protocol:?}"
        );
        assert_eq!(upstream_saw(&up, "x-forwarded-for"), ["6.6.6.6, 127.0.0.1"]);
        let proto = if protocol.tls() { "https" } else { "http" };
        assert_eq!(
            upstream_saw(&up, "x-forwarded-proto"),
            [proto],
            "{protocol:?}"
        );
        assert_eq!(upstream_saw(&up, "forwarded").len(), 1, "{protocol:?}");
    }
}

#[tokio::test]
async fn with_none_listed_and_ids_off_nothing_is_added_and_forgeries_are_removed() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = start(&up, &ca, "forwarded_headers = []\nrequest_id = \"off\"");
    for protocol in Protocol::ALL {
        assert_eq!(
            forged_get(&proxy, &ca, protocol, "/app").await,
            (200, None),
            "{protocol:?}"
        );
        for (name, _) in &FORGED[..4] {
            assert!(
                upstream_saw(&up, name).is_empty(),
                "{protocol:?}: {name} passed on"
            );
        }
        // Off: slidegate neither checks nor replaces the client's field.
        assert_eq!(
            upstream_saw(&up, "x-request-id"),
            ["not kept"],
            "{protocol:?}"
        );
        // Its own answers carry none either.
        assert_eq!(
            forged_get(&proxy, &ca, protocol, "/nothing").await,
            (404, None)
        );
    }
}
