//! A proxied request's [`LogLine`]: what its Pingora session says (method, target, version,
//! TLS, bytes, fields) with what the proxy found out about it ([`Known`]), the refusing limits
//! named and the partition key computed only for a limited route.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use pingora::proxy::Session;

use super::{tls_version_name, AccessLog, LogLine};
use crate::metrics::Decision;
use crate::routes::Route;

/// What the proxy found out about a request, for its access log line.
pub struct Known<'a> {
    /// The client address (after trusted `X-Forwarded-For` hops).
    pub client: Option<IpAddr>,
    /// The host routes matched on.
    pub host: Option<&'a str>,
    /// The matched route.
    pub route: Option<&'a Route>,
    /// The limiter decision.
    pub decision: Option<Decision>,
    /// The client's bucket key (its partition key is logged, never the key).
    pub key: &'a str,
    /// A denial's limits that had no room, one bit per limit in the route's order.
    pub refused_by: u64,
    /// The request's cost (logged on a route with cost limits).
    pub cost: u32,
    /// The cost the upstream reported (`settle`).
    pub settled_cost: Option<u32>,
    /// The upstream server used.
    pub upstream: Option<SocketAddr>,
    /// From choosing the upstream to its response header.
    pub upstream_time: Option<Duration>,
    /// The whole request.
    pub duration: Duration,
    /// The status sent (499: the client left before any response; 0: none).
    pub status: u16,
    /// What was wrong with the request, if slidegate refused it.
    pub error: Option<&'a str>,
    /// The rules assign request ids: the request's `X-Request-Id` is logged.
    pub request_ids: bool,
}

impl AccessLog {
    /// Send the line of `session`'s request, with what the proxy `known` of it.
    pub fn request(&self, session: &Session, known: Known<'_>) {
        let req = session.req_header();
        let header = |name| req.headers.get(name).map(http::HeaderValue::as_bytes);
        let tls_version = (session.digest())
            .and_then(|d| d.ssl_digest.as_ref())
            .and_then(|ssl| tls_version_name(&ssl.version));
        let limited = (known.route).filter(|r| r.spec.is_limited() && known.decision.is_some());
        let pk = limited.map(|r| r.partition_key(known.key));
        let limits = (limited.filter(|_| known.refused_by != 0))
            .map(|r| refused_names(&r.policy_names, known.refused_by));
        let cost = limited
            .filter(|r| r.spec.cost.is_weighted())
            .map(|_| known.cost);
        self.send(LogLine {
            time: SystemTime::now(),
            client: known.client,
            method: req.method.as_str(),
            host: known.host,
            path: req.uri.path(),
            target: req.raw_path(),
            version: req.version,
            tls_version,
            status: known.status,
            route: known.route.map(|r| r.spec.name.as_str()),
            decision: known.decision,
            limits: limits.as_deref(),
            pk: pk.as_ref().map(|p| p.as_str()),
            cost,
            settled_cost: known.settled_cost,
            upstream: known.upstream,
            upstream_time: known.upstream_time,
            duration: known.duration,
            bytes_received: session.body_bytes_read(),
            bytes_sent: session.body_bytes_sent(),
            user_agent: header(http::header::USER_AGENT),
            referer: header(http::header::REFERER),
            request_id: (known.request_ids)
                .then(|| crate::request::id::of(req))
                .flatten()
                .map(http::HeaderValue::as_bytes),
            request_line: None,
            error: known.error,
        });
    }
}

/// The names of the policies whose bits `refused_by` sets, comma-separated.
fn refused_names(policy_names: &[String], refused_by: u64) -> String {
    let refused = (policy_names.iter().enumerate())
        .filter(|(i, _)| refused_by & 1u64.checked_shl(*i as u32).unwrap_or(0) != 0);
    refused
        .map(|(_, name)| name.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusing_policies_are_named_in_order() {
        let names = ["a-1s", "a-60s", "a-1h"].map(String::from);
        assert_eq!(refused_names(&names, 0b101), "a-1s,a-1h");
        assert_eq!(refused_names(&names, 0b010), "a-60s");
        assert_eq!(refused_names(&names, 1 << 63), "");
    }
}
