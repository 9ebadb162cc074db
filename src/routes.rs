//! The rule set a request is matched against: routes in file order (first match wins), their
//! upstream pools, and everything the hot path needs precomputed (policy names and header
//! values, metric handles).
//!
//! A [`Rules`] is immutable; a reload builds a new one and swaps it in whole, so a request in
//! flight finishes under the rules it started with.

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

/// The host of a request, lower-cased by the caller's choice of comparison, without its port.
pub fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host.split(']').next().map(|h| &h[1..]).unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}
