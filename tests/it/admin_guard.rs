//! The admin port against a hostile browser, on the real binary: cross-site writes (CSRF) are
//! refused and leave the bucket alone, even with the operator's token in the request; the
//! inspector answers only to its own, loopback and `admin_hosts` names (DNS rebinding), while
//! the probes answer to any `Host`; the page's own same-origin JSON write still works; a
//! token guessed from one address is slowed after 5 failures, counted and logged.

use crate::common;

use common::admin::{admin, admin_from};
use common::proxy::{send, ConfigBuilder, Proxy, ProxyOptions};
use common::upstream::Upstream;

const RESET: &str = "/api/v1/reset?route=login&client=127.0.0.1";

/// One route of 2 requests a minute per client IP, on the memory store.
fn start(server_extra: &str) -> (Upstream, Proxy) {
    let up = Upstream::start();
    let config = ConfigBuilder::new()
        .store("backend = \"memory\"")
        .upstream("app", up.addr())
        .route(
            "login",
            "path_prefix = \"/login\"\nlimits = [{ requests = 2, window = \"1m\" }]",
        )
        .build();
    let options = ProxyOptions {
        server_extra: server_extra.into(),
        ..ProxyOptions::default()
    };
    let proxy = Proxy::start_with(&config, options);
    (up, proxy)
}

/// Spend the bucket of 127.0.0.1 on `login`: the next request is denied.
async fn exhaust(proxy: &Proxy) {
    let statuses = [
        send(proxy.addr(), "GET", "/login", &[]).await.status,
        send(proxy.addr(), "GET", "/login", &[]).await.status,
        send(proxy.addr(), "GET", "/login", &[]).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
}

async fn login_status(proxy: &Proxy) -> u16 {
    send(proxy.addr(), "GET", "/login", &[]).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_writes_are_refused_and_the_page_s_own_write_works() {
    let (_up, proxy) = start("");
    let own = format!("http://{}", proxy.admin_addr());
    let host = proxy.admin_addr().to_string();
    exhaust(&proxy).await;
    let attacks: [(&[(&str, &str)], u16); 6] = [
        (&[("sec-fetch-site", "cross-site")], 403),
        (&[("sec-fetch-site", "same-site")], 403),
        (&[("origin", "http://evil.example")], 403),
        (&[("origin", "null")], 403),
        (
            &[("content-type", "application/x-www-form-urlencoded")],
            415,
        ),
        (&[("content-type", "text/plain;charset=UTF-8")], 415),
    ];
    for (headers, want) in attacks {
        let mut headers = headers.to_vec();
        headers.push(("host", &host));
        let r = admin(&proxy, "POST", RESET, &headers).await;
        assert_eq!(r.status, want, "{headers:?}: {}", r.body);
        let ct = r.headers.get("content-type").unwrap();
        assert_eq!(ct, "application/problem+json", "{headers:?}");
        assert_eq!(
            login_status(&proxy).await,
            429,
            "{headers:?} reset the bucket"
        );
    }
    // What the page sends (tests/it/inspector_page.rs drives the page itself).
    let page = [
        ("host", host.as_str()),
        ("origin", own.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("content-type", "application/json"),
    ];
    let r = admin(&proxy, "POST", RESET, &page).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        login_status(&proxy).await,
        200,
        "the same-origin reset worked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_form_is_refused_even_with_the_operator_s_token() {
    // A browser that logged in once through the Basic prompt resends the credentials with a
    // cross-site form post.
    let (_up, proxy) = start("admin_token = \"s3cret-token-0123456789\"");
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "ops:s3cret-token-0123456789"
        )
    );
    exhaust(&proxy).await;
    let form = [
        ("authorization", basic.as_str()),
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
        ("content-type", "application/x-www-form-urlencoded"),
    ];
    let r = admin(&proxy, "POST", RESET, &form).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(login_status(&proxy).await, 429, "the form reset the bucket");
    let r = admin(&proxy, "POST", RESET, &[("authorization", basic.as_str())]).await;
    assert_eq!(r.status, 200, "a script with the token: {}", r.body);
    assert_eq!(login_status(&proxy).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_answers_only_to_its_own_hosts_and_the_probes_to_any() {
    let (_up, proxy) = start("admin_hosts = [\"admin.example.com\"]");
    let own = proxy.admin_addr().to_string();
    for path in ["/", "/assets/app.js", "/api/v1/routes"] {
        for host in [
            "evil.example",
            "evil.example:9090",
            "localhost.evil.example",
        ] {
            let r = admin(&proxy, "GET", path, &[("host", host)]).await;
            assert_eq!(r.status, 421, "{path} with Host {host}: {}", r.body);
        }
        for host in [
            "localhost",
            "127.0.0.1:1",
            "[::1]",
            own.as_str(),
            "admin.example.com",
            "Admin.Example.com:443",
        ] {
            let r = admin(&proxy, "GET", path, &[("host", host)]).await;
            assert_eq!(r.status, 200, "{path} with Host {host}: {}", r.body);
        }
    }
    for probe in ["/metrics", "/healthz", "/readyz"] {
        let r = admin(&proxy, "GET", probe, &[("host", "evil.example")]).await;
        assert_eq!(r.status, 200, "{probe}");
    }
    // A rebound name cannot write either; a TLS front named in admin_hosts can.
    let rebound = [
        ("host", "evil.example"),
        ("content-type", "application/json"),
    ];
    assert_eq!(admin(&proxy, "POST", RESET, &rebound).await.status, 421);
    let front = [
        ("host", own.as_str()),
        ("origin", "https://admin.example.com"),
        ("content-type", "application/json"),
    ];
    let r = admin(&proxy, "POST", RESET, &front).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Token guessing (issue 52 row 12): an address may fail 5 times, then is answered `429` with
/// `Retry-After` without its guesses being checked, even a right one; a request without
/// credentials (a browser before its login prompt) is no failure; other addresses are not
/// slowed; every failure is counted in `slidegate_admin_auth_failures_total`, and the log gets
/// one line for the lot. Before: every guess checked (19-42k a second), 401 each, no metric,
/// no line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_guessing_is_slowed_per_address_counted_and_logged() {
    const TOKEN: &str = "s3cret-token-0123456789";
    let (_up, proxy) = start(&format!("admin_token = \"{TOKEN}\""));
    let guesser = std::net::IpAddr::from([127, 0, 0, 7]);
    let right = format!("Bearer {TOKEN}");
    for _ in 0..10 {
        let r = admin_from(&proxy, guesser, "GET", "/api/v1/routes", &[]).await;
        assert_eq!(r.status, 401, "no credentials: {}", r.body);
    }
    let mut statuses = Vec::new();
    for i in 0..200 {
        let guess = format!("Bearer guess-{i:04}-0123456789");
        let r = admin_from(
            &proxy,
            guesser,
            "GET",
            "/api/v1/routes",
            &[("authorization", &guess)],
        )
        .await;
        statuses.push(r.status);
        if r.status == 429 {
            let after: u64 = r
                .header("retry-after")
                .expect("Retry-After")
                .parse()
                .unwrap();
            assert!((1..=10).contains(&after), "Retry-After {after}");
        }
    }
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    assert_eq!(statuses[..5], [401; 5], "{statuses:?}");
    assert_eq!(checked, 5, "{statuses:?}");
    assert!(statuses[5..].iter().all(|&s| s == 429), "{statuses:?}");
    // Not checked while slowed: the right token too.
    let r = admin_from(
        &proxy,
        guesser,
        "GET",
        "/api/v1/routes",
        &[("authorization", &right)],
    )
    .await;
    assert_eq!(r.status, 429, "{}", r.body);
    // Another address is not slowed.
    let other = std::net::IpAddr::from([127, 0, 0, 8]);
    let r = admin_from(
        &proxy,
        other,
        "GET",
        "/api/v1/routes",
        &[("authorization", &right)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let wrong = proxy.counter("slidegate_admin_auth_failures_total{outcome=\"wrong\"}");
    let throttled = proxy.counter("slidegate_admin_auth_failures_total{outcome=\"throttled\"}");
    assert_eq!((wrong, throttled), (5, 196));
    let log = proxy.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed authentication"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per 10 s: {lines:?}");
    assert!(lines[0].contains("127.0.0.7"), "{lines:?}");
    println!(
        "200 guesses from one address: {checked} checked (401), {} answered 429 unchecked; \
         metric wrong={wrong} throttled={throttled}; log: {}",
        200 - checked,
        lines[0]
    );
}
