//! `settle = "json:usage.total_tokens"`: a model's token usage read from its response body (a
//! JSON completion, or the last event carrying the path of a `text/event-stream`) settles the
//! charge, while the body reaches the client byte for byte and unheld. Through the real binary
//! and a stand-in model server (OpenAI-style, [`common::model`]) over HTTP/1.1 and HTTP/2 over
//! TLS, per client protocol (HTTP/1.1, HTTP/2 over TLS, h2c), on the memory store, one Redis and
//! two proxies sharing it: the settled charge is the usage reported (the inspector, the next
//! admission's `RateLimit`); a body without usage, a stream cut before its usage event, a body
//! or event over `settle_scan_bytes` and a compressed body leave the charge as it stands, each
//! counted in `slidegate_settlements_total`; the upstream is asked for `identity`.

use crate::common;

use std::time::Duration;

use common::config::h2_tls_upstream;
use common::control::poll_until;
use common::fetch::url;
use common::model::{Answer, ModelServer};
use common::proxy::{ConfigBuilder, Proxy};
use common::ratelimit::parse_ratelimit;
use common::redis::RedisServer;
use common::tls::{ready_on_every_protocol, server_config, Protocol, TestCa};

const QUOTA: u64 = 1_000_000;
/// `settle_scan_bytes`: a padded answer of 8 KiB is over it.
const SCAN: usize = 4096;

/// Routes `chat` (the model over HTTP/1.1) and `h2chat` (over HTTP/2 with TLS), each a cost
/// quota of 1 M tokens a minute per `X-Client`, settled from `usage.total_tokens`.
fn config(model: &ModelServer, h2_model: &ModelServer, ca: &TestCa, store: &str) -> String {
    let route = |prefix: &str, upstream: &str| {
        format!(
            "path_prefix = \"{prefix}\"\nupstream = \"{upstream}\"\nkey = \"header:X-Client\"\n\
             cost = \"header:X-Cost\"\nsettle = \"json:usage.total_tokens\"\n\
             settle_scan_bytes = {SCAN}\n\
             limits = [{{ quota = {QUOTA}, window = \"1m\", unit = \"cost\" }}]"
        )
    };
    ConfigBuilder::new()
        .store(store)
        .upstream("model", model.addr())
        .upstream_with("h2model", h2_model.addr(), &h2_tls_upstream(&ca.ca_file()))
        .route("chat", &route("/v1/", "model"))
        .route("h2chat", &route("/h2/", "h2model"))
        .build()
}

/// What a client got: status, the cost limit's remaining units, the body (`Err`: cut off).
struct Got {
    status: u16,
    left: Option<u64>,
    body: Result<Vec<u8>, String>,
}

async fn send(http: &reqwest::Client, target: &str, fields: &[(&str, String)]) -> Got {
    let mut request = http
        .post(target)
        .body("{\"model\":\"stand-in\",\"messages\":[]}");
    for (name, value) in fields {
        request = request.header(*name, value);
    }
    let resp = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{target}: {e}"));
    let status = resp.status().as_u16();
    let field = resp
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned());
    let items = field.as_deref().map(parse_ratelimit).unwrap_or_default();
    let left = items
        .iter()
        .find(|i| i.name.ends_with("-cost"))
        .map(|i| i.r);
    let body = resp
        .bytes()
        .await
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string());
    Got { status, left, body }
}

/// One request of each kind per client protocol and upstream; each settled charge checked.
async fn settles_from_the_body(proxies: &[Proxy], ca: &TestCa, store: &str) {
    let mut n = 0;
    for protocol in [Protocol::H1, Protocol::H2Tls, Protocol::H2c] {
        let http = protocol.client(&ca.ca_pem());
        for (route, prefix) in [("chat", "/v1/"), ("h2chat", "/h2/")] {
            let who = format!("{store}-{protocol:?}-{route}");
            // (claim, answer, the inspector's count once settled, the body goes out whole)
            let json = |usage| Answer {
                usage,
                ..Answer::default()
            };
            let sse = |usage, chunks| Answer {
                usage,
                stream: Some(chunks),
                ..Answer::default()
            };
            let steps = [
                // Charged 100, used 300: 200 more.
                (100, json(Some(300)), 300, true),
                // A stream: its final usage chunk says 700.
                (100, sse(Some(700), 5), 1000, true),
                // Charged 100, used 5: 95 back.
                (100, json(Some(5)), 1005, true),
                // No usage: the charge stands.
                (50, json(None), 1055, true),
                // Cut before the usage chunk: the charge stands.
                (
                    40,
                    Answer {
                        cut: true,
                        ..sse(Some(999), 3)
                    },
                    1095,
                    false,
                ),
                // Over settle_scan_bytes, a body and an event: not read, the charge stands.
                (
                    30,
                    Answer {
                        pad: Some(2 * SCAN),
                        ..json(Some(5000))
                    },
                    1125,
                    true,
                ),
                (
                    20,
                    Answer {
                        pad: Some(2 * SCAN),
                        ..sse(Some(5000), 2)
                    },
                    1145,
                    true,
                ),
                // Compressed after all (the upstream ignored `identity`): not read.
                (
                    10,
                    Answer {
                        encoded: true,
                        ..json(Some(5000))
                    },
                    1155,
                    true,
                ),
            ];
            let mut before = 0;
            for (i, (claim, answer, count, whole)) in steps.into_iter().enumerate() {
                let mut fields = answer.headers();
                fields.push(("x-client", who.clone()));
                fields.push(("x-cost", claim.to_string()));
                fields.push(("accept-encoding", "gzip, br".to_owned()));
                let p = &proxies[n % proxies.len()];
                n += 1;
                let got = send(&http, &url(p, protocol, prefix), &fields).await;
                let at = format!("{who} step {i}");
                assert_eq!(got.status, 200, "{at}");
                // The next admission sees the settlement before it: its own claim only.
                assert_eq!(got.left, Some(QUOTA - before - claim), "{at}");
                match (&got.body, whole) {
                    (Ok(body), true) => assert!(*body == answer.body(), "{at}: body changed"),
                    (Err(_), false) => {}
                    (body, _) => panic!("{at}: whole {whole}, got {body:?}"),
                }
                let seen = p.count_when(route, &who, |c| c == count);
                assert_eq!(seen, count, "{at}: settled");
                before = count;
            }
        }
    }
    // Per protocol and route (6): charged 2, given back 1, missing 1, cut off 1, oversized 2,
    // encoded 1, counted once each.
    let results = [
        ("charged", 12),
        ("given_back", 6),
        ("missing", 6),
        ("cut_off", 6),
        ("oversized", 12),
        ("encoded", 6),
    ];
    for (result, want) in results {
        let line = format!("slidegate_settlements_total{{result=\"{result}\",route=");
        let sum = || -> u64 {
            (proxies.iter().map(|p| p.metrics_text()))
                .flat_map(|m| m.lines().map(str::to_owned).collect::<Vec<_>>())
                .filter(|l| l.starts_with(&line))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum()
        };
        let done = poll_until(Duration::from_secs(5), || sum() == want);
        assert!(done.is_some(), "{store} {result}: {} of {want}", sum());
    }
}

/// One Redis, with a timeout no loaded test machine reaches: a decision this proxy's own log
/// made in its stead (`on_error = "local"`, from the count Redis last gave) would not see a
/// settlement, and these tests are about settling, not outages.
fn redis_store(redis: &RedisServer) -> String {
    format!("{}\ntimeout = \"5s\"", redis.store_toml())
}

fn start(store: &str, ca: &TestCa, n: usize) -> (ModelServer, ModelServer, Vec<Proxy>) {
    let model = ModelServer::start();
    let h2 = ModelServer::start_tls(server_config(&ca.issue("model", &["localhost"])));
    let proxies = ready_on_every_protocol(&config(&model, &h2, ca, store), ca, n);
    (model, h2, proxies)
}

/// Every request reached the model asking for an uncompressed body, whatever the client
/// accepted.
fn asked_identity(models: &[&ModelServer]) {
    for model in models {
        let seen = model.accept_encodings();
        assert!(!seen.is_empty());
        assert!(
            seen.iter().all(|ae| ae.as_deref() == Some("identity")),
            "{seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_settles_the_usage_in_the_body() {
    let ca = TestCa::new("ca");
    let (model, h2, proxies) = start("backend = \"memory\"", &ca, 1);
    settles_from_the_body(&proxies, &ca, "memory").await;
    asked_identity(&[&model, &h2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_settles_the_usage_in_the_body() {
    let (ca, redis) = (TestCa::new("ca"), RedisServer::start());
    let store = redis_store(&redis);
    let (model, h2, proxies) = start(&store, &ca, 1);
    settles_from_the_body(&proxies, &ca, "redis").await;
    asked_identity(&[&model, &h2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_redis_settle_the_usage_in_the_body() {
    let (ca, redis) = (TestCa::new("ca"), RedisServer::start());
    let store = redis_store(&redis);
    let (_model, _h2, proxies) = start(&store, &ca, 2);
    settles_from_the_body(&proxies, &ca, "two").await;
}

/// Streaming is not buffered: the client has the first event while the model still holds
/// back the rest (until released), over every client protocol and both upstreams; the whole
/// stream arrives unchanged and its final usage settles the charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reaches_the_client_event_by_event() {
    let ca = TestCa::new("ca");
    let (model, h2, proxies) = start("backend = \"memory\"", &ca, 1);
    let proxy = &proxies[0];
    for protocol in [Protocol::H1, Protocol::H2Tls, Protocol::H2c] {
        let http = protocol.client(&ca.ca_pem());
        for (route, prefix, server) in [("chat", "/v1/", &model), ("h2chat", "/h2/", &h2)] {
            let who = format!("gated-{protocol:?}-{route}");
            let answer = Answer {
                usage: Some(640),
                stream: Some(4),
                gated: true,
                ..Answer::default()
            };
            let mut request = http.post(url(proxy, protocol, prefix));
            for (name, value) in answer.headers() {
                request = request.header(name, value);
            }
            request = request.header("x-client", &who).header("x-cost", "1");
            let mut resp = request.send().await.expect("send");
            assert_eq!(resp.status(), 200, "{who}");
            let first = answer.parts()[0].clone();
            let mut got = Vec::new();
            while got.len() < first.len() {
                let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk()).await;
                let chunk = chunk.unwrap_or_else(|_| panic!("{who}: first event held back"));
                got.extend_from_slice(&chunk.expect("chunk").expect("more body"));
            }
            assert_eq!(got, first, "{who}: the first event, alone");
            assert_eq!(
                proxy.count_when(route, &who, |c| c == 1),
                1,
                "not settled yet"
            );
            server.release();
            while let Some(chunk) = resp.chunk().await.expect("rest") {
                got.extend_from_slice(&chunk);
            }
            assert!(got == answer.body(), "{who}: body changed");
            assert_eq!(proxy.count_when(route, &who, |c| c == 640), 640, "{who}");
        }
    }
}
