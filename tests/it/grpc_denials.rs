//! gRPC calls through the real binary, made by a real gRPC client (Python grpcio) to a real gRPC
//! upstream (tests/grpc/): on a route limited to 3 calls a minute the 4th call is read by the
//! client as `RESOURCE_EXHAUSTED` with slidegate's message and the RateLimit fields as metadata,
//! over h2c and over h2 with TLS, on the memory store and on Redis; the denied call never
//! reaches the upstream. The proxy's other refusals map to gRPC statuses the client reads
//! (`UNIMPLEMENTED` for no route, `INVALID_ARGUMENT` for a malformed request, `UNAVAILABLE` for an
//! unreachable upstream and for a store failure under `on_error = "deny"`), and over HTTP/1.1 a gRPC call is answered the same way
//! (`200`, `grpc-status: 8`, `Content-Length: 0`).

use crate::common;

use common::grpc::{grpc_calls, grpc_calls_saying, GrpcCall, GrpcTransport, GrpcUpstream};
use common::proxy::{closed_addr, ConfigBuilder, Proxy, ProxyOptions};
use common::ratelimit::parse_ratelimit;
use common::redis::RedisServer;
use common::tls::{tls_options, TestCa};
use common::upstream::Upstream;

const ECHO: &str = "/slidegate.test.Echo/Echo";
const COUNT: &str = "/slidegate.test.Echo/Count";

/// The config: the limited `Echo` route (3 a minute per `x-client`, with the `X-RateLimit-*`
/// fields), `Count` unlimited, an h2 upstream that does not listen, and a plain HTTP/1.1
/// upstream for the HTTP/1.1 check; `store` is the `[store]` table.
/// The proxy in front of both upstreams on the memory store, with an h2c listener.
fn h2c_proxy(grpc: &GrpcUpstream, plain: &Upstream) -> Proxy {
    let h2c_listener = ProxyOptions {
        server_extra: "h2c = true".into(),
        ..ProxyOptions::default()
    };
    Proxy::start_with(&config(grpc, plain, None), h2c_listener)
}

fn config(grpc: &GrpcUpstream, plain: &Upstream, store: Option<&str>) -> String {
    let mut builder = ConfigBuilder::new()
        .upstream_with("grpc", grpc.addr(), "h2 = true")
        .upstream_with("down", closed_addr(), "h2 = true")
        .upstream("plain", plain.addr())
        .route(
            "echo",
            &format!(
                "path_prefix = \"{ECHO}\"\nkey = \"header:x-client\"\nlegacy_headers = true\n\
                 on_error = \"deny\"\nlimits = [ {{ requests = 3, window = \"1m\" }} ]"
            ),
        )
        .route("count", &format!("path_prefix = \"{COUNT}\""))
        .route(
            "down",
            "path_prefix = \"/slidegate.test.Down/\"\nupstream = \"down\"",
        )
        .route(
            "h1",
            "path_prefix = \"/h1/\"\nupstream = \"plain\"\nkey = \"global\"\n\
             limits = [ { requests = 1, window = \"1m\" } ]",
        );
    if let Some(store) = store {
        builder = builder.store(store);
    }
    builder.build()
}

/// 3 calls admitted (echoed, with the RateLimit fields), the 4th `RESOURCE_EXHAUSTED`.
fn assert_limited(calls: &[GrpcCall], how: &str) {
    let codes: Vec<&str> = calls.iter().map(|c| c.code.as_str()).collect();
    assert_eq!(
        codes,
        ["OK", "OK", "OK", "RESOURCE_EXHAUSTED"],
        "{how}: {calls:#?}"
    );
    for (i, call) in calls[..3].iter().enumerate() {
        assert_eq!(call.reply.as_deref(), Some(format!("hello {i}").as_str()));
        let r = parse_ratelimit(call.meta("ratelimit").expect("RateLimit metadata"));
        assert_eq!(r[0].r, 2 - i as u64, "{how}: {call:?}");
        assert_eq!(
            call.meta("x-ratelimit-remaining"),
            Some((2 - i).to_string()).as_deref()
        );
    }
    let denied = &calls[3];
    let retry: u64 = denied
        .meta("retry-after")
        .expect("Retry-After metadata")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{how}: {denied:?}");
    assert_eq!(
        denied.details,
        format!("rate limit exceeded on route echo; retry after {retry} s"),
        "{how}"
    );
    assert_eq!(
        denied.meta("ratelimit-policy"),
        Some(r#""echo-60s";q=3;w=60"#)
    );
    let r = parse_ratelimit(denied.meta("ratelimit").expect("RateLimit metadata"));
    assert_eq!((r[0].r, r[0].t), (0, retry), "{how}: {denied:?}");
    assert_eq!(denied.meta("x-ratelimit-limit"), Some("3"));
    assert_eq!(denied.meta("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        denied.meta("x-ratelimit-reset"),
        Some(retry.to_string()).as_deref()
    );
}

/// The 4 calls over h2c and over h2 with TLS (a bucket each), then what the upstream counted.
fn denials_over_both_transports(store: Option<&str>) -> Proxy {
    let grpc = GrpcUpstream::start();
    let plain = Upstream::start();
    let ca = TestCa::new("slidegate gRPC test CA");
    let proxy = Proxy::start_with(
        &config(&grpc, &plain, store),
        tls_options(&ca, "h2c = true"),
    );
    let tls = GrpcTransport::Tls(ca.ca_file());
    for (target, transport, who) in [
        (proxy.addr(), &GrpcTransport::H2c, "h2c"),
        (proxy.tls_addr(), &tls, "h2+tls"),
    ] {
        let calls = grpc_calls(target, transport, ECHO, &[who], 4);
        assert_limited(&calls, who);
    }
    // Only the admitted calls reached the upstream: 3 per transport.
    let count = grpc_calls(proxy.addr(), &GrpcTransport::H2c, COUNT, &["count"], 1);
    assert_eq!(count[0].reply.as_deref(), Some("6"), "{count:?}");
    proxy
}

#[test]
fn a_grpc_client_reads_denials_as_resource_exhausted_on_the_memory_store() {
    let proxy = denials_over_both_transports(None);
    drop(proxy);
}

#[test]
fn a_grpc_client_reads_denials_as_resource_exhausted_on_redis_and_unavailable_without_it() {
    let mut redis = RedisServer::start();
    let store = redis.store_toml();
    let proxy = denials_over_both_transports(Some(&store));
    // Redis gone and the route fails closed: UNAVAILABLE (the status gRPC clients retry), with
    // `Retry-After: 1`, not a denial.
    redis.kill();
    let calls = grpc_calls(proxy.addr(), &GrpcTransport::H2c, ECHO, &["after-redis"], 1);
    assert_eq!(calls[0].code, "UNAVAILABLE", "{calls:?}");
    assert_eq!(calls[0].details, "rate limiter unavailable");
    assert_eq!(calls[0].meta("retry-after"), Some("1"));
}

#[test]
fn other_refusals_of_grpc_calls_are_grpc_statuses() {
    let grpc = GrpcUpstream::start();
    let plain = Upstream::start();
    let proxy = h2c_proxy(&grpc, &plain);
    let h2c = GrpcTransport::H2c;
    let none = grpc_calls(proxy.addr(), &h2c, "/slidegate.test.Other/Call", &["a"], 1);
    assert_eq!(none[0].code, "UNIMPLEMENTED", "{none:?}");
    assert_eq!(none[0].details, "no route matches this request");
    let down = grpc_calls(proxy.addr(), &h2c, "/slidegate.test.Down/Call", &["a"], 1);
    assert_eq!(down[0].code, "UNAVAILABLE", "{down:?}");
    assert!(down[0].details.contains("upstream"), "{down:?}");
    // The route's key header on two lines names no one client: slidegate's 400, nothing
    // counted.
    let twice = grpc_calls(proxy.addr(), &h2c, ECHO, &["a", "b"], 1);
    assert_eq!(twice[0].code, "INVALID_ARGUMENT", "{twice:?}");
    assert_eq!(twice[0].details, "malformed request");
}

/// The denial is *trailers-only*: one HEADERS frame that ends the stream (no DATA frame, no
/// separate trailers), as a gRPC server fails a call, read with a bare HTTP/2 client.
#[tokio::test]
async fn an_h2_grpc_denial_is_one_headers_frame_that_ends_the_stream() {
    let grpc = GrpcUpstream::start();
    let plain = Upstream::start();
    let proxy = h2c_proxy(&grpc, &plain);
    let tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let driver = tokio::spawn(conn);
    // `/h1/` is limited to 1 a minute and its upstream is plain HTTP/1.1: the first call is
    // answered by it, the second denied.
    let url = format!("http://{}/h1/slidegate.test.Echo/Echo", proxy.addr());
    let mut heads = Vec::new();
    for _ in 0..2 {
        let request = http::Request::post(&url)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let mut client = client.clone().ready().await.unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        // An empty message: the 5-byte gRPC frame header.
        body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .unwrap();
        let response = response.await.unwrap();
        let ended = response.body().is_end_stream();
        heads.push((response.status(), response.headers().clone(), ended));
    }
    assert!(
        !heads[0].2,
        "the upstream's answer has a body: {:?}",
        heads[0]
    );
    let (status, headers, ended) = &heads[1];
    assert_eq!(*status, 200);
    assert!(ended, "END_STREAM on the HEADERS frame: {headers:?}");
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(headers["content-type"], "application/grpc");
    assert!(!headers.contains_key("content-length"), "{headers:?}");
    assert!(headers.contains_key("ratelimit"), "{headers:?}");
    driver.abort();
}

/// Over HTTP/1.1 a gRPC content type is unusual; it gets what Envoy answers there: the gRPC
/// fields on a `200` with an empty body. Other content types keep their `429`.
#[tokio::test]
async fn over_http1_a_grpc_denial_is_a_200_with_grpc_status() {
    let grpc = GrpcUpstream::start();
    let plain = Upstream::start();
    let proxy = Proxy::start(&config(&grpc, &plain, None));
    let client = reqwest::Client::builder()
        .http1_only()
        .no_proxy()
        .build()
        .unwrap();
    let url = format!("http://{}/h1/x", proxy.addr());
    let post = |content_type: &'static str| {
        client
            .post(&url)
            .header("content-type", content_type)
            .body("x")
            .send()
    };
    assert_eq!(post("application/grpc").await.unwrap().status(), 200);
    let denied = post("application/grpc+proto").await.unwrap();
    assert_eq!(denied.status(), 200);
    let h = denied.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "8");
    assert!(h["grpc-message"]
        .to_str()
        .unwrap()
        .starts_with("rate limit exceeded on route h1; retry after "));
    assert_eq!(h["content-length"], "0");
    assert!(
        h.contains_key("ratelimit") && h.contains_key("retry-after"),
        "{h:?}"
    );
    assert_eq!(denied.bytes().await.unwrap().len(), 0);
    let web = post("application/grpc-web").await.unwrap();
    assert_eq!(web.status(), 429, "grpc-web clients read HTTP statuses");
}

/// `count_status` on a gRPC route: gRPC servers answer every call `200` and say how it went in
/// `grpc-status`, so `count_status = [401]` counts the calls whose status stands for 401
/// (`UNAUTHENTICATED`), read from a trailers-only answer's head or from the trailers, over h2c
/// and h2 with TLS. Before, every call looked like a `200` and was given back: a gRPC "count
/// failed logins" route counted nothing (8 of 8 failed logins reached the upstream in the audit).
#[test]
fn count_status_reads_a_calls_grpc_status() {
    let (grpc, ca) = (GrpcUpstream::start(), TestCa::new("ca"));
    let route = |method: &str| {
        format!(
            "path_prefix = \"/slidegate.test.Echo/{method}\"\nkey = \"header:x-client\"\n\
             count_status = [401]\nlimits = [ {{ requests = 2, window = \"1m\" }} ]"
        )
    };
    let config = ConfigBuilder::new()
        .upstream_with("grpc", grpc.addr(), "h2 = true")
        .route("login", &route("Login"))
        .route("late", &route("LoginLate"))
        .build();
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    let transports = [
        (proxy.addr(), GrpcTransport::H2c),
        (proxy.tls_addr(), GrpcTransport::Tls(ca.ca_file())),
    ];
    for (addr, transport) in &transports {
        for method in ["Login", "LoginLate"] {
            let who = format!("{transport:?}-{method}");
            let path = format!("/slidegate.test.Echo/{method}");
            let codes = |message: &str, calls: usize| -> Vec<String> {
                let calls =
                    grpc_calls_saying(*addr, transport, (&path, Some(message)), &[&who], calls);
                calls.into_iter().map(|c| c.code).collect()
            };
            // Successful calls are given back: never limited.
            assert_eq!(codes("good", 4), ["OK"; 4], "{who}");
            // Failed ones count: 2, then the limit.
            assert_eq!(
                codes("bad", 3),
                ["UNAUTHENTICATED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED"],
                "{who}"
            );
        }
    }
}
