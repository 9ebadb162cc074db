//! The admin listener's inspector API as tests use it, and the external tools (chromium,
//! chromedriver, prometheus, promtool) the browser and Prometheus tests need.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::proxy::{send, Proxy, Reply};

/// Poll `/readyz?store` (200 while the limit store answers, 503 while it does not) until it
/// answers `want`; how long that took. Panics after `within`. Plain `/readyz` stays 200 through
/// a store outage unless every route fails closed, so it does not tell a test that its store
/// answers: this does.
pub fn wait_readyz(proxy: &Proxy, want: u16, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let (status, _) = proxy.admin_get("/readyz?store");
        if status == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "/readyz?store still {status} (want {want}) after {within:?}; log:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `slidegate_config_reloads_total{result}` (0 while the series does not exist yet).
pub fn reloads(proxy: &Proxy, result: &str) -> u64 {
    proxy
        .metric(&format!(
            r#"slidegate_config_reloads_total{{result="{result}"}}"#
        ))
        .unwrap_or(0.0) as u64
}

/// Poll `/metrics` until `slidegate_config_reloads_total{result}` reaches `want` (then check it
/// did not overshoot), or panic after `timeout` with the log.
pub fn wait_reloads(proxy: &Proxy, result: &str, want: u64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = reloads(proxy, result);
        if got >= want {
            assert_eq!(
                got,
                want,
                "reloads{{result={result}}}; log:\n{}",
                proxy.log()
            );
            return;
        }
        assert!(
            Instant::now() <= deadline,
            "reloads{{result={result}}} is {got}, not {want}, after {timeout:?}; log:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request to the admin listener.
pub async fn admin(proxy: &Proxy, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(proxy.admin_addr(), method, path, headers).await
}

/// [`admin`] from the client address `from` (a loopback address of its own).
pub async fn admin_from(
    proxy: &Proxy,
    from: std::net::IpAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let conn = super::http::connect_from(proxy.admin_addr(), from).await;
    let reply = conn.expect("connect").send(method, path, headers).await;
    reply.unwrap_or_else(|e| panic!("{method} {path} from {from}: {e}"))
}

/// Percent-encode a query value.
pub fn enc(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `GET /api/v1/window?route=..&client=..`, which must answer 200: the JSON body.
pub async fn window(proxy: &Proxy, route: &str, client: &str) -> Value {
    let path = format!("/api/v1/window?route={}&client={}", enc(route), enc(client));
    let reply = admin(proxy, "GET", &path, &[]).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    serde_json::from_str(&reply.body).expect("window JSON")
}

/// `POST /api/v1/reset?route=..&client=..`, which must answer 200.
pub async fn reset(proxy: &Proxy, route: &str, client: &str) {
    let path = format!("/api/v1/reset?route={}&client={}", enc(route), enc(client));
    let reply = admin(proxy, "POST", &path, &[]).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
}
