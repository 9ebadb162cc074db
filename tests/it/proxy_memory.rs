//! End to end with the memory store: the real slidegate binary in front of a real upstream, real
//! client connections over loopback. Each test has its own proxy, upstream and ports.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::{closed_addr, connect, get, limit, limited, send, ConfigBuilder, Proxy, Reply};
use common::ratelimit::{parse_ratelimit, retry_after, violated};
use common::upstream::{Upstream, UPSTREAM_BODY};

fn assert_no_ratelimit_headers(reply: &Reply) {
    for h in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert!(reply.header(h).is_none(), "unexpected {h}: {reply:?}");
    }
}

// ---------------------------------------------------------------------------------------------

/// 3000 clients at once, each on its own TCP connection, against 10 per minute: exactly 10 get
/// through to the upstream, exactly 2990 get 429, and `/metrics` agrees with the clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_limit_passes_under_3000_concurrent_connections() {
    const CLIENTS: usize = 3000;
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("flood", &limited("/", 10, "1m"))
            .build(),
    );
    let addr = proxy.addr();

    // Every client first opens its connection, then all send their request together.
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        let barrier = barrier.clone();
        tasks.spawn(async move {
            let conn = connect(addr).await;
            barrier.wait().await;
            let path = format!("/flood/{i}");
            match conn {
                Ok(conn) => {
                    tokio::time::timeout(Duration::from_secs(60), conn.send("GET", &path, &[]))
                        .await
                        .unwrap_or_else(|_| Err("no response in 60 s".into()))
                }
                Err(e) => Err(e),
            }
        });
    }
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("client task") {
            Ok(reply) => *statuses.entry(reply.status).or_default() += 1,
            Err(e) => errors.push(e),
        }
    }
    let elapsed = started.elapsed();
    let allowed = statuses.get(&200).copied().unwrap_or(0);
    let denied = statuses.get(&429).copied().unwrap_or(0);
    let m_allowed = proxy.decisions("flood", "allowed");
    let m_denied = proxy.decisions("flood", "denied");
    println!(
        "{CLIENTS} concurrent connections in {elapsed:?}: statuses {statuses:?}, transport errors {}, \
         upstream hits {}, metrics allowed={m_allowed} denied={m_denied}",
        errors.len(),
        up.hits()
    );
    assert!(
        errors.is_empty(),
        "{} client errors, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert_eq!(allowed, 10, "statuses {statuses:?}");
    assert_eq!(denied, CLIENTS - 10, "statuses {statuses:?}");
    assert_eq!(up.hits(), 10, "requests that reached the upstream");
    assert_eq!(m_allowed, allowed as u64);
    assert_eq!(m_denied, denied as u64);
}

/// `RateLimit-Policy` and `RateLimit` on allowed responses, counting down; the 429 with
/// `Retry-After`, its problem body, and the largest Retry-After of the denying limits.
#[tokio::test]
async fn ratelimit_headers_retry_after_and_problem_body() {
    let up = Upstream::start();
    let stacked = |p: &str, a: (u32, &str), b: (u32, &str)| {
        format!(
            "path_prefix = \"{p}\"\nlimits = [ {{ requests = {}, window = \"{}\" }}, {{ requests = {}, window = \"{}\" }} ]",
            a.0, a.1, b.0, b.1
        )
    };
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("one", &limited("/one", 5, "1s"))
            .route("hdr", &limited("/hdr", 5, "1m"))
            .route("stack", &stacked("/stack", (2, "5s"), (2, "1m")))
            .route("stackrev", &stacked("/rev", (2, "1m"), (2, "5s")))
            .route("short", &stacked("/short", (2, "5s"), (10, "1m")))
            .build(),
    );
    let addr = proxy.addr();

    // Exact structured-field format, 1 s window.
    let r = get(addr, "/one").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, UPSTREAM_BODY);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""one-1s";q=5;w=1"#));
    let field = r
        .header("ratelimit")
        .expect("RateLimit on an allowed response");
    let pk = field.strip_prefix(r#""one-1s";r=4;t=1;pk=:"#);
    assert_eq!(
        pk.map(str::len),
        Some(17),
        "16 base64 characters and a colon: {field}"
    );

    // Remaining counts down (a 1 min window, so a slow machine cannot slide it meanwhile).
    for expected_r in (0..5).rev() {
        let r = get(addr, "/hdr").await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("ratelimit-policy"), Some(r#""hdr-60s";q=5;w=60"#));
        let items = parse_ratelimit(
            r.header("ratelimit")
                .expect("RateLimit on an allowed response"),
        );
        assert_eq!(items.len(), 1);
        assert_eq!(
            (items[0].name.as_str(), items[0].r),
            ("hdr-60s", expected_r)
        );
        assert!((55..=60).contains(&items[0].t), "t={} in {r:?}", items[0].t);
        assert!(r.header("retry-after").is_none());
    }
    let r = get(addr, "/hdr").await;
    assert_eq!(violated(&r), ["hdr-60s"]);
    let wait = retry_after(&r);
    assert!(
        (1..=60).contains(&wait),
        "Retry-After {wait} outside 1..=60"
    );
    assert!(
        wait >= 55,
        "Retry-After {wait}: the oldest entry is only moments old"
    );
    assert_eq!(r.header("ratelimit-policy"), Some(r#""hdr-60s";q=5;w=60"#));
    let items = parse_ratelimit(r.header("ratelimit").expect("RateLimit on the 429"));
    assert_eq!((items[0].r, items[0].t), (0, wait));
    assert_eq!(up.hits(), 6, "1 + 5 allowed requests reached the upstream");

    // Stacked limits, both full: the larger wait (the minute) wins, whatever the order.
    for (route, path) in [("stack", "/stack"), ("stackrev", "/rev")] {
        for _ in 0..2 {
            assert_eq!(get(addr, path).await.status, 200);
        }
        let r = get(addr, path).await;
        let mut v = violated(&r);
        v.sort();
        assert_eq!(v, [format!("{route}-5s"), format!("{route}-60s")], "{r:?}");
        let wait = retry_after(&r);
        assert!(
            (55..=60).contains(&wait),
            "{route}: Retry-After {wait}, expected the 1 min limit's"
        );
    }

    // Only the short limit is full: its wait, not the minute's reset, is the Retry-After.
    for _ in 0..2 {
        assert_eq!(get(addr, "/short").await.status, 200);
    }
    let r = get(addr, "/short").await;
    assert_eq!(violated(&r), ["short-5s"]);
    let wait = retry_after(&r);
    assert!(
        (1..=5).contains(&wait),
        "Retry-After {wait}, expected at most 5"
    );
    let items = parse_ratelimit(r.header("ratelimit").unwrap());
    let summary: Vec<(&str, u64)> = items.iter().map(|i| (i.name.as_str(), i.r)).collect();
    assert_eq!(summary, [("short-5s", 0), ("short-60s", 8)]);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""short-5s";q=2;w=5, "short-60s";q=10;w=60"#)
    );
}

/// A route without limits: proxied, no rate-limit headers, never 429.
#[tokio::test]
async fn route_without_limits_is_never_limited() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("free", "limits = []")
            .build(),
    );
    for _ in 0..30 {
        let r = get(proxy.addr(), "/anything").await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body, UPSTREAM_BODY);
        assert_no_ratelimit_headers(&r);
    }
    assert_eq!(up.hits(), 30);
    assert_eq!(proxy.decisions("free", "allowed"), 30);
    assert_eq!(proxy.decisions("free", "denied"), 0);
}

/// With 127.0.0.0/8 trusted, the client is the rightmost untrusted `X-Forwarded-For` hop: each
/// forwarded client has its own bucket, and a forged left-most entry gains nothing.
#[tokio::test]
async fn xff_from_trusted_proxy_separates_clients() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .trusted_proxies(&["127.0.0.0/8"])
            .upstream("app", up.addr())
            .route("xff", &limited("/", 2, "1m"))
            .build(),
    );
    let addr = proxy.addr();
    let with_xff = |v: &'static str| async move {
        send(addr, "GET", "/", &[("x-forwarded-for", v)])
            .await
            .status
    };

    assert_eq!(with_xff("203.0.113.1").await, 200);
    assert_eq!(
        up.last_xff().as_deref(),
        Some("203.0.113.1, 127.0.0.1"),
        "the proxy appends its peer"
    );
    assert_eq!(with_xff("203.0.113.1").await, 200);
    assert_eq!(
        with_xff("203.0.113.1").await,
        429,
        "third request of 203.0.113.1"
    );
    // Another client behind the same proxy has its own quota.
    assert_eq!(with_xff("203.0.113.2").await, 200);
    // Forged left-most entries change nothing: the rightmost untrusted hop is the client.
    assert_eq!(with_xff("6.6.6.6, 203.0.113.1").await, 429);
    assert_eq!(with_xff("198.51.100.7, 6.6.6.6, 203.0.113.1").await, 429);
    // Trusted hops on the right are skipped.
    assert_eq!(with_xff("203.0.113.1, 127.0.0.9").await, 429);
    // Several header lines form one list: the client is 203.0.113.2 (its second request).
    let r = send(
        addr,
        "GET",
        "/",
        &[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.2"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(with_xff("203.0.113.2").await, 429);
    // A direct request (no XFF) is the peer itself, a bucket of its own.
    assert_eq!(get(addr, "/").await.status, 200);
    assert_eq!(up.hits(), 5);
}

/// With no trusted proxies, `X-Forwarded-For` is ignored: every request from 127.0.0.1 shares
/// the peer's bucket, whatever it claims.
#[tokio::test]
async fn xff_is_ignored_without_trusted_proxies() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("xff", &limited("/", 2, "1m"))
            .build(),
    );
    let addr = proxy.addr();
    let with_xff = |v: &'static str| async move {
        send(addr, "GET", "/", &[("x-forwarded-for", v)])
            .await
            .status
    };
    assert_eq!(with_xff("203.0.113.1").await, 200);
    assert_eq!(with_xff("203.0.113.2").await, 200);
    assert_eq!(with_xff("203.0.113.3").await, 429);
    assert_eq!(with_xff("203.0.113.1").await, 429);
    assert_eq!(get(addr, "/").await.status, 429);
    assert_eq!(up.hits(), 2);
    // Still forwarded, with the peer appended, for the upstream's information.
    assert_eq!(up.xff()[1].as_deref(), Some("203.0.113.2, 127.0.0.1"));
}

/// `key = "header:X-Api-Key"`: one bucket per key; without the header the client IP is the key
/// (neither unlimited nor shared with any header value); huge values work (hashed).
#[tokio::test]
async fn header_key_buckets() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "api",
                &format!("key = \"header:X-Api-Key\"\n{}", limit(2, "1m")),
            )
            .build(),
    );
    let addr = proxy.addr();
    let keyed =
        |key: String| async move { send(addr, "GET", "/", &[("x-api-key", &key)]).await.status };

    assert_eq!(keyed("alpha".into()).await, 200);
    assert_eq!(keyed("alpha".into()).await, 200);
    assert_eq!(keyed("alpha".into()).await, 429);
    assert_eq!(
        keyed("beta".into()).await,
        200,
        "another key has its own quota"
    );

    // No header: keyed by client address, and limited like any other bucket.
    assert_eq!(get(addr, "/").await.status, 200);
    assert_eq!(get(addr, "/").await.status, 200);
    assert_eq!(
        get(addr, "/").await.status,
        429,
        "missing header must not be unlimited"
    );
    // An empty value counts as missing.
    assert_eq!(keyed(String::new()).await, 429);
    // The address bucket is not the bucket of a header value, even one spelling that address.
    assert_eq!(keyed("127.0.0.1".into()).await, 200);
    assert_eq!(keyed("gamma".into()).await, 200);

    // 10 KB values: accepted, counted, and distinguished by their whole content.
    let big_a = "a".repeat(10 * 1024);
    let mut big_a2 = "a".repeat(10 * 1024 - 1);
    big_a2.push('b');
    assert_eq!(keyed(big_a.clone()).await, 200);
    assert_eq!(keyed(big_a.clone()).await, 200);
    assert_eq!(keyed(big_a).await, 429);
    assert_eq!(keyed(big_a2).await, 200, "differs only in its last byte");
    assert_eq!(up.hits(), 10);
}

/// No route matches: 404 problem+json, counted in `slidegate_no_route_total`, nothing proxied.
#[tokio::test]
async fn no_route_is_404_and_counted() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("api", &limited("/api", 100, "1m"))
            .build(),
    );
    assert_eq!(proxy.counter("slidegate_no_route_total"), 0);
    let r = get(proxy.addr(), "/other").await;
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(get(proxy.addr(), "/").await.status, 404);
    assert_eq!(get(proxy.addr(), "/ap").await.status, 404);
    assert_eq!(proxy.counter("slidegate_no_route_total"), 3);
    assert_eq!(up.hits(), 0);
    assert_eq!(get(proxy.addr(), "/api/v1").await.status, 200);
    assert_eq!(proxy.counter("slidegate_no_route_total"), 3);
    assert_eq!(up.hits(), 1);
}

/// An upstream that refuses connections: 502, and the proxy keeps serving.
#[tokio::test]
async fn dead_upstream_is_502_and_proxy_survives() {
    let up = Upstream::start();
    let mut proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("dead", closed_addr())
            .upstream("live", up.addr())
            .route(
                "down",
                &format!("upstream = \"dead\"\n{}", limited("/down", 100, "1m")),
            )
            .route(
                "up",
                &format!("upstream = \"live\"\n{}", limited("/up", 100, "1m")),
            )
            .build(),
    );
    for _ in 0..3 {
        let started = Instant::now();
        let r = get(proxy.addr(), "/down").await;
        assert_eq!(r.status, 502, "{r:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused connect took {:?}",
            started.elapsed()
        );
    }
    assert!(proxy.is_running(), "proxy died; log:\n{}", proxy.log());
    assert_eq!(proxy.admin_get("/healthz").0, 200);
    let r = get(proxy.addr(), "/up").await;
    assert_eq!((r.status, r.body.as_str()), (200, UPSTREAM_BODY));
    assert_eq!(proxy.decisions("down", "allowed"), 3);
}

/// Shadow mode: over the limit still gets the upstream's 200 (and no rate-limit headers), and
/// the would-be denials are counted as `shadow_denied`.
#[tokio::test]
async fn shadow_route_counts_but_never_denies() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("dry", &format!("shadow = true\n{}", limited("/", 2, "1m")))
            .build(),
    );
    for i in 0..5 {
        let r = get(proxy.addr(), "/").await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, UPSTREAM_BODY),
            "request {i}: {r:?}"
        );
        assert_no_ratelimit_headers(&r);
    }
    assert_eq!(up.hits(), 5);
    let sample = |d: &str| {
        proxy.counter(&format!(
            r#"slidegate_requests_total{{route="dry",decision="{d}"}}"#
        ))
    };
    assert_eq!(sample("allowed"), 2);
    assert_eq!(sample("shadow_denied"), 3);
    assert_eq!(sample("denied"), 0);
}

/// Host (`*.domain`, exact; case and port ignored) and method matching, first match wins.
#[tokio::test]
async fn host_and_method_matching() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "wild",
                &format!("host = \"*.example.com\"\n{}", limit(100, "1m")),
            )
            .route(
                "exact",
                &format!("host = \"api.test\"\n{}", limit(100, "1m")),
            )
            .route(
                "posts",
                &format!(
                    "path_prefix = \"/m\"\nmethods = [\"post\", \"PUT\"]\n{}",
                    limit(100, "1m")
                ),
            )
            .build(),
    );
    let addr = proxy.addr();
    // Which route answered: the policy name in RateLimit-Policy, or 404.
    let route_of = |method: &'static str, host: &'static str, path: &'static str| async move {
        let r = send(addr, method, path, &[("host", host)]).await;
        match r.status {
            200 => {
                let policy = r
                    .header("ratelimit-policy")
                    .expect("policy on a limited route");
                let name = policy.trim_start_matches('"').split('"').next().unwrap();
                name.trim_end_matches("-60s").to_string()
            }
            404 => "404".to_string(),
            other => panic!("{method} {host}{path}: unexpected {other}: {r:?}"),
        }
    };
    let cases = [
        ("GET", "a.example.com", "/", "wild"),
        ("GET", "A.B.Example.COM:8443", "/x", "wild"),
        ("POST", "a.example.com", "/m", "wild"), // file order: wild comes first
        ("GET", "example.com", "/", "404"),      // `*.` needs a subdomain
        ("GET", "badexample.com", "/", "404"),
        ("GET", "api.test", "/", "exact"),
        ("GET", "API.TEST:80", "/", "exact"),
        ("GET", "x.api.test", "/", "404"),
        ("POST", "other.host", "/m", "posts"),
        ("PUT", "other.host", "/m/1", "posts"),
        ("GET", "other.host", "/m", "404"),
        ("DELETE", "other.host", "/m", "404"),
        ("POST", "other.host", "/n", "404"),
    ];
    let mut wrong = Vec::new();
    for (method, host, path, want) in cases {
        let got = route_of(method, host, path).await;
        if got != want {
            wrong.push(format!("{method} {host}{path}: got {got}, want {want}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(up.hits(), 7);
}

/// A pool with one dead server: like nginx's `proxy_next_upstream error`, a refused connect is
/// retried on the next server, so clients never see the dead one; a pool of only dead servers
/// still answers 502.
#[tokio::test]
async fn refused_server_is_skipped_for_the_next_one_in_the_pool() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream_servers("pool", &[closed_addr().to_string(), up.addr().to_string()])
            .upstream_servers(
                "alldead",
                &[closed_addr().to_string(), closed_addr().to_string()],
            )
            .route("dead", "upstream = \"alldead\"\npath_prefix = \"/dead\"")
            .route("pool", "upstream = \"pool\"")
            .build(),
    );
    for _ in 0..6 {
        let r = get(proxy.addr(), "/x").await;
        assert_eq!((r.status, r.body.as_str()), (200, UPSTREAM_BODY));
    }
    assert_eq!(up.hits(), 6);
    assert_eq!(get(proxy.addr(), "/dead").await.status, 502);
}

/// Upstream frameworks decode and normalise paths before routing, so the proxy must too:
/// encoded and doubled-slash spellings of a limited path share its limit instead of slipping
/// through to an unlimited route; dot-segment spellings, which apps resolve differently, are
/// refused (`tests/it/path_spellings.rs` has every protocol).
#[tokio::test]
async fn encoded_and_dotted_paths_cannot_bypass_a_route() {
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("login", &limited("/login", 1, "1h"))
            .route("default", "path_prefix = \"/\"")
            .build(),
    );
    assert_eq!(get(proxy.addr(), "/login").await.status, 200);
    for path in ["/%6cogin", "//login", "/;x/login"] {
        let r = get(proxy.addr(), path).await;
        assert_eq!(r.status, 429, "{path} bypassed the login limit: {r:?}");
    }
    for path in ["/x/../login", "/./login", "/%2e/login"] {
        let r = get(proxy.addr(), path).await;
        assert_eq!(r.status, 400, "{path} reached a route: {r:?}");
    }
    assert_eq!(get(proxy.addr(), "/logout-not-login").await.status, 200);
    assert_eq!(up.hits(), 2);
}

/// `X-Forwarded-For` reaches the upstream like nginx's `$proxy_add_x_forwarded_for`: every
/// line the client sent, in order, then the socket peer.
#[tokio::test]
async fn x_forwarded_for_lines_are_joined_and_the_peer_appended() {
    let up = Upstream::start();
    let proxy = Proxy::start(&ConfigBuilder::unlimited(up.addr()));
    let headers = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "203.0.113.9"),
    ];
    assert_eq!(send(proxy.addr(), "GET", "/", &headers).await.status, 200);
    assert_eq!(
        up.last_xff().as_deref(),
        Some("6.6.6.6, 203.0.113.9, 127.0.0.1")
    );
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
    assert_eq!(up.last_xff().as_deref(), Some("127.0.0.1"));
}
