//! Edge hardening (issue 9), through the real binary with raw TCP sockets and the exact bytes:
//! request forms an upstream would route differently, slow and idle clients, the connection cap
//! under a low descriptor limit, per-upstream timeouts, and the capped deny cache.
//!
//! What nginx 1.22 does with the same bytes is in the README's hostile-input table.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::proxy::{
    exchange, http_get_blocking, read_response, request, send, ConfigBuilder, Proxy, ProxyOptions,
};
use common::redis::RedisServer;
use common::upstream::{Upstream, DELAY_HEADER};

/// The setup: a limited host route, a limited `/login` route and a case-insensitive
/// limited `/api` route (1 request per hour each), and an unlimited catch-all.
fn form_proxy(up: &Upstream) -> Proxy {
    Proxy::start(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "admin",
                "host = \"admin.example.com\"\nlimits = [{ requests = 1, window = \"1h\" }]",
            )
            .route(
                "login",
                "path_prefix = \"/login\"\nlimits = [{ requests = 1, window = \"1h\" }]",
            )
            .route(
                "api",
                "path_prefix = \"/api\"\npath_case_insensitive = true\n\
                 limits = [{ requests = 1, window = \"1h\" }]",
            )
            .route("all", "path_prefix = \"/\"")
            .build(),
    )
}

/// No request form reaches the upstream past a full limit: absolute-form targets route by their
/// authority (and go upstream in origin-form with that Host), malformed Hosts, targets that are
/// neither origin- nor absolute-form and non-upper-case methods are 400, a list-valued
/// Content-Length goes upstream as one value, path case follows `path_case_insensitive`.
#[test]
fn request_forms_cannot_slip_past_a_full_limit() {
    let up = Upstream::start();
    let proxy = form_proxy(&up);
    let addr = proxy.addr();

    // Absolute-form without Host: the authority is the host. The first one is admitted and
    // goes upstream in origin-form with `Host: admin.example.com`.
    let (status, text) = exchange(addr, b"GET http://admin.example.com/first HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200, "{text}");
    let head = up.heads().pop().expect("forwarded");
    assert_eq!(head.target, "/first");
    assert_eq!(head.host, ["admin.example.com"]);
    let hits = up.hits();
    let mut report = Vec::new();
    let cases: &[(&str, &[u8], u16)] = &[
        (
            "absolute-form, no Host",
            b"GET http://admin.example.com/x HTTP/1.1\r\n\r\n",
            429,
        ),
        (
            "absolute-form, HTTP/1.0",
            b"GET http://admin.example.com/x HTTP/1.0\r\n\r\n",
            429,
        ),
        (
            "absolute-form, upper case",
            b"GET HTTP://ADMIN.EXAMPLE.COM/x HTTP/1.1\r\n\r\n",
            429,
        ),
        (
            "absolute-form, trailing dot",
            b"GET http://admin.example.com./x HTTP/1.1\r\n\r\n",
            429,
        ),
        (
            "absolute-form with port",
            b"GET http://Admin.Example.com:80/x HTTP/1.1\r\n\r\n",
            429,
        ),
        (
            "Host with trailing dot and port",
            b"GET /x HTTP/1.1\r\nHost: ADMIN.example.com.:8080\r\n\r\n",
            429,
        ),
        (
            "Host port not numeric",
            b"GET /x HTTP/1.1\r\nHost: admin.example.com:abc\r\n\r\n",
            400,
        ),
        (
            "Host with two ports",
            b"GET /x HTTP/1.1\r\nHost: admin.example.com:80:80\r\n\r\n",
            400,
        ),
        (
            "Host with a slash",
            b"GET /x HTTP/1.1\r\nHost: admin.example.com/x\r\n\r\n",
            400,
        ),
        ("HTTP/1.1 without Host", b"GET /x HTTP/1.1\r\n\r\n", 400),
        (
            "target without slash",
            b"GET login HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        (
            "target %2F",
            b"GET %2Flogin HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        (
            "asterisk with GET",
            b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        (
            "lower-case method",
            b"post /login HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            400,
        ),
        (
            "mixed-case method",
            b"Get /login HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
        ),
        (
            "CONNECT",
            b"CONNECT admin.example.com:443 HTTP/1.1\r\nHost: admin.example.com:443\r\n\r\n",
            405,
        ),
        (
            "Content-Length 5, 6",
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello",
            400,
        ),
    ];
    for (what, bytes, want) in cases {
        let (status, text) = exchange(addr, bytes);
        report.push(format!("{what}: {status}"));
        assert_eq!(status, *want, "{what}: {text}");
    }
    assert_eq!(
        up.hits(),
        hits,
        "a refused or denied form reached the upstream"
    );

    // List-valued Content-Length: admitted once, forwarded as one value; then limited.
    let (status, text) = exchange(
        addr,
        b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello",
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(up.heads().pop().unwrap().content_length, ["5"]);
    let (status, text) = exchange(
        addr,
        b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(status, 429, "{text}");

    // Path case: /login matches case-sensitively (like nginx `location`), /api does not.
    let (status, _) = exchange(addr, b"GET /api/a HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200);
    let (status, _) = exchange(addr, b"GET /API/a HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(
        status, 429,
        "/API counts against the case-insensitive /api route"
    );
    let (status, _) = exchange(addr, b"GET /LOGIN HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(
        status, 200,
        "/LOGIN is another path for a case-sensitive route"
    );

    // OPTIONS * keeps its meaning: it goes to the route that takes `/`.
    let (status, text) = exchange(addr, b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200, "{text}");
    assert_eq!(up.heads().pop().unwrap().method, "OPTIONS");
    let bad = proxy.counter("slidegate_bad_requests_total");
    println!("{}\nslidegate_bad_requests_total {bad}", report.join("\n"));
    // The 400s slidegate gives itself (the rest come from Pingora's own parser checks).
    assert!(bad >= 8, "{bad}");
}

/// Connections that trickle a header byte every 100 ms are cut at `client_header_timeout`
/// (408), an idle keep-alive connection is closed after `keepalive_timeout`, and afterwards the
/// proxy holds no client connection.
#[test]
fn slow_and_idle_clients_are_cut_at_their_deadlines() {
    const SLOW: usize = 50;
    let up = Upstream::start();
    let opts = ProxyOptions {
        server_extra: "client_header_timeout = \"500ms\"\nkeepalive_timeout = \"500ms\"".into(),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::start_with(&ConfigBuilder::unlimited(up.addr()), opts);
    let addr = proxy.addr();

    // Trickling heads.
    let started = Instant::now();
    let mut conns: Vec<TcpStream> = (0..SLOW)
        .map(|i| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.set_nonblocking(true).unwrap();
            s.write_all(format!("GET /slow/{i} HTTP/1.1\r\nHost: x\r\nX-Slow: ").as_bytes())
                .unwrap();
            s
        })
        .collect();
    let mut answered = vec![None::<(Duration, String)>; SLOW];
    // Bounded: stops when every connection was cut, or after 5 s.
    while answered.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        for (i, s) in conns.iter_mut().enumerate() {
            if answered[i].is_some() {
                continue;
            }
            let _ = s.write_all(b"a");
            let mut buf = [0u8; 256];
            match s.read(&mut buf) {
                Ok(n) => {
                    let line = String::from_utf8_lossy(&buf[..n]);
                    let line = line.lines().next().unwrap_or("(closed)").to_string();
                    answered[i] = Some((started.elapsed(), line));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => answered[i] = Some((started.elapsed(), format!("({e})"))),
            }
        }
    }
    let cut: Vec<_> = answered.iter().flatten().collect();
    assert_eq!(
        cut.len(),
        SLOW,
        "trickling connections still open after 5 s"
    );
    let latest = cut.iter().map(|(t, _)| *t).max().unwrap();
    let earliest = cut.iter().map(|(t, _)| *t).min().unwrap();
    assert!(
        earliest >= Duration::from_millis(450),
        "cut before the deadline: {earliest:?}"
    );
    let with_408 = cut
        .iter()
        .filter(|(_, l)| l.starts_with("HTTP/1.1 408"))
        .count();
    assert!(with_408 > 0, "no 408: {cut:?}");
    assert_eq!(up.hits(), 0, "a trickled request reached the upstream");

    // Idle keep-alive: one request, then silence; the proxy closes the connection.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (status, _) = read_response(&mut s);
    assert_eq!(status, 200);
    let idle_from = Instant::now();
    let mut buf = [0u8; 16];
    let closed = matches!(s.read(&mut buf), Ok(0));
    let idle = idle_from.elapsed();
    assert!(closed, "idle keep-alive connection not closed");
    assert!(
        idle >= Duration::from_millis(450) && idle < Duration::from_secs(3),
        "closed after {idle:?}"
    );

    drop(conns);
    let gauge = |p: &Proxy| p.metric("slidegate_client_connections").unwrap_or(-1.0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while gauge(&proxy) != 0.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(gauge(&proxy), 0.0, "client connections still held");
    let timeouts = proxy.counter("slidegate_client_header_timeouts_total");
    assert_eq!(timeouts, SLOW as u64);
    println!(
        "{SLOW} trickling connections cut between {earliest:?} and {latest:?} ({with_408} saw \
         the 408 before the close); idle keep-alive closed after {idle:?}; connections held \
         afterwards: 0"
    );
}

/// Under `RLIMIT_NOFILE` = 1024 (as `prlimit --nofile=1024`), 1200 clients on the proxy
/// listener: it holds `max_connections` of them and closes the rest, so `/healthz`, `/readyz`
/// and `/metrics` keep answering and a normal request is still served once a connection frees.
#[test]
fn admin_answers_while_the_proxy_listener_is_saturated() {
    const CLIENTS: usize = 1200;
    let up = Upstream::start();
    let opts = ProxyOptions {
        server_extra: "max_connections = 300\nclient_header_timeout = \"30s\"".into(),
        nofile: Some(1024),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::start_with(&ConfigBuilder::unlimited(up.addr()), opts);
    assert!(
        proxy
            .log()
            .contains("descriptor limit 1024 (was 1024, hard 1024)"),
        "log:\n{}",
        proxy.log()
    );
    let addr = proxy.addr();
    let mut conns = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => conns.push(s),
            Err(_) => break, // the backlog is full: saturated enough
        }
    }
    // Wait until the proxy has taken all it will take.
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let held = proxy.metric("slidegate_client_connections").unwrap_or(0.0);
        if held >= 300.0 || Instant::now() > deadline {
            break held;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(held, 300.0, "connections held");
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, body) = http_get_blocking(proxy.admin_addr(), path)
            .unwrap_or_else(|e| panic!("{path} while saturated: {e}; log:\n{}", proxy.log()));
        assert_eq!(status, 200, "{path}: {body}");
    }
    let refused = proxy.counter("slidegate_client_connections_refused_total");
    assert!(refused > 0, "nothing refused");
    // Free the slots; a normal request is served again.
    drop(conns);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // The proxy notices the dropped connections asynchronously: until it has, a new one may
    // still be closed at once (that is the cap working), so retry until the deadline.
    let reply = loop {
        let r = rt.block_on(request(addr, "GET", "/after", &[]));
        match r {
            Ok(r) if r.status == 200 => break r,
            other if Instant::now() > deadline => {
                panic!("no 200 after the clients left: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert_eq!(reply.status, 200, "{reply:?}");
    println!(
        "{CLIENTS} clients under nofile 1024: 300 held, {refused} closed at once; admin answered"
    );
}

/// `read_timeout` is per upstream: a slow upstream is cut after its own timeout with 504 (as
/// nginx answers), a fast route on another upstream is unaffected.
#[test]
fn upstream_read_timeout_is_per_upstream() {
    let up = Upstream::start();
    let toml = format!(
        "[store]\nbackend = \"memory\"\n\n[upstreams.slow]\nservers = [\"{0}\"]\n\
         read_timeout = \"300ms\"\nconnect_timeout = \"1s\"\nidle_timeout = \"5s\"\n\
         write_timeout = \"1s\"\n\n[upstreams.patient]\nservers = [\"{0}\"]\n\n\
         [[routes]]\nname = \"slow\"\npath_prefix = \"/slow\"\nupstream = \"slow\"\n\n\
         [[routes]]\nname = \"patient\"\npath_prefix = \"/\"\nupstream = \"patient\"\n",
        up.addr()
    );
    let proxy = Proxy::start(&toml);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Instant::now();
    let r = rt.block_on(send(
        proxy.addr(),
        "GET",
        "/slow",
        &[(DELAY_HEADER, "1500")],
    ));
    let cut_after = t.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        cut_after < Duration::from_millis(1200),
        "cut after {cut_after:?}"
    );
    let slow_status = r.status;
    let r = rt.block_on(send(proxy.addr(), "GET", "/ok", &[(DELAY_HEADER, "600")]));
    assert_eq!(r.status, 200, "{r:?}");
    println!("slow upstream cut after {cut_after:?} with {slow_status}");
}

/// A cached denial is trusted for `deny_cache_max_age` only: after a `FLUSHALL` on the live
/// connection, the client is admitted again within that time, not after its 1 h window.
#[test]
fn a_cached_denial_is_asked_again_after_its_max_age() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .store(&format!(
                "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n\
                 deny_cache_max_age = \"300ms\"",
                redis.url()
            ))
            .upstream("app", up.addr())
            .route("one", "limits = [{ requests = 1, window = \"1h\" }]")
            .build(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Wait for Redis (/readyz?store), then fill the bucket.
    while proxy.admin_get("/readyz?store").0 != 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(rt.block_on(send(proxy.addr(), "GET", "/", &[])).status, 200);
    assert_eq!(rt.block_on(send(proxy.addr(), "GET", "/", &[])).status, 429);
    assert_eq!(rt.block_on(send(proxy.addr(), "GET", "/", &[])).status, 429);
    let _: () = ::redis::cmd("FLUSHALL")
        .query(&mut redis.connection())
        .expect("FLUSHALL");
    let flushed = Instant::now();
    let status = loop {
        let s = rt.block_on(send(proxy.addr(), "GET", "/", &[])).status;
        if s == 200 || flushed.elapsed() > Duration::from_secs(5) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    let after = flushed.elapsed();
    assert_eq!(status, 200, "still denied {after:?} after FLUSHALL");
    assert!(
        after < Duration::from_secs(2),
        "admitted only after {after:?}"
    );
    println!("admitted {after:?} after FLUSHALL (deny_cache_max_age = 300ms)");
}

/// The memory store through the proxy with `max_memory = "1MB"` shared by four limited routes
/// (about 1 000 one-entry clients in the arena under test; three idle routes make it a quarter,
/// as the 1 MB floor of max_memory forbids a smaller store): a flood of 4 000 made-up API keys
/// evicts made-up keys with spare quota, never a client at its limit, and counts evictions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_flood_through_the_proxy_never_evicts_a_client_at_its_limit() {
    const VICTIMS: usize = 50;
    const FLOOD: usize = 4_000;
    const WORKERS: usize = 16;
    let up = Upstream::start();
    let mut config = ConfigBuilder::new()
        .store("backend = \"memory\"\nmax_memory = \"1MB\"")
        .upstream("app", up.addr())
        .route(
            "keys",
            "path_prefix = \"/k\"\nkey = \"header:X-Api-Key\"\n\
             limits = [{ requests = 2, window = \"1h\" }]",
        );
    for i in 0..3 {
        config = config.route(
            &format!("idle{i}"),
            &format!(
                "path_prefix = \"/idle{i}\"\nkey = \"header:X-Api-Key\"\n\
                 limits = [{{ requests = 1, window = \"1h\" }}]"
            ),
        );
    }
    let proxy = Proxy::start(&config.build());
    let url = format!("http://{}/k", proxy.addr());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(WORKERS)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let status = |key: String| api_status(client.clone(), url.clone(), key);
    for i in 0..VICTIMS {
        assert_eq!(status(format!("victim-{i}")).await, Ok(200));
        assert_eq!(status(format!("victim-{i}")).await, Ok(200));
        assert_eq!(status(format!("victim-{i}")).await, Ok(429));
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let mut ok = 0;
            for i in (w..FLOOD).step_by(WORKERS) {
                let key = format!("made-up-{i}");
                if api_status(client.clone(), url.clone(), key).await == Ok(200) {
                    ok += 1;
                }
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(n) = tasks.join_next().await {
        ok += n.expect("worker");
    }
    let flooded_in = started.elapsed();
    assert_eq!(ok, FLOOD, "every made-up key's first request is admitted");
    for i in 0..VICTIMS {
        assert_eq!(
            status(format!("victim-{i}")).await,
            Ok(429),
            "victim-{i} was evicted and got a fresh quota"
        );
    }
    let evictions = proxy.counter("slidegate_store_evictions_total");
    assert!(evictions > (FLOOD / 4) as u64, "{evictions} evictions");
    println!("{FLOOD} made-up keys in {flooded_in:?}: {evictions} evictions, all {VICTIMS} clients at their limit still denied");
}

/// Status of `GET url` with `X-Api-Key: key`.
async fn api_status(client: reqwest::Client, url: String, key: String) -> Result<u16, String> {
    client
        .get(&url)
        .header("x-api-key", key)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}
