//! TLS and HTTP/2 through the real binary: the same limits, headers and 429 over HTTP/1.1, h2c,
//! HTTP/1.1 over TLS and HTTP/2 over TLS (ALPN); HTTPS and HTTP/2 upstreams with SNI, trusted
//! roots and verification; certificate errors at start; certificate reload on SIGHUP; an
//! HTTP/2 connection lives while used and closes when idle.
//! Certificates are made at run time (tests/it/common/tls.rs).

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fetch::{fetch, url, Seen};
use common::proxy::{ConfigBuilder, Proxy, ProxyOptions};
use common::ratelimit::parse_ratelimit;
use common::tls::{presented_leaf, server_config, tls_options, Protocol, TestCa};
use common::upstream::{Upstream, DELAY_HEADER, UPSTREAM_BODY};

/// Each protocol gets its own bucket (keyed by a header) of 3 per minute: all four see exactly
/// the same sequence of statuses, `RateLimit-Policy` / `RateLimit` fields, `Retry-After` and
/// problem body, the 429 over HTTP/2 included, and the metrics count all of it.
#[tokio::test]
async fn limits_headers_and_429_are_identical_over_h1_h2c_h1_tls_and_h2_tls() {
    let ca = TestCa::new("slidegate test CA");
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .route(
                "api",
                "key = \"header:X-Client\"\nlimits = [ { requests = 3, window = \"1m\" } ]",
            )
            .build(),
        tls_options(&ca, "h2c = true"),
    );
    let mut runs = Vec::new();
    for protocol in Protocol::ALL {
        let client = protocol.client(&ca.ca_pem());
        let mut seen = Vec::new();
        for _ in 0..4 {
            let who = format!("{protocol:?}");
            seen.push(
                fetch(
                    &client,
                    &url(&proxy, protocol, "/x"),
                    &who,
                    protocol.version(),
                )
                .await,
            );
        }
        runs.push((protocol, seen));
    }
    let (_, first) = &runs[0];
    let statuses: Vec<u16> = first.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "{first:#?}");
    assert_eq!(first[0].body, UPSTREAM_BODY);
    assert_eq!(first[0].policy.as_deref(), Some(r#""api-60s";q=3;w=60"#));
    let remaining: Vec<u64> = first
        .iter()
        .map(|s| parse_ratelimit(s.ratelimit.as_deref().expect("RateLimit"))[0].r)
        .collect();
    assert_eq!(remaining, [2, 1, 0, 0]);
    assert!(first[3].retry_after.is_some(), "{:?}", first[3]);
    assert_eq!(
        first[3].content_type.as_deref(),
        Some("application/problem+json")
    );
    for (protocol, seen) in &runs[1..] {
        // `t` may tick down by a second between runs; everything else is identical.
        let strip_t = |v: &Vec<Seen>| -> Vec<Seen> {
            v.iter()
                .map(|s| Seen {
                    ratelimit: s
                        .ratelimit
                        .as_ref()
                        .map(|r| r.split(";t=").next().unwrap().into()),
                    retry_after: s.retry_after.as_ref().map(|_| "present".into()),
                    body: s.body.replace(|c: char| c.is_ascii_digit(), "#"),
                    policy: s.policy.clone(),
                    content_type: s.content_type.clone(),
                    status: s.status,
                })
                .collect()
        };
        assert_eq!(
            strip_t(seen),
            strip_t(first),
            "{protocol:?} differs from H1"
        );
    }
    assert_eq!(proxy.decisions("api", "allowed"), 12);
    assert_eq!(proxy.decisions("api", "denied"), 4);
    assert_eq!(up.hits(), 12);
}

/// HTTPS upstreams: with the test CA as `ca_file` and `sni = "localhost"` the proxy verifies
/// and reaches an HTTP/2 (`h2 = true`) upstream over TLS; with the system roots (which do not
/// know the test CA) verification fails and the client gets 502; `verify = false` connects and
/// is logged as a warning.
#[tokio::test]
async fn https_upstreams_verify_with_ca_file_sni_and_h2() {
    let ca = TestCa::new("upstream CA");
    let leaf = ca.issue("upstream", &["localhost"]);
    let up = Upstream::start_tls(server_config(&leaf));
    let ca_file = ca.ca_file();
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .upstream_with(
                "verified",
                up.addr(),
                &format!("tls = true\nsni = \"localhost\"\nca_file = {ca_file:?}\nh2 = true"),
            )
            .upstream_with("system_roots", up.addr(), "tls = true\nsni = \"localhost\"")
            .upstream_with("unverified", up.addr(), "tls = true\nverify = false")
            .route("ok", "path_prefix = \"/ok\"\nupstream = \"verified\"")
            .route("bad", "path_prefix = \"/bad\"\nupstream = \"system_roots\"")
            .route("off", "path_prefix = \"/off\"\nupstream = \"unverified\"")
            .build(),
    );
    let client = Protocol::H1.client(&ca.ca_pem());
    let get = |path: &'static str| {
        let client = client.clone();
        let url = url(&proxy, Protocol::H1, path);
        async move { client.get(url).send().await.expect("request") }
    };
    let ok = get("/ok").await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.text().await.unwrap(), UPSTREAM_BODY);
    let seen = up.last_request().expect("upstream saw the request");
    assert_eq!(seen.version, http::Version::HTTP_2, "h2 = true over TLS");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");

    let hits = up.hits();
    assert_eq!(get("/bad").await.status(), 502);
    assert_eq!(
        up.hits(),
        hits,
        "an unverified upstream must not see the request"
    );

    let off = get("/off").await;
    assert_eq!(off.status(), 200);
    assert_eq!(
        up.last_request().unwrap().version,
        http::Version::HTTP_11,
        "without h2 = true the upstream is spoken to in HTTP/1.1"
    );
    assert!(
        proxy
            .log()
            .contains("upstream unverified: TLS certificate verification is off"),
        "{}",
        proxy.log()
    );
}

/// Run the binary on `[server]` lines plus an empty rule set; its exit status and stderr.
fn run_config(dir: &std::path::Path, server_lines: &str, args: &[&str]) -> (i32, String) {
    let config = dir.join("bad.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\n{server_lines}\n",
            common::proxy::free_port(),
            common::proxy::free_port()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("-c")
        .arg(&config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run slidegate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A missing, empty or mismatched certificate or key stops the process at start (and `-t`)
/// with a message naming the config file, the key and the file; nothing listens.
#[test]
fn unusable_certificate_or_key_is_a_config_error_naming_file_and_key() {
    let ca = TestCa::new("ca");
    let a = ca.issue("a", &["localhost"]);
    let b = ca.issue("b", &["localhost"]);
    let empty = ca.dir().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let missing = ca.dir().join("missing.pem");
    let tls = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "tls_listen = \"127.0.0.1:{}\"\ntls_cert = {cert:?}\ntls_key = {key:?}",
            common::proxy::free_port()
        )
    };
    let cases = [
        (tls(&missing, &a.key), "server.tls_cert", "missing.pem"),
        (tls(&empty, &a.key), "server.tls_cert", "empty.pem"),
        (tls(&a.cert, &missing), "server.tls_key", "missing.pem"),
        (tls(&a.cert, &a.cert), "server.tls_key", "a.pem"),
        (tls(&a.cert, &b.key), "server.tls_key", "b.key"),
    ];
    for (lines, key, file) in &cases {
        for args in [&["-t"][..], &[][..]] {
            let (code, stderr) = run_config(ca.dir(), lines, args);
            assert_eq!(code, 1, "{lines} {args:?}: {stderr}");
            assert!(
                stderr.contains("bad.toml") && stderr.contains(key) && stderr.contains(file),
                "{lines} {args:?}: message must name config, key and file: {stderr}"
            );
        }
    }
    // The three keys go together.
    let (code, stderr) = run_config(
        ca.dir(),
        &format!("tls_listen = \"127.0.0.1:{}\"", common::proxy::free_port()),
        &["-t"],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("server.tls_cert") && stderr.contains("required"),
        "{stderr}"
    );
    let (code, stderr) = run_config(ca.dir(), &format!("tls_cert = {:?}", a.cert), &["-t"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("only used with server.tls_listen"),
        "{stderr}"
    );
}

/// SIGHUP re-reads the certificate: new handshakes get the new one without a restart; a bad
/// new file is refused like a bad config (logged with key and file, counted as a failed
/// reload) and the last good certificate keeps serving.
#[tokio::test]
async fn sighup_swaps_the_certificate_and_refuses_a_bad_one() {
    let ca = TestCa::new("ca");
    let first = ca.issue("first", &["localhost"]);
    let second = ca.issue("second", &["localhost"]);
    let up = Upstream::start();
    let config = ConfigBuilder::unlimited(up.addr());
    // The proxy serves whatever is in these two files.
    let live_cert = ca.dir().join("live.pem");
    let live_key = ca.dir().join("live.key");
    std::fs::copy(&first.cert, &live_cert).unwrap();
    std::fs::copy(&first.key, &live_key).unwrap();
    let proxy = Proxy::start_with(
        &config,
        ProxyOptions {
            tls: Some((live_cert.clone(), live_key.clone())),
            ..ProxyOptions::default()
        },
    );
    assert_eq!(presented_leaf(proxy.tls_addr()).await, first.der);

    let reloads = |result: &str| {
        proxy
            .metric(&format!(
                "slidegate_config_reloads_total{{result=\"{result}\"}}"
            ))
            .unwrap_or(0.0) as u64
    };
    let wait_reloads = |result: &str, n: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while reloads(result) < n {
            assert!(
                Instant::now() < deadline,
                "no {result} reload; log:\n{}",
                proxy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));

    std::fs::copy(&second.cert, &live_cert).unwrap();
    std::fs::copy(&second.key, &live_key).unwrap();
    proxy.signal(libc::SIGHUP).unwrap();
    wait_reloads("ok", 1);
    assert_eq!(presented_leaf(proxy.tls_addr()).await, second.der);

    // A certificate without its key: refused, the second one stays.
    std::fs::copy(&first.cert, &live_cert).unwrap();
    proxy.signal(libc::SIGHUP).unwrap();
    wait_reloads("error", 1);
    assert_eq!(presented_leaf(proxy.tls_addr()).await, second.der);
    let log = proxy.log();
    assert!(
        log.contains("config reload refused") && log.contains("server.tls_key"),
        "{log}"
    );
    // And the proxy still proxies over TLS.
    let client = Protocol::H2Tls.client(&ca.ca_pem());
    let resp = client
        .get(url(&proxy, Protocol::H2Tls, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
}

/// One HTTP/2 connection (h2 over TLS, and h2c) kept busy for 3 × `client_header_timeout`
/// serves every request and then a response slower than `client_header_timeout`, on that one
/// connection; left idle, it is closed after `keepalive_timeout` (issue 18 row 2).
#[tokio::test]
async fn an_h2_connection_lives_while_used_and_closes_when_idle() {
    let ca = TestCa::new("ca");
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::unlimited(up.addr()),
        tls_options(
            &ca,
            "h2c = true\nclient_header_timeout = \"500ms\"\nkeepalive_timeout = \"1s\"",
        ),
    );
    let gauge = || proxy.metric("slidegate_client_connections").unwrap_or(-1.0);
    for protocol in [Protocol::H2Tls, Protocol::H2c] {
        let client = protocol.client(&ca.ca_pem());
        let busy_from = Instant::now();
        let mut served = 0;
        while busy_from.elapsed() < Duration::from_millis(1500) {
            let seen = fetch(
                &client,
                &url(&proxy, protocol, "/busy"),
                "a",
                protocol.version(),
            )
            .await;
            assert_eq!(
                seen.status,
                200,
                "{protocol:?} after {:?}",
                busy_from.elapsed()
            );
            served += 1;
            assert_eq!(gauge(), 1.0, "{protocol:?}: not one connection");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let slow_from = Instant::now();
        let slow = client
            .get(url(&proxy, protocol, "/slow"))
            .header(DELAY_HEADER, "1200")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{protocol:?}: slow response failed: {e:?}"));
        assert_eq!(slow.status(), 200);
        assert_eq!(slow.text().await.unwrap(), UPSTREAM_BODY);
        let slow_took = slow_from.elapsed();
        assert!(slow_took >= Duration::from_millis(1200), "{slow_took:?}");
        assert_eq!(
            gauge(),
            1.0,
            "{protocol:?}: the slow response needed a new connection"
        );

        // Idle: the proxy closes it (bounded wait, polling the gauge).
        let idle_from = Instant::now();
        while gauge() != 0.0 && idle_from.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let closed_after = idle_from.elapsed();
        assert_eq!(
            gauge(),
            0.0,
            "{protocol:?}: idle h2 connection still open after 5 s"
        );
        assert!(
            closed_after >= Duration::from_millis(900),
            "{protocol:?}: closed before keepalive_timeout: {closed_after:?}"
        );
        println!(
            "{protocol:?}: one connection served {served} requests over {:?} and a {slow_took:?} \
             response (client_header_timeout 500 ms); idle, closed after {closed_after:?}",
            slow_from - busy_from
        );
    }
}
