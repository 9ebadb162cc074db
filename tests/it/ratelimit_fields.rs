//! The RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10 as the real binary sends
//! them, over HTTP/1.1, h2c, and HTTP/1.1 and HTTP/2 over TLS:
//! - `pk`, the partition key, on every `RateLimit` item: one per bucket (the same on a client's
//!   allowed and denied answers, another for another client), never the client's key or address,
//!   and the same from every proxy given the same `partition_key_secret_file` (two proxies on one
//!   Redis, two on their own memory stores), another under another secret;
//! - `RateLimit-Policy` without `qu` (requests, the draft's default unit) or `pk`;
//! - the 429's problem body: the draft's `quota-exceeded` type and title, `violated-policies`.

use crate::common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::config::assert_invalid;
use common::http::Reply;
use common::kept::Kept;
use common::proxy::{ConfigBuilder, Proxy};
use common::ratelimit::{pk, ratelimit, violated, PK_BYTES};
use common::redis::RedisServer;
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

/// `/key`: 2 requests a minute per `X-Api-Key`; `/ip`: 2 a minute per client address.
fn config(up: &Upstream, store: &str) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "key",
            "path_prefix = \"/key\"\nkey = \"header:X-Api-Key\"\n\
             limits = [{ requests = 2, window = \"1m\" }]",
        )
        .route(
            "ip",
            "path_prefix = \"/ip\"\nlimits = [{ requests = 2, window = \"1m\" }]",
        )
        .build()
}

/// A secret file of `text` in `dir`.
fn secret_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `[store]` lines: `backend` lines plus the secret file, when given.
fn store(backend: &str, secret: Option<&Path>) -> String {
    match secret {
        Some(p) => format!("{backend}\npartition_key_secret_file = \"{}\"", p.display()),
        None => backend.to_string(),
    }
}

/// GET `path` on a new connection of `protocol`, with `X-Api-Key: api_key`.
async fn get(proxy: &Proxy, ca: &str, protocol: Protocol, path: &str, api_key: &str) -> Reply {
    let mut conn = Kept::open(proxy, protocol, ca).await;
    let reply = conn
        .send("GET", path, &[("x-api-key", api_key)], Bytes::new())
        .await;
    reply.unwrap_or_else(|e| panic!("{protocol:?} GET {path}: {e}"))
}

/// Neither the bytes of `raw` nor its text are in the partition key `pk`.
fn assert_hides(pk: &[u8], raw: &[u8]) {
    assert_eq!(pk.len(), PK_BYTES);
    assert!(
        !pk.windows(raw.len()).any(|w| w == raw),
        "{raw:?} in {pk:?}"
    );
}

#[tokio::test]
async fn pk_is_one_per_bucket_and_hides_the_key_on_every_protocol() {
    let (up, ca) = (Upstream::start(), TestCa::new("fields"));
    let proxy = Proxy::start_with(&config(&up, ""), tls_options(&ca, "h2c = true"));
    let pem = ca.ca_pem();
    for protocol in Protocol::ALL {
        let (alice, bob) = (format!("alice-{protocol:?}"), format!("bob-{protocol:?}"));
        let first = get(&proxy, &pem, protocol, "/key", &alice).await;
        assert_eq!(first.status, 200, "{protocol:?}: {first:?}");
        let policy = first.header("ratelimit-policy");
        assert_eq!(policy, Some(r#""key-60s";q=2;w=60"#), "no qu, no pk");
        let alice_pk = pk(&first);
        assert_hides(&alice_pk, alice.as_bytes());
        assert_eq!(
            pk(&get(&proxy, &pem, protocol, "/key", &alice).await),
            alice_pk
        );
        let denied = get(&proxy, &pem, protocol, "/key", &alice).await;
        assert_eq!(violated(&denied), ["key-60s"], "{protocol:?}");
        assert_eq!(
            pk(&denied),
            alice_pk,
            "{protocol:?}: the 429 names the same bucket"
        );
        assert_eq!(ratelimit(&denied)[0].r, 0);
        let bob_pk = pk(&get(&proxy, &pem, protocol, "/key", &bob).await);
        assert_ne!(bob_pk, alice_pk, "{protocol:?}");
        // A key by address: the address is not in it either, as bytes or text.
        let by_ip = pk(&get(&proxy, &pem, protocol, "/ip", &alice).await);
        assert_hides(&by_ip, &[127, 0, 0, 1]);
        assert_hides(&by_ip, b"127.0.0.1");
    }
}

#[tokio::test]
async fn the_problem_body_is_the_drafts_quota_exceeded() {
    let (up, ca) = (Upstream::start(), TestCa::new("problem"));
    let proxy = Proxy::start_with(&config(&up, ""), tls_options(&ca, "h2c = true"));
    let pem = ca.ca_pem();
    for protocol in Protocol::ALL {
        let who = format!("p-{protocol:?}");
        for _ in 0..2 {
            assert_eq!(get(&proxy, &pem, protocol, "/key", &who).await.status, 200);
        }
        let denied = get(&proxy, &pem, protocol, "/key", &who).await;
        // Type, title, status and `violated-policies` are checked by `violated`.
        assert_eq!(violated(&denied), ["key-60s"], "{protocol:?}");
        let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("rate limit exceeded on route key;"),
            "{body}"
        );
        assert!(
            !denied.body.contains(&who),
            "the key stays out of the body: {body}"
        );
    }
}

/// On Redis with the deny cache on (the default), a client's denials after the first are
/// answered by the proxy's memory, not by a Redis call, on every protocol, and carry what
/// Redis's own denial carried: the same `pk`, `r=0`, the violated policy.
#[tokio::test]
async fn cached_denials_carry_the_same_fields_on_every_protocol() {
    let (up, ca, redis) = (
        Upstream::start(),
        TestCa::new("cached"),
        RedisServer::start(),
    );
    let toml = config(&up, &redis.store_toml());
    let proxy = Proxy::start_with(&toml, tls_options(&ca, "h2c = true"));
    let pem = ca.ca_pem();
    for protocol in Protocol::ALL {
        let who = format!("c-{protocol:?}");
        for _ in 0..2 {
            assert_eq!(get(&proxy, &pem, protocol, "/key", &who).await.status, 200);
        }
        let before = redis.script_calls();
        let first = get(&proxy, &pem, protocol, "/key", &who).await;
        assert_eq!(violated(&first), ["key-60s"], "{protocol:?}");
        for _ in 0..5 {
            let cached = get(&proxy, &pem, protocol, "/key", &who).await;
            assert_eq!(violated(&cached), ["key-60s"], "{protocol:?}");
            assert_eq!(pk(&cached), pk(&first), "{protocol:?}");
            assert_eq!(ratelimit(&cached)[0].r, 0, "{protocol:?}");
        }
        let calls = redis.script_calls() - before;
        assert_eq!(calls, 1, "{protocol:?}: Redis decided {calls} of 6 denials");
    }
}

/// On HTTP/1 the fields slidegate adds go out spelled as clients know them (the proxy hands
/// Pingora parsed names with their case), on an admitted answer and on a 429, legacy trio
/// included.
#[tokio::test]
async fn fields_are_spelled_as_clients_know_them_on_http1() {
    let up = Upstream::start();
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route(
            "legacy",
            "path_prefix = \"/\"\nlegacy_headers = true\n\
             limits = [{ requests = 1, window = \"1m\" }]",
        )
        .build();
    let proxy = Proxy::start(&toml);
    let request = b"GET /spelled HTTP/1.1\r\nHost: a\r\n\r\n";
    let admitted = common::http::exchange(proxy.addr(), request);
    let denied = common::http::exchange(proxy.addr(), request);
    assert_eq!(
        (admitted.0, denied.0),
        (200, 429),
        "{admitted:?} {denied:?}"
    );
    let spelled = [
        "RateLimit-Policy: ",
        "RateLimit: ",
        "X-RateLimit-Limit: ",
        "X-RateLimit-Remaining: ",
        "X-RateLimit-Reset: ",
        "Server: ",
    ];
    for (head, extra) in [(&admitted.1, None), (&denied.1, Some("Retry-After: "))] {
        for name in spelled.into_iter().chain(extra) {
            assert!(head.contains(&format!("\r\n{name}")), "{name:?} in {head}");
        }
    }
}

#[tokio::test]
async fn proxies_sharing_a_secret_agree_on_pk() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "pk", "one secret of the deployment\n");
    let other = secret_file(dir.path(), "pk2", "another deployment's secret");
    // Plain HTTP/1.1 here: the protocols are the test above's.
    let pem = String::new();

    // Two proxies on one Redis: one bucket, one pk; a third under another secret differs.
    let redis = RedisServer::start();
    let backend = redis.store_toml();
    let a = Proxy::start(&config(&up, &store(&backend, Some(&secret))));
    let b = Proxy::start(&config(&up, &store(&backend, Some(&secret))));
    let c = Proxy::start(&config(&up, &store(&backend, Some(&other))));
    let from_a = get(&a, &pem, Protocol::H1, "/key", "carol").await;
    let from_b = get(&b, &pem, Protocol::H1, "/key", "carol").await;
    assert_eq!(pk(&from_a), pk(&from_b));
    assert_eq!((ratelimit(&from_a)[0].r, ratelimit(&from_b)[0].r), (1, 0));
    let from_c = get(&c, &pem, Protocol::H1, "/key", "carol").await;
    assert_eq!(from_c.status, 429, "the same bucket, full");
    assert_ne!(pk(&from_c), pk(&from_a));
    // A proxy on a shared store without the secret says its pk is its own.
    let own = "RateLimit pk hashed under a secret of this process";
    let d = Proxy::start(&config(&up, &store(&backend, None)));
    assert!(d.log().contains(own), "{}", d.log());
    assert!(!a.log().contains(own), "{}", a.log());

    // The memory store: the pk comes from the secret and the prefix alone.
    let m1 = Proxy::start(&config(&up, &store("", Some(&secret))));
    let m2 = Proxy::start(&config(&up, &store("", Some(&secret))));
    let in_m1 = pk(&get(&m1, &pem, Protocol::H1, "/key", "dave").await);
    assert_eq!(
        in_m1,
        pk(&get(&m2, &pem, Protocol::H1, "/key", "dave").await)
    );
    // No secret: each process its own.
    let n1 = Proxy::start(&config(&up, ""));
    let n2 = Proxy::start(&config(&up, ""));
    let in_n1 = pk(&get(&n1, &pem, Protocol::H1, "/key", "dave").await);
    assert_ne!(
        in_n1,
        pk(&get(&n2, &pem, Protocol::H1, "/key", "dave").await)
    );
    assert_ne!(in_n1, in_m1);
}

#[test]
fn a_short_or_unreadable_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let short = secret_file(dir.path(), "short", "tooshort\n");
    for (file, message) in [
        (short, "at least 16 bytes"),
        (dir.path().join("missing"), "cannot read"),
    ] {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
             [store]\npartition_key_secret_file = \"{}\"\n",
            file.display()
        );
        assert_invalid(&text, "store.partition_key_secret_file", 5, message);
    }
}
