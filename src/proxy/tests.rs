//! In-process hook tests: a real Pingora session over an in-memory stream, `request_filter` of a
//! [`SlideGate`] with the memory store and small rules. The request-form and routing branches are
//! tested here without a process or a socket; HTTP/2 runs through Pingora's own h2 server
//! session and proxy pipeline.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::apps::HttpServerApp;
use pingora::protocols::http::v2::server::{handshake, H2Accept, HttpSession as H2Session};
use pingora::protocols::http::ServerSession;
use pingora::protocols::Digest;
use pingora::proxy::{HttpProxy, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::SlideGate;
use crate::config::Config;
use crate::limiter::algo::clock::FakeClock;
use crate::limiter::memory::MemoryStore;
use crate::metrics::Decision;
use crate::routes::Rules;

/// `login` allows one request a minute per client; `open` has no limits; `admin` is the host
/// `admin.test`, one a minute.
const RULES: &str = r#"
[store]
backend = "memory"

[[routes]]
name = "login"
upstream = "app"
path_prefix = "/login"
limits = [ { requests = 1, window = "60s" } ]

[[routes]]
name = "open"
upstream = "app"
path_prefix = "/open"

[[routes]]
name = "admin"
upstream = "app"
host = "admin.test"
limits = [ { requests = 1, window = "60s" } ]
"#;

/// What every hook test's config starts with: the listeners (never opened here) and the one
/// upstream, `app`.
const HEAD: &str = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                    [upstreams.app]\nservers = [\"127.0.0.1:9\"]\n";

/// The rules of a hook test's config: [`HEAD`], then `rest` (`[store]` and the routes), as if
/// read from `file`.
pub(super) fn rules(file: &str, rest: &str) -> Arc<ArcSwap<Rules>> {
    let config =
        Config::from_toml(Path::new(file), &format!("{HEAD}{rest}")).expect("valid config");
    Arc::new(ArcSwap::from_pointee(
        Rules::build(&config).expect("rules build"),
    ))
}

/// On a clock that stands still, so a window's `t` and `Retry-After` are exact however long
/// a loaded machine takes between two requests (`t=59` once, beside the integration tests).
fn gate() -> SlideGate {
    let store = MemoryStore::new().with_clock(FakeClock::at(1_000_000));
    SlideGate::new(rules("hooks.toml", RULES), Arc::new(store))
}

/// An HTTP/1 request the hook lets through: the mock stream fails the test on any write.
async fn forwarded_h1(gate: &SlideGate, head: &'static [u8]) -> super::RequestCtx {
    let mock = tokio_test::io::Builder::new().read(head).build();
    let mut session = Session::new_h1(Box::new(mock));
    assert!(session.read_request().await.expect("head parses"));
    let mut ctx = gate.new_ctx();
    let answered = gate.request_filter(&mut session, &mut ctx).await.unwrap();
    assert!(!answered, "the request goes upstream");
    ctx
}

/// An HTTP/1 request the hook answers itself: what it wrote, as text, and the context.
async fn answered_h1(gate: &SlideGate, head: &[u8]) -> (String, super::RequestCtx) {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    client.write_all(head).await.unwrap();
    let mut session = Session::new_h1(Box::new(server));
    assert!(session.read_request().await.expect("head parses"));
    let mut ctx = gate.new_ctx();
    let answered = gate.request_filter(&mut session, &mut ctx).await.unwrap();
    assert!(answered, "slidegate answers the request itself");
    drop(session);
    let mut out = String::new();
    client.read_to_string(&mut out).await.unwrap();
    (out, ctx)
}

/// The decision on one HTTP/1.1 request (`GET /x`, host `a.test`); the client's end stays
/// open until it is made, so a waiting request is not taken for a client that left.
pub(super) async fn decision(gate: &SlideGate) -> Option<crate::metrics::Decision> {
    let head = b"GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    client.write_all(head).await.unwrap();
    let mut session = Session::new_h1(Box::new(server));
    assert!(session.read_request().await.expect("head parses"));
    let mut ctx = gate.new_ctx();
    let _ = gate.request_filter(&mut session, &mut ctx).await;
    ctx.decision
}

/// The body of an HTTP/1 response as JSON.
fn json_body(response: &str) -> serde_json::Value {
    let (_, body) = response.split_once("\r\n\r\n").expect("a complete head");
    serde_json::from_str(body).expect("a JSON body")
}

#[tokio::test]
async fn h1_bad_form_is_400_and_closes() {
    let gate = gate();
    let (out, ctx) = answered_h1(&gate, b"GET /login HTTP/1.1\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
    assert!(
        out.contains("Content-Type: application/problem+json\r\n"),
        "{out}"
    );
    assert!(out.contains("Connection: close\r\n"), "{out}");
    assert_eq!(json_body(&out)["status"], 400);
    assert_eq!(ctx.route, None);
    assert_eq!(ctx.decision, None);
}

#[tokio::test]
async fn h1_no_route_is_404() {
    let gate = gate();
    let (out, ctx) = answered_h1(&gate, b"GET /elsewhere HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 404 "), "{out}");
    assert_eq!(json_body(&out)["detail"], "no route matches this request");
    assert_eq!(ctx.route, None);
    assert_eq!(ctx.decision, None);
}

#[tokio::test]
async fn h1_unlimited_route_is_forwarded_without_fields() {
    let gate = gate();
    let ctx = forwarded_h1(&gate, b"GET /open HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert_eq!(ctx.route, Some(1));
    assert_eq!(ctx.decision, Some(Decision::Allowed));
    assert!(ctx.ratelimit.is_none());
    assert!(ctx.key.is_empty(), "the store is not asked");
}

#[tokio::test]
async fn h1_allow_then_deny_writes_a_429() {
    let gate = gate();
    let head = b"GET /login HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let ctx = forwarded_h1(&gate, head).await;
    assert_eq!(ctx.decision, Some(Decision::Allowed));
    let field = ctx
        .ratelimit
        .clone()
        .expect("a RateLimit field for the upstream response");
    // The partition key of this client's bucket, the same on its allowed and denied answers.
    let pk = ctx.route().unwrap().partition_key(&ctx.key);
    let item = format!("\"login-60s\";r=0;t=60;pk=:{}:", pk.as_str());
    assert_eq!(field.to_str().unwrap(), item);

    let (out, ctx) = answered_h1(&gate, head).await;
    assert_eq!(ctx.decision, Some(Decision::Denied));
    assert!(out.starts_with("HTTP/1.1 429 "), "{out}");
    assert!(
        out.contains("RateLimit-Policy: \"login-60s\";q=1;w=60\r\n"),
        "{out}"
    );
    assert!(out.contains(&format!("RateLimit: {item}\r\n")), "{out}");
    assert!(out.contains("Retry-After: 60\r\n"), "{out}");
    assert_eq!(
        json_body(&out)["violated-policies"],
        serde_json::json!(["login-60s"])
    );
}

/// One HTTP/2 request through Pingora's h2 server session and the proxy pipeline (whose
/// `request_filter` is [`SlideGate`]'s): the status, headers and body the client receives.
async fn h2_exchange(gate: &SlideGate, url: &str) -> (http::response::Parts, Vec<u8>) {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let gate = SlideGate::new(gate.rules.clone(), gate.limiter.store().clone());
    let proxy = Arc::new(HttpProxy::new(gate, Arc::new(ServerConf::default())));
    let server = tokio::spawn(serve_one_h2(proxy, server_io));

    let (mut send, conn) = h2::client::handshake(client_io).await.unwrap();
    let driver = tokio::spawn(conn);
    let request = http::Request::get(url).body(()).unwrap();
    let (response, _) = send.send_request(request, true).unwrap();
    let response = match response.await {
        Ok(r) => r,
        // Show why the server side ended, if it did.
        Err(e) => panic!("h2 response: {e}; server: {:?}", server.await),
    };
    let (parts, mut body) = response.into_parts();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        bytes.extend_from_slice(&chunk);
    }
    // Closing the client's connection ends the server's.
    drop(send);
    driver.abort();
    let served = tokio::time::timeout(std::time::Duration::from_secs(10), server).await;
    served
        .expect("the server side ends with the connection")
        .unwrap();
    (parts, bytes)
}

/// Accept one h2 stream on `io` and hand it to `proxy`, as Pingora's accept loop does: the
/// stream is served in a task of its own while the connection is driven here, until the client
/// closes it.
async fn serve_one_h2(proxy: Arc<HttpProxy<SlideGate>>, io: DuplexStream) {
    let mut conn = handshake(Box::new(io), None).await.unwrap();
    let digest = Arc::new(Digest::default());
    let accepted = H2Session::from_h2_conn(&mut conn, digest.clone()).await;
    let Ok(Some(H2Accept::Session(session))) = accepted else {
        panic!("no h2 stream accepted");
    };
    let served = tokio::spawn(async move {
        let (_tx, shutdown) = tokio::sync::watch::channel(false);
        proxy
            .process_new_http(ServerSession::new_http2(session), &shutdown)
            .await
            .is_none()
    });
    // Drives the connection (sends the response); ends when the client goes away.
    while let Ok(Some(_)) = H2Session::from_h2_conn(&mut conn, digest.clone()).await {}
    assert!(served.await.unwrap(), "an h2 stream is never reused");
}

#[tokio::test]
async fn h2_no_route_is_404() {
    let (parts, body) = h2_exchange(&gate(), "http://a.test/elsewhere").await;
    assert_eq!(parts.status, 404);
    assert_eq!(parts.headers["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["status"], 404);
}

#[tokio::test]
async fn h2_deny_is_429_with_fields() {
    let gate = gate();
    // Use up the quota of this client (the same unknown peer as over h2) with an h1 request.
    let ctx = forwarded_h1(&gate, b"GET /login HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert_eq!(ctx.decision, Some(Decision::Allowed));

    let (parts, body) = h2_exchange(&gate, "http://a.test/login").await;
    assert_eq!(parts.status, 429);
    let field = parts.headers["ratelimit"].to_str().unwrap();
    let pk = field.strip_prefix("\"login-60s\";r=0;t=60;pk=:").unwrap();
    assert_eq!(
        pk.len(),
        17,
        "16 characters of base64 and the closing colon: {field}"
    );
    assert_eq!(parts.headers["retry-after"], "60");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["login-60s"]));
}

/// An h2 client names the host in `:authority` only: the host route takes it and counts it
/// (the first request goes upstream, where nothing listens: 502; the second is over the limit).
#[tokio::test]
async fn h2_authority_matches_a_host_route() {
    let gate = gate();
    let (first, _) = h2_exchange(&gate, "http://Admin.Test/x").await;
    assert_eq!(first.status, 502);
    let (second, _) = h2_exchange(&gate, "http://admin.test:8443/y").await;
    assert_eq!(second.status, 429);
    assert_eq!(second.headers["ratelimit-policy"], "\"admin-60s\";q=1;w=60");
}
