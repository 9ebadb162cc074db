//! Who may talk to the inspector: a pure decision on the request head, taken before the token
//! check and before any route is looked at.
//!
//! - **Host** (DNS rebinding): a page on `evil.example` whose name is re-pointed at the admin
//!   address would be same-origin with the inspector. So `/`, `/assets/*` and `/api/*` answer
//!   only to a `Host` naming the listener's own address, a loopback name (`localhost`,
//!   `127.0.0.1`, `[::1]`) or one of `[server] admin_hosts`, with any port; anything else
//!   (a missing `Host` too) is `421 Misdirected Request`. The probes (`/metrics`, `/healthz`,
//!   `/readyz`) answer to any `Host`: scrapers and load balancers name the admin port as they
//!   like, and they only read.
//! - **Cross-site writes** (CSRF): every method but GET and HEAD under `/api/` is refused with
//!   `403` when `Sec-Fetch-Site` is other than `same-origin` or `none`, or when `Origin` is not
//!   the request's own `Host` (nor an `admin_hosts` name, for a TLS front that rewrites `Host`);
//!   and with `415` when its `Content-Type` is one a cross-site form or no-cors fetch may send
//!   without a preflight (`application/x-www-form-urlencoded`, `multipart/form-data`,
//!   `text/plain`). Scripts without these headers (curl) are not browsers and pass.

use std::net::IpAddr;

use http::{header, HeaderMap, Method, StatusCode};

use crate::config::HostMatch;

/// The paths that answer to any `Host` and need no token.
pub const PROBES: [&str; 3] = ["/metrics", "/healthz", "/readyz"];

/// The hosts the inspector answers to.
#[derive(Debug, Clone, Copy)]
pub struct Allowed<'a> {
    /// `[server] admin_hosts`.
    pub names: &'a [HostMatch],
    /// The listener's own addresses: the configured one and the connection's local one (which
    /// differs when the listener is bound to `0.0.0.0` or `::`).
    pub own: &'a [IpAddr],
}

/// Why the guard refuses a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `Host` is missing, malformed or names a host the inspector does not answer to.
    #[error("this admin listener does not answer to that Host; add it to server.admin_hosts")]
    ForeignHost,
    /// A write from a browser context that is not the inspector's own page.
    #[error("cross-site writes are refused (Sec-Fetch-Site or Origin is not this origin)")]
    CrossSite,
    /// A write with a content type a cross-site form may send.
    #[error("writes must not use a form content type; send application/json or no body")]
    FormContent,
}

impl Refusal {
    /// The status this refusal answers with.
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::ForeignHost => StatusCode::MISDIRECTED_REQUEST,
            Refusal::CrossSite => StatusCode::FORBIDDEN,
            Refusal::FormContent => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }
}

/// The decision for one request head.
pub fn screen(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    allowed: Allowed<'_>,
) -> Result<(), Refusal> {
    if PROBES.contains(&path) {
        return Ok(());
    }
    let host = header_str(headers, header::HOST).ok_or(Refusal::ForeignHost)?;
    if !host_allowed(host, allowed) {
        return Err(Refusal::ForeignHost);
    }
    let write = !matches!(*method, Method::GET | Method::HEAD);
    if !write || !path.starts_with("/api/") {
        return Ok(());
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(Refusal::CrossSite);
        }
    }
    if headers.contains_key(header::ORIGIN) && !origin_allowed(headers, host, allowed) {
        return Err(Refusal::CrossSite);
    }
    if headers
        .get_all(header::CONTENT_TYPE)
        .iter()
        .any(|v| is_form_type(v.as_bytes()))
    {
        return Err(Refusal::FormContent);
    }
    Ok(())
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    // Two Host headers name no one host.
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()
}

/// Is `authority` (`host[:port]`, as in `Host`) one the inspector answers to? Ports are not
/// compared: rebinding is about the name, and a front may map ports.
fn host_allowed(authority: &str, allowed: Allowed<'_>) -> bool {
    let Some(host) = crate::request::form::host_of(authority) else {
        return false;
    };
    if host == "localhost" {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        let ip = ip.to_canonical();
        return ip.is_loopback() || allowed.own.iter().any(|o| o.to_canonical() == ip);
    }
    allowed.names.iter().any(|n| n.matches(&host))
}

/// `Origin` is this request's own origin (its authority equals `Host`), or names one of
/// `admin_hosts`. `Origin: null` (sandboxed frames, some redirects) is never allowed.
fn origin_allowed(headers: &HeaderMap, host: &str, allowed: Allowed<'_>) -> bool {
    let Some(origin) = header_str(headers, header::ORIGIN) else {
        return false;
    };
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    if authority.eq_ignore_ascii_case(host) {
        return true;
    }
    crate::request::form::host_of(authority)
        .is_some_and(|h| allowed.names.iter().any(|n| n.matches(&h)))
}

/// The content types a browser sends cross-site without a CORS preflight (the Fetch
/// standard's CORS-safelisted `Content-Type` values), compared by essence.
fn is_form_type(value: &[u8]) -> bool {
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    let essence = essence.trim_ascii();
    [
        &b"application/x-www-form-urlencoded"[..],
        b"multipart/form-data",
        b"text/plain",
    ]
    .iter()
    .any(|t| essence.eq_ignore_ascii_case(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const OWN: [IpAddr; 1] = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5))];

    fn names() -> Vec<HostMatch> {
        vec![HostMatch::parse("admin.example.com").unwrap()]
    }

    fn run(method: Method, path: &str, headers: &[(&str, &str)]) -> Result<(), Refusal> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let names = names();
        let allowed = Allowed {
            names: &names,
            own: &OWN,
        };
        screen(&method, path, &map, allowed)
    }

    #[test]
    fn the_inspector_answers_to_own_loopback_and_configured_hosts_only() {
        for host in [
            "localhost",
            "localhost:9090",
            "LocalHost.",
            "127.0.0.1:9090",
            "127.0.0.2",
            "[::1]:9090",
            "[::1]",
            "10.0.0.5:9090",
            "admin.example.com",
            "Admin.Example.com:443",
        ] {
            for path in ["/", "/api/v1/routes", "/assets/app.js"] {
                assert_eq!(run(Method::GET, path, &[("host", host)]), Ok(()), "{host}");
            }
        }
        for host in [
            "evil.example",
            "evil.example:9090",
            "10.0.0.6",
            "localhost.evil.example",
            "admin.example.com.evil.example",
            "a@localhost",
            "localhost:x",
        ] {
            for path in ["/", "/api/v1/routes", "/assets/app.js", "/nope"] {
                let got = run(Method::GET, path, &[("host", host)]);
                assert_eq!(got, Err(Refusal::ForeignHost), "{host} {path}");
            }
        }
        assert_eq!(run(Method::GET, "/", &[]), Err(Refusal::ForeignHost));
        let two = [("host", "localhost"), ("host", "evil.example")];
        assert_eq!(run(Method::GET, "/", &two), Err(Refusal::ForeignHost));
    }

    #[test]
    fn probes_answer_to_any_host() {
        for path in PROBES {
            assert_eq!(run(Method::GET, path, &[("host", "evil.example")]), Ok(()));
            assert_eq!(run(Method::GET, path, &[]), Ok(()));
        }
    }

    #[test]
    fn cross_site_writes_are_refused() {
        let post = |h: &[(&str, &str)]| {
            let mut all = vec![("host", "localhost:9090")];
            all.extend_from_slice(h);
            run(Method::POST, "/api/v1/reset", &all)
        };
        let cases = [
            ("sec-fetch-site", "cross-site", Refusal::CrossSite),
            ("sec-fetch-site", "same-site", Refusal::CrossSite),
            ("sec-fetch-site", "bogus", Refusal::CrossSite),
            ("origin", "http://evil.example", Refusal::CrossSite),
            ("origin", "http://localhost:3000", Refusal::CrossSite),
            ("origin", "null", Refusal::CrossSite),
            ("origin", "ftp://localhost:9090", Refusal::CrossSite),
            (
                "origin",
                "http://localhost:9090.evil.example",
                Refusal::CrossSite,
            ),
            (
                "content-type",
                "application/x-www-form-urlencoded",
                Refusal::FormContent,
            ),
            (
                "content-type",
                "multipart/form-data; boundary=x",
                Refusal::FormContent,
            ),
            (
                "content-type",
                "Text/Plain;charset=UTF-8",
                Refusal::FormContent,
            ),
            ("content-type", " text/plain ", Refusal::FormContent),
        ];
        for (name, value, refusal) in cases {
            assert_eq!(post(&[(name, value)]), Err(refusal), "{name}: {value}");
        }
        // DELETE, PUT, PATCH are writes as well.
        let del = [("host", "localhost"), ("sec-fetch-site", "cross-site")];
        assert_eq!(
            run(Method::DELETE, "/api/v1/reset", &del),
            Err(Refusal::CrossSite)
        );
    }

    #[test]
    fn the_page_and_scripts_may_write() {
        let page = [
            ("host", "localhost:9090"),
            ("origin", "http://localhost:9090"),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/json"),
        ];
        assert_eq!(run(Method::POST, "/api/v1/reset", &page), Ok(()));
        let front = [
            ("host", "127.0.0.1:9090"),
            ("origin", "https://admin.example.com"),
        ];
        assert_eq!(run(Method::POST, "/api/v1/reset", &front), Ok(()));
        let typed = [("host", "localhost"), ("sec-fetch-site", "none")];
        assert_eq!(run(Method::POST, "/api/v1/reset", &typed), Ok(()));
        assert_eq!(
            run(Method::POST, "/api/v1/reset", &[("host", "localhost")]),
            Ok(())
        );
        // Reads are not writes: a cross-site GET reads nothing it can see (no CORS).
        let read = [("host", "localhost"), ("sec-fetch-site", "cross-site")];
        assert_eq!(run(Method::GET, "/api/v1/routes", &read), Ok(()));
    }
}
