//! `settle` against a client that does not wait for the end: the real cost the upstream
//! reports is charged however the response ends. Through the real binary, per client protocol
//! (HTTP/1.1, HTTP/2 over TLS, h2c), on the memory store and one Redis:
//! - a response that outlasts the cost window (a slow upstream here; a client reading slowly
//!   does the same) is charged in the slot of the moment its cost is known, not in the
//!   admission's, which has left the window by then (the charge used to vanish with it);
//! - a client that leaves mid-body after a head that reported the cost is charged it;
//! - a client that leaves after the body but before the trailer that carries the cost is
//!   charged the real cost if the proxy read it, else `max_cost`: never only its estimate.

use crate::common;

use common::config::{h2_tls_upstream, settle_route};
use common::fetch::url;
use common::proxy::{ConfigBuilder, Proxy};
use common::redis::RedisServer;
use common::tls::{ready_on_every_protocol, server_config, Protocol, TestCa};
use common::upstream::{
    Upstream, DELAY_HEADER, FIELD_HEADER, SIZE_HEADER, TRAILER_DELAY_HEADER, TRAILER_HEADER,
};

/// What every request claims, what the upstream reports, and the route's `max_cost`.
const ESTIMATE: u64 = 10;
const REAL: u64 = 1500;
const MAX_COST: u64 = 5000;

/// Routes `slow` (a 2 s cost window), `chat` (an HTTP/1.1 upstream, the cost in the head) and
/// `stream` (an HTTP/2 upstream over TLS, the cost in a trailer), keyed by `X-Client`.
fn config(up: &Upstream, h2_up: &Upstream, ca: &TestCa, store: &str) -> String {
    let route = |prefix: &str, upstream: &str, window: &str| {
        let extra = format!(
            "max_cost = {MAX_COST}\nlimits = [{{ quota = 100000, window = \"{window}\", \
             resolution = \"100ms\", unit = \"cost\" }}]"
        );
        settle_route(prefix, upstream, &extra)
    };
    let h2 = h2_tls_upstream(&ca.ca_file());
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .upstream_with("h2app", h2_up.addr(), &h2)
        .route("slow", &route("/slow/", "app", "2s"))
        .route("chat", &route("/v1/", "app", "1m"))
        .route("stream", &route("/s/", "h2app", "1m"))
        .build()
}

/// Send `path` as `who` with `fields`, read the body until `keep` bytes came (all of it:
/// `usize::MAX`), then drop the response (the client leaves: a reset stream on HTTP/2, a
/// closed connection on HTTP/1.1). Returns the status.
async fn send(http: &reqwest::Client, target: &str, fields: &[(&str, String)], keep: usize) -> u16 {
    let mut request = http.get(target);
    for (name, value) in fields {
        request = request.header(*name, value);
    }
    let mut resp = request.send().await.expect("send");
    let status = resp.status().as_u16();
    let mut got = 0;
    while got < keep {
        match resp.chunk().await {
            Ok(Some(chunk)) => got += chunk.len(),
            _ => break,
        }
    }
    status
}

async fn settles_whatever_the_client_does(proxy: &Proxy, ca: &TestCa, store: &str) {
    for protocol in [Protocol::H1, Protocol::H2Tls, Protocol::H2c] {
        let http = protocol.client(&ca.ca_pem());
        let who = format!("{store}-{protocol:?}");
        let base = |report: &'static str| {
            vec![
                ("x-client", who.clone()),
                ("x-cost", ESTIMATE.to_string()),
                (report, format!("X-Tokens-Used: {REAL}")),
            ]
        };

        // Answered 2.5 s after the admission, whose slot has left the 2 s window by then.
        let mut fields = base(FIELD_HEADER);
        fields.push((DELAY_HEADER, "2500".into()));
        let target = url(proxy, protocol, "/slow/");
        assert_eq!(send(&http, &target, &fields, usize::MAX).await, 200);
        // The estimate has left with its slot; the rest of the real cost is counted from now.
        let rest = REAL - ESTIMATE;
        let got = proxy.count_when("slow", &who, |c| c == rest);
        assert_eq!(got, rest, "{protocol:?}: outlasting the window");

        // The cost in the head, a 16 MiB body, the client gone after its first bytes.
        let mut fields = base(FIELD_HEADER);
        fields.push((SIZE_HEADER, (16 << 20).to_string()));
        let target = url(proxy, protocol, "/v1/");
        assert_eq!(send(&http, &target, &fields, 1).await, 200);
        let got = proxy.count_when("chat", &who, |c| c == REAL);
        assert_eq!(got, REAL, "{protocol:?}: left mid-body");

        // The whole body, then gone 2 s before the trailer that carries the cost.
        let mut fields = base(TRAILER_HEADER);
        fields.push((TRAILER_DELAY_HEADER, "2000".into()));
        let target = url(proxy, protocol, "/s/");
        let body = common::upstream::UPSTREAM_BODY.len();
        assert_eq!(send(&http, &target, &fields, body).await, 200);
        let got = proxy.count_when("stream", &who, |c| c == REAL || c == MAX_COST);
        assert!(
            got == REAL || got == MAX_COST,
            "{protocol:?}: left before the trailer, charged {got} (estimate {ESTIMATE})"
        );
    }
}

fn start(store: &str, ca: &TestCa) -> (Upstream, Upstream, Proxy) {
    let up = Upstream::start();
    let h2_up = Upstream::start_tls(server_config(&ca.issue("upstream", &["localhost"])));
    let mut proxies = ready_on_every_protocol(&config(&up, &h2_up, ca, store), ca, 1);
    (up, h2_up, proxies.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_charges_what_a_departed_client_used() {
    let ca = TestCa::new("ca");
    let (_up, _h2, proxy) = start("backend = \"memory\"", &ca);
    settles_whatever_the_client_does(&proxy, &ca, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_charges_what_a_departed_client_used() {
    let (ca, redis) = (TestCa::new("ca"), RedisServer::start());
    let store = format!("backend = \"redis\"\nurl = \"{}\"", redis.url());
    let (_up, _h2, proxy) = start(&store, &ca);
    settles_whatever_the_client_does(&proxy, &ca, "redis").await;
}
