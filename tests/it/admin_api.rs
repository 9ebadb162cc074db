//! The inspector's JSON API on the real binary: on the memory store, on one Redis (with the local
//! deny cache) and on a real Redis Cluster. Reading a window records nothing, entries / now /
//! remaining / reset are right, reset clears a bucket and voids this proxy's cached denial,
//! errors are problem+json, and `admin_token` guards the API and page but not the probes.

use crate::common;

use std::time::Duration;

use common::admin::{admin, admin_from, enc, reset, wait_readyz, window};
use common::proxy::{send, ConfigBuilder, Proxy, ProxyOptions};
use common::redis::{shared_cluster, RedisServer};
use common::upstream::Upstream;
use serde_json::Value;

const LOGIN_WINDOW_MS: f64 = 10_000.0;

/// Three routes, one per key kind.
fn config(up: &Upstream, store: &str) -> String {
    ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "login",
            "path_prefix = \"/login\"\n\
             limits = [{ requests = 3, window = \"10s\" }, { requests = 20, window = \"1m\" }]",
        )
        .route(
            "api",
            "path_prefix = \"/api\"\nkey = \"header:X-Api-Key\"\n\
             limits = [{ requests = 2, window = \"1m\" }]",
        )
        .route(
            "all",
            "path_prefix = \"/all\"\nkey = \"global\"\nlimits = [{ requests = 5, window = \"1m\" }]",
        )
        .build()
}

async fn status_of(proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> u16 {
    send(proxy.addr(), "GET", path, headers).await.status
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn entries(limit: &Value) -> Vec<f64> {
    limit["entries_ms"]
        .as_array()
        .expect("entries_ms")
        .iter()
        .map(f)
        .collect()
}

/// The whole API contract, against whatever store `proxy` uses. `reads` is how many times the
/// window is read between decisions to show that reading records nothing.
async fn exercise(proxy: &Proxy, reads: usize) {
    // Routes: file order, keys as configured, limits with policy names, counters.
    let reply = admin(proxy, "GET", "/api/v1/routes", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let routes: Value = serde_json::from_str(&reply.body).unwrap();
    let names: Vec<&str> = routes
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["login", "api", "all"]);
    assert_eq!(routes[0]["key"], "client_ip");
    assert_eq!(routes[1]["key"], "header:x-api-key");
    assert_eq!(routes[2]["key"], "global");
    // The page acts on the kind, sent as JSON: it never parses the text.
    assert_eq!(
        routes[1]["key_spec"],
        serde_json::json!({"kind": "header", "name": "x-api-key"})
    );
    assert_eq!(
        routes[0]["limits"],
        serde_json::json!([
            {"name": "login-10s", "requests": 3, "window_ms": 10000},
            {"name": "login-60s", "requests": 20, "window_ms": 60000}
        ])
    );
    let (allowed0, denied0) = (f(&routes[0]["allowed"]), f(&routes[0]["denied"]));

    // An empty bucket.
    let w = window(proxy, "login", "127.0.0.1").await;
    assert_eq!(w["route"], "login");
    assert_eq!(w["client"], "127.0.0.1");
    assert_eq!(w["limits"][0]["count"], 0);
    assert_eq!(w["limits"][0]["remaining"], 3);
    assert_eq!(f(&w["limits"][0]["reset_ms"]), LOGIN_WINDOW_MS);
    assert!(entries(&w["limits"][0]).is_empty());

    // Two admitted requests are two entries, on the clock `now_ms` is on.
    assert_eq!(status_of(proxy, "/login", &[]).await, 200);
    assert_eq!(status_of(proxy, "/login", &[]).await, 200);
    let w = window(proxy, "login", "127.0.0.1").await;
    let now = f(&w["now_ms"]);
    for (limit, requests) in [(&w["limits"][0], 3), (&w["limits"][1], 20)] {
        let e = entries(limit);
        assert_eq!(e.len(), 2, "{w}");
        assert_eq!(limit["count"], 2);
        assert_eq!(limit["remaining"], requests - 2);
        assert!(
            e[0] <= e[1] && e[1] <= now,
            "entries sorted and not after now: {w}"
        );
        let window_ms = f(&limit["window_ms"]);
        let reset = f(&limit["reset_ms"]);
        assert!(
            (reset - (e[0] + window_ms - now)).abs() < 0.01,
            "reset_ms is when the oldest entry leaves: {w}"
        );
        assert!(reset > window_ms - 5_000.0 && reset <= window_ms, "{w}");
    }
    assert_eq!(w["limits"][0]["name"], "login-10s");

    // Reading records nothing: after many reads the limit still admits exactly one more.
    for _ in 0..reads {
        let again = window(proxy, "login", "127.0.0.1").await;
        assert_eq!(
            again["limits"][0]["count"], 2,
            "a read changed the log: {again}"
        );
    }
    assert_eq!(status_of(proxy, "/login", &[]).await, 200);
    let denied = send(proxy.addr(), "GET", "/login", &[]).await;
    assert_eq!(denied.status, 429, "exactly 3 admitted after {reads} reads");
    let w = window(proxy, "login", "127.0.0.1").await;
    assert_eq!(w["limits"][0]["remaining"], 0);
    assert_eq!(w["limits"][0]["count"], 3);
    let retry: f64 = denied.header("retry-after").unwrap().parse().unwrap();
    let reset_s = f(&w["limits"][0]["reset_ms"]) / 1000.0;
    assert!(
        reset_s <= retry && retry <= reset_s.ceil() + 1.0,
        "Retry-After {retry} vs reset {reset_s}"
    );

    // Reset clears the bucket, and the next request is decided afresh (a cached denial in a
    // deny cache would answer 429 here).
    reset(proxy, "login", "127.0.0.1").await;
    let w = window(proxy, "login", "127.0.0.1").await;
    assert_eq!(w["limits"][0]["count"], 0, "{w}");
    assert_eq!(w["limits"][1]["count"], 0, "{w}");
    let statuses = [
        status_of(proxy, "/login", &[]).await,
        status_of(proxy, "/login", &[]).await,
        status_of(proxy, "/login", &[]).await,
        status_of(proxy, "/login", &[]).await,
    ];
    assert_eq!(statuses, [200, 200, 200, 429], "after reset");

    // Header keys: the value as sent, hashed exactly as the proxy hashes long or odd values.
    let long = "k".repeat(100);
    for key in ["k1", long.as_str(), "a b{c}"] {
        assert_eq!(status_of(proxy, "/api", &[("x-api-key", key)]).await, 200);
        let w = window(proxy, "api", key).await;
        assert_eq!(w["limits"][0]["count"], 1, "key {key:?}: {w}");
        assert_eq!(w["limits"][0]["remaining"], 1);
    }
    assert_eq!(window(proxy, "api", "k2").await["limits"][0]["count"], 0);

    // Global: one bucket, no client.
    assert_eq!(status_of(proxy, "/all", &[]).await, 200);
    assert_eq!(window(proxy, "all", "").await["limits"][0]["count"], 1);

    // Counters on the routes listing.
    let routes: Value =
        serde_json::from_str(&admin(proxy, "GET", "/api/v1/routes", &[]).await.body).unwrap();
    assert_eq!(f(&routes[0]["allowed"]) - allowed0, 6.0);
    assert_eq!(f(&routes[0]["denied"]) - denied0, 2.0);

    // Errors.
    let r = admin(
        proxy,
        "GET",
        "/api/v1/window?route=nope&client=1.2.3.4",
        &[],
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let problem: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(problem["status"], 404);
    for bad in [
        "/api/v1/window",
        "/api/v1/window?client=1.2.3.4",
        "/api/v1/window?route=login&client=not-an-ip",
        "/api/v1/window?route=login",
        "/api/v1/window?route=login&client=1.2.3.4&extra=1",
        "/api/v1/window?route=login&route=api&client=1.2.3.4",
        "/api/v1/window?route=api&client=",
        "/api/v1/window?route=all&client=someone",
    ] {
        let r = admin(proxy, "GET", bad, &[]).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    let r = admin(
        proxy,
        "POST",
        "/api/v1/reset?route=nope&client=1.2.3.4",
        &[],
    )
    .await;
    assert_eq!(r.status, 404);
    let r = admin(
        proxy,
        "GET",
        "/api/v1/reset?route=login&client=1.2.3.4",
        &[],
    )
    .await;
    assert_eq!(r.status, 405, "reset is a POST");
    let r = admin(
        proxy,
        "GET",
        &format!("/api/v1/window?route=login&client={}", enc("::1")),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "IPv6 clients: {}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_on_the_memory_store() {
    let up = Upstream::start();
    let proxy = Proxy::start(&config(&up, "backend = \"memory\""));
    exercise(&proxy, 200).await;
    let w = window(&proxy, "login", "127.0.0.1").await;
    assert_eq!(w["backend"], "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_on_redis_reads_nothing_into_the_log_and_reset_voids_the_deny_cache() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\nlocal_deny_cache = true",
        redis.url()
    );
    let proxy = Proxy::start(&config(&up, &store));
    wait_readyz(&proxy, 200, Duration::from_secs(20));

    // Reads leave the keys byte-for-byte alone, TTL included (no PEXPIRE refresh).
    assert_eq!(status_of(&proxy, "/login", &[]).await, 200);
    let mut conn = redis.connection();
    let key = "slidegate:{login:ip:127.0.0.1}:10000";
    let before: Vec<i64> = ::redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    let ttl_before: i64 = ::redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
    let w = window(&proxy, "login", "127.0.0.1").await;
    assert_eq!(
        entries(&w["limits"][0]),
        before
            .iter()
            .map(|&us| us as f64 / 1000.0)
            .collect::<Vec<_>>(),
        "entries_ms are the log's µs timestamps"
    );
    for _ in 0..100 {
        window(&proxy, "login", "127.0.0.1").await;
    }
    let after: Vec<i64> = ::redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    let ttl_after: i64 = ::redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
    assert_eq!(before, after, "100 reads changed the log");
    assert!(ttl_after <= ttl_before, "a read refreshed the TTL");
    // now_ms is Redis's clock.
    let (secs, micros): (u64, u64) = ::redis::cmd("TIME").query(&mut conn).unwrap();
    let redis_now = (secs * 1_000_000 + micros) as f64 / 1000.0;
    let w = window(&proxy, "login", "127.0.0.1").await;
    assert!(
        (f(&w["now_ms"]) - redis_now).abs() < 2_000.0,
        "{w} vs {redis_now}"
    );
    assert_eq!(w["backend"], "redis");
    ::redis::cmd("DEL")
        .arg(key)
        .query::<i64>(&mut conn)
        .unwrap();
    ::redis::cmd("DEL")
        .arg("slidegate:{login:ip:127.0.0.1}:60000")
        .query::<i64>(&mut conn)
        .unwrap();

    // The full contract; the 429 before the reset is cached locally, so the 200 right after
    // the reset shows the reset voided it.
    exercise(&proxy, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_on_a_redis_cluster() {
    let cluster = shared_cluster();
    let up = Upstream::start();
    let store = format!("{}\ntimeout = \"2s\"", cluster.own_store());
    let proxy = Proxy::start(&config(&up, &store));
    wait_readyz(&proxy, 200, Duration::from_secs(30));
    exercise(&proxy, 50).await;
    // Buckets on every shard: header keys hash to different slots.
    for i in 0..12 {
        let key = format!("tenant-{i}");
        assert_eq!(status_of(&proxy, "/api", &[("x-api-key", &key)]).await, 200);
        let w = window(&proxy, "api", &key).await;
        assert_eq!(w["limits"][0]["count"], 1, "{key}: {w}");
        reset(&proxy, "api", &key).await;
        assert_eq!(window(&proxy, "api", &key).await["limits"][0]["count"], 0);
    }
    assert_eq!(
        window(&proxy, "api", "tenant-0").await["backend"],
        "redis_cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_guards_the_inspector_but_not_the_probes() {
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &config(&up, "backend = \"memory\""),
        ProxyOptions {
            server_extra: "admin_token = \"s3cret-token-0123456789\"".into(),
            ..ProxyOptions::default()
        },
    );
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "ops:s3cret-token-0123456789"
        )
    );
    let wrong_basic = format!(
        "Basic {}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "ops:guess")
    );
    let mut failures = 0u8;
    for path in [
        "/api/v1/routes",
        "/api/v1/window?route=login&client=1.2.3.4",
        "/",
        "/assets/app.js",
    ] {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer "),
            Some(wrong_basic.as_str()),
        ] {
            let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
            // Each wrong try from an address of its own: one address is slowed after 5
            // (tests/it/admin_guard.rs).
            failures += 1;
            let from = std::net::IpAddr::from([127, 0, 1, failures]);
            let r = admin_from(&proxy, from, "GET", path, &headers).await;
            assert_eq!(r.status, 401, "{path} with {auth:?}");
            assert!(
                r.headers
                    .get_all("www-authenticate")
                    .iter()
                    .any(|v| v.to_str().unwrap().starts_with("Basic")),
                "a browser is asked for the token"
            );
        }
        for auth in ["Bearer s3cret-token-0123456789", basic.as_str()] {
            let r = admin(&proxy, "GET", path, &[("authorization", auth)]).await;
            assert_eq!(r.status, 200, "{path} with {auth}: {}", r.body);
        }
    }
    let r = admin(
        &proxy,
        "POST",
        "/api/v1/reset?route=login&client=1.2.3.4",
        &[],
    )
    .await;
    assert_eq!(r.status, 401);
    for open in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(admin(&proxy, "GET", open, &[]).await.status, 200, "{open}");
    }
    assert!(
        !proxy.log().contains("not a loopback address"),
        "no warning for a loopback admin listener with a token"
    );
}

#[test]
fn an_empty_admin_token_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\nadmin_token = \"\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("-c")
        .arg(&path)
        .arg("-t")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("bad.toml:4: `server.admin_token`"),
        "names file, line and key: {stderr}"
    );
}

/// Run `scripts/boundary-test` against `proxy`; exit success and its output.
fn boundary_test(proxy: &Proxy, args: &[&str]) -> (bool, String) {
    common::require_tool("python3", "python3");
    let out = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/boundary-test"),
    )
    .arg("--proxy")
    .arg(format!("http://{}", proxy.addr()))
    .arg("--admin")
    .arg(format!("http://{}", proxy.admin_addr()))
    .args(args)
    .output()
    .expect("run scripts/boundary-test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_test_script_on_memory_and_redis() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let redis_store = format!("backend = \"redis\"\nurl = \"{}\"", redis.url());
    for store in ["backend = \"memory\"", redis_store.as_str()] {
        let toml = ConfigBuilder::new()
            .store(store)
            .upstream("app", up.addr())
            .route(
                "login",
                "path_prefix = \"/login\"\n\
                 limits = [{ requests = 4, window = \"30s\" }, { requests = 50, window = \"1m\" }]",
            )
            .route(
                "api",
                "path_prefix = \"/api\"\nkey = \"header:X-Api-Key\"\n\
                 limits = [{ requests = 3, window = \"30s\" }]",
            )
            .route(
                "tenant",
                "host = \"*.example.com\"\npath_prefix = \"/t\"\n\
                 limits = [{ requests = 2, window = \"30s\" }]",
            )
            .route(
                "dry",
                "path_prefix = \"/dry\"\nshadow = true\nlimits = [{ requests = 1, window = \"1m\" }]",
            )
            .route(
                "combo",
                "path_prefix = \"/combo\"\n\
                 key = [\"header:X-Api-Key\", \"query:t\", \"cookie:sid\", \"method\", \"client_ip\"]\n\
                 limits = [{ requests = 3, window = \"30s\" }]",
            )
            .build();
        let proxy = Proxy::start(&toml);
        wait_readyz(&proxy, 200, Duration::from_secs(20));
        // Twice: the second run starts from a full bucket, which the reset must clear.
        for _ in 0..2 {
            let (ok, out) = boundary_test(&proxy, &["--route", "login", "--path", "/login"]);
            assert!(ok && out.contains("PASS"), "{store}:\n{out}");
            assert!(out.contains("4 requests: 4 passed"), "{out}");
            assert!(out.contains("request 5: 429, Retry-After: "), "{out}");
            assert!(
                out.contains("login-30s: 4 in window, remaining 0/4"),
                "{out}"
            );
        }
        let (ok, out) = boundary_test(
            &proxy,
            &["--route", "api", "--path", "/api/x", "--client", "tenant-7"],
        );
        assert!(ok, "{store}:\n{out}");
        assert_eq!(
            window(&proxy, "api", "tenant-7").await["limits"][0]["count"],
            3
        );
        // A composite client: one entry per part, each sent where its part reads it.
        let combo = r#"["k9", "t 1", "s1", "POST", "127.0.0.1"]"#;
        let (ok, out) = boundary_test(
            &proxy,
            &["--route", "combo", "--path", "/combo/x", "--client", combo],
        );
        assert!(
            ok && out.contains("3 requests: 3 passed"),
            "{store}:\n{out}"
        );
        assert_eq!(
            window(&proxy, "combo", combo).await["limits"][0]["count"],
            3
        );
        // A route matched by host: only with `--host` do the requests reach it.
        let (ok, out) = boundary_test(&proxy, &["--route", "tenant", "--path", "/t/x"]);
        assert!(!ok && out.contains("FAIL"), "without --host: {out}");
        let (ok, out) = boundary_test(
            &proxy,
            &[
                "--route",
                "tenant",
                "--path",
                "/t/x",
                "--host",
                "a.example.com",
            ],
        );
        assert!(
            ok && out.contains("2 requests: 2 passed"),
            "{store}:\n{out}"
        );
        let (ok, out) = boundary_test(&proxy, &["--route", "dry", "--path", "/dry"]);
        assert!(
            !ok && out.contains("shadow"),
            "a shadow route cannot show a boundary: {out}"
        );
        // A path the route does not take: the boundary does not hold, and the script says so.
        let (ok, out) = boundary_test(&proxy, &["--route", "login", "--path", "/api/x"]);
        assert!(!ok && out.contains("FAIL"), "{out}");
    }
}
