//! The rule set a request is matched against: routes in file order (first match wins), their
//! upstream pools, and everything the hot path needs precomputed (policy names and header
//! values, metric handles).
//!
//! A [`Rules`] is immutable; a reload builds a new one and swaps it in whole, so a request in
//! flight finishes under the rules it started with.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderValue, Method};
use pingora::lb::{selection::RoundRobin, LoadBalancer};

use crate::config::{Config, HostMatch, KeySpec, OnError};
use crate::keys::ClientIpResolver;
use crate::limiter::Limit;
use crate::metrics::RouteMetrics;
use crate::ratelimit_headers::{policy_field, policy_name};

/// One route, ready for the hot path.
pub struct Route {
    /// Unique route name.
    pub name: String,
    host: Option<HostMatch>,
    path_prefix: String,
    methods: Vec<Method>,
    /// Index into [`Rules::upstreams`].
    pub upstream: usize,
    /// How clients are grouped into buckets.
    pub key: KeySpec,
    /// Evaluate and count, never deny.
    pub shadow: bool,
    /// What to do when the store cannot decide.
    pub on_error: OnError,
    /// The limits, decided together.
    pub limits: Vec<Limit>,
    /// `<route>-<window>` per limit, as used in the RateLimit fields and problem bodies.
    pub policy_names: Vec<String>,
    /// The `RateLimit-Policy` field value (absent when the route has no limits).
    pub policy_header: Option<HeaderValue>,
    /// Metric handles of this route.
    pub metrics: RouteMetrics,
}

impl Route {
    /// Does this route take a request for `host` (lower-case, no port), `path`, `method`?
    pub fn matches(&self, host: Option<&str>, path: &str, method: &Method) -> bool {
        if !path.starts_with(&self.path_prefix) {
            return false;
        }
        if !self.methods.is_empty() && !self.methods.contains(method) {
            return false;
        }
        match (&self.host, host) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(HostMatch::Exact(h)), Some(host)) => h.eq_ignore_ascii_case(host),
            (Some(HostMatch::Suffix(s)), Some(host)) => {
                host.len() > s.len() && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

/// An upstream pool: round-robin over its servers, with Pingora's keepalive pool underneath.
pub type Pool = Arc<LoadBalancer<RoundRobin>>;

/// A complete, immutable rule set.
pub struct Rules {
    /// Routes in file order.
    pub routes: Vec<Route>,
    /// Upstream pools, indexed by [`Route::upstream`].
    pub upstreams: Vec<Pool>,
    /// Upstream names, parallel to `upstreams` (for logs).
    pub upstream_names: Vec<String>,
    /// Number of servers of each upstream (bounds connect retries).
    pub upstream_sizes: Vec<usize>,
    /// Client address resolution.
    pub client_ip: ClientIpResolver,
}

/// Why a validated config could not be turned into rules (upstream resolution at build time).
#[derive(Debug, thiserror::Error)]
#[error("upstreams.{upstream}: {source}")]
pub struct RulesError {
    upstream: String,
    source: std::io::Error,
}

impl Rules {
    /// Build the rule set of a validated config.
    pub fn build(config: &Config) -> Result<Rules, RulesError> {
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for up in &config.upstreams {
            let lb = LoadBalancer::try_from_iter(up.servers.iter().map(String::as_str)).map_err(
                |source| RulesError {
                    upstream: up.name.clone(),
                    source,
                },
            )?;
            upstreams.push(Arc::new(lb));
        }
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let policy_names: Vec<String> =
                    r.limits.iter().map(|l| policy_name(&r.name, l)).collect();
                let policy_header = (!r.limits.is_empty())
                    .then(|| HeaderValue::from_str(&policy_field(&policy_names, &r.limits)).ok())
                    .flatten();
                Route {
                    name: r.name.clone(),
                    host: r.host.clone(),
                    path_prefix: r.path_prefix.clone(),
                    methods: r.methods.clone(),
                    upstream: r.upstream,
                    key: r.key.clone(),
                    shadow: r.shadow,
                    on_error: r.on_error,
                    limits: r.limits.clone(),
                    policy_names,
                    policy_header,
                    metrics: RouteMetrics::new(&r.name),
                }
            })
            .collect();
        Ok(Rules {
            routes,
            upstreams,
            upstream_names: config.upstreams.iter().map(|u| u.name.clone()).collect(),
            upstream_sizes: config.upstreams.iter().map(|u| u.servers.len()).collect(),
            client_ip: ClientIpResolver::new(config.client_ip.trusted_proxies.clone()),
        })
    }

    /// The first route that takes this request, with its index.
    pub fn find(&self, host: Option<&str>, path: &str, method: &Method) -> Option<(usize, &Route)> {
        self.routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(host, path, method))
    }
}

/// The path routes are matched against: percent-escapes decoded, empty and `.` segments
/// dropped, `..` resolved (never above the root). Upstream frameworks decode and normalise paths
/// before routing, so matching the raw path would let `/%6cogin`, `//login` or `/x/../login`
/// reach `/login` without its limits. The request is still forwarded with its raw path.
pub fn normalize_path(raw: &str) -> Cow<'_, str> {
    let bytes = raw.as_bytes();
    let clean = !raw.contains('%')
        && !raw.contains("//")
        && !bytes.windows(2).any(|w| w == b"/.")
        && raw.starts_with('/');
    if clean {
        return Cow::Borrowed(raw);
    }
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                decoded.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        decoded.push(b);
        i += 1;
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for seg in &segments {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() || (decoded.ends_with('/') && !segments.is_empty()) {
        out.push('/');
    }
    Cow::Owned(out)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The host of a request, lower-cased by the caller's choice of comparison, without its port.
pub fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host.split(']').next().map(|h| &h[1..]).unwrap_or(host);
    }
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    // `example.com.` is the same host as `example.com`.
    host.strip_suffix('.').unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_before_matching() {
        for (raw, want) in [
            ("/login", "/login"),
            ("/%6cogin", "/login"),
            ("//login", "/login"),
            ("/x/../login", "/login"),
            ("/./login/", "/login/"),
            ("/../../login", "/login"),
            ("/a%2F..%2Flogin", "/login"),
            ("/bad%zzescape%", "/bad%zzescape%"),
            ("/%", "/%"),
            ("/..", "/"),
            ("", "/"),
        ] {
            assert_eq!(normalize_path(raw), want, "{raw}");
        }
    }

    #[test]
    fn hosts_lose_port_and_trailing_dot() {
        assert_eq!(host_without_port("Example.com.:8080"), "Example.com");
        assert_eq!(host_without_port("[::1]:80"), "::1");
        assert_eq!(host_without_port("example.com"), "example.com");
    }
}
