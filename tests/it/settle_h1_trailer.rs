//! `settle` from an HTTP/1.1 upstream's chunked trailer (issue 52, the quota notes): the
//! upstream answers `Transfer-Encoding: chunked` and reports the request's real cost only in
//! the trailer section after the last chunk. Pingora 0.9's HTTP/1 client discarded that
//! section, so the charge stood at the claim; the vendored `pingora-core` keeps the fields it
//! parses and hands them to the trailer hook, as an HTTP/2 upstream's trailers are.
//!
//! Through the real binary on the memory store, clients over HTTP/1.1, h2c and HTTP/2 over
//! TLS, the upstream a scripted HTTP/1.1 one (`common::raw_upstream`): the trailer in the same
//! write as the last chunk, and written on its own after a pause (so the proxy reads it apart
//! from the body); the next request on the same upstream connection still works.

use crate::common;

use std::time::Duration;

use common::config::settle_route;
use common::control::poll_until;
use common::fetch::{fetch_with, url};
use common::proxy::{ConfigBuilder, Proxy};
use common::raw_upstream::RawUpstream;
use common::tls::{ready_on_every_protocol, Protocol, TestCa};

/// An upstream answering `hello world` chunked, the cost the request's `X-Report` names in
/// the trailer (beside another field), never in the head. `/split/` writes the body, the
/// last chunk's size line and the trailer fields each on its own.
fn trailer_upstream() -> RawUpstream {
    RawUpstream::start_in_parts(|head| {
        let lower = head.to_ascii_lowercase();
        let report = (lower.lines()).find_map(|l| l.strip_prefix("x-report:"));
        let report = report.unwrap_or("").trim().to_owned();
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\
                    Trailer: X-Tokens-Used\r\n\r\n";
        let body = "5\r\nhello\r\n6\r\n world\r\n";
        // Fields an HTTP/2 client must never be sent (RFC 9113 §8.2.2) beside the report.
        let trailer = format!(
            "X-Note: from the trailer\r\nConnection: close\r\nKeep-Alive: 5\r\n\
             Transfer-Encoding: chunked\r\nX-Tokens-Used: {report}\r\n\r\n"
        );
        if !lower.contains(" /split/") {
            return vec![format!("{head}{body}0\r\n{trailer}").into_bytes()];
        }
        vec![
            format!("{head}{body}").into_bytes(),
            b"0\r\n".to_vec(),
            trailer.into_bytes(),
        ]
    })
}

/// The inspector's count on the cost limit of `who` on `route`, once it is `count` (a
/// settlement lands just after its response); the last seen count if it never gets there.
fn count_reaches(proxy: &Proxy, route: &str, who: &str, count: u64) -> Result<(), u64> {
    let path = format!("/api/v1/window?route={route}&client={who}");
    let mut last = 0;
    let done = poll_until(Duration::from_secs(3), || {
        let (status, body) = proxy.admin_get(&path);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        last = v["limits"][0]["count"].as_u64().unwrap_or(0);
        last == count
    });
    done.map(|_| ()).ok_or(last)
}

/// Claimed 100, really 7: 7 counted; then claimed 10, really 50: 57. Each over every client
/// protocol, with the trailer in one write and in parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_upstreams_chunked_trailer_settles_the_cost() {
    let up = trailer_upstream();
    let ca = TestCa::new("ca");
    let limits = "limits = [{ quota = 1000, window = \"1m\", unit = \"cost\" }]";
    let config = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("one", &settle_route("/one/", "app", limits))
        .route("split", &settle_route("/split/", "app", limits))
        .build();
    let proxy = &ready_on_every_protocol(&config, &ca, 1)[0];
    let mut failures = Vec::new();
    for protocol in [Protocol::H1, Protocol::H2c, Protocol::H2Tls] {
        let http = protocol.client(&ca.ca_pem());
        for route in ["one", "split"] {
            let who = format!("{protocol:?}-{route}");
            let mut counted = 0;
            for (claim, real) in [("100", 7), ("10", 50)] {
                let report = real.to_string();
                let headers = [
                    ("x-client", who.as_str()),
                    ("x-cost", claim),
                    ("x-report", report.as_str()),
                ];
                let target = url(proxy, protocol, &format!("/{route}/x"));
                let seen = fetch_with(&http, &target, &headers, protocol.version()).await;
                assert_eq!(
                    (seen.status, seen.body.as_str()),
                    (200, "hello world"),
                    "{who}"
                );
                counted += real;
                if let Err(seen) = count_reaches(proxy, route, &who, counted) {
                    failures.push(format!(
                        "{who}: claimed {claim}, reported {real} in the trailer: \
                         counted {seen}, not {counted}"
                    ));
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(up.heads(), 12, "every request reached the upstream once");
}
