//! Per-request state: what the hooks learn about a request and hand to the later hooks.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::limiter::Buckets;
use crate::metrics::{Decision, InFlight};
use crate::request::form::RequestForm;
use crate::request::forwarding::OwnHop;
use crate::routes::{Route, Rules};

/// When the phases of a request happened; shared by the access log and the request metrics.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The request header has been read (the context is created then).
    pub start: Instant,
    /// The first upstream server was chosen (connect, retries and the request follow).
    pub upstream_start: Option<Instant>,
    /// The upstream's final response header arrived (`1xx` do not count).
    pub upstream_head: Option<Instant>,
    /// The first bytes of an HTTP/2 request body arrived (its `client_body_timeout` starts).
    pub body_start: Option<Instant>,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            start: Instant::now(),
            upstream_start: None,
            upstream_head: None,
            body_start: None,
        }
    }
}

impl Timing {
    /// From choosing the upstream to its response header, if it answered.
    pub fn upstream(&self) -> Option<Duration> {
        Some(
            self.upstream_head?
                .saturating_duration_since(self.upstream_start?),
        )
    }
}

/// Per-request state.
#[derive(Default)]
pub struct RequestCtx {
    /// Request phase times.
    pub timing: Timing,
    /// The client address (trusted `X-Forwarded-For` hops applied), set by `request_filter`.
    pub(super) client: Option<IpAddr>,
    /// What the limiter decided (as counted in `slidegate_requests_total`).
    pub(super) decision: Option<Decision>,
    /// Why slidegate refused the request (400) before it was counted: the access log's
    /// `error`.
    pub(super) refused: Option<crate::request::form::BadRequest>,
    /// A denial's limits that had no room, one bit per limit in the route's order (the
    /// access log names them).
    pub(super) refused_by: u64,
    /// The request's cost in its route's cost limits (read only on a route that has some).
    pub(super) cost: u32,
    /// The upstream server this request was last sent to.
    pub(super) upstream: Option<SocketAddr>,
    /// The rules this request started under (a reload mid-request does not affect it).
    pub(super) rules: Option<Arc<Rules>>,
    /// Index of the matched route in `rules`.
    pub(super) route: Option<usize>,
    /// `RateLimit` field to add to the upstream response.
    pub(super) ratelimit: Option<HeaderValue>,
    /// `X-RateLimit-*` values to add to the upstream response (`legacy_headers`).
    pub(super) legacy: Option<crate::response::ratelimit_headers::Legacy>,
    /// The bucket key (route and client) of this request.
    pub(super) key: String,
    /// The buckets of the route's limits with keys of their own (`limits[].key`), in the order
    /// of [`LimitKeys::keys`](crate::config::LimitKeys::keys); empty for other routes.
    pub(super) limit_keys: Vec<String>,
    /// Servers this request could not connect to (each retried on another server).
    pub(super) failed_servers: Vec<pingora::protocols::l4::socket::SocketAddr>,
    /// Holds this request in `slidegate_requests_in_flight` until the context is dropped.
    pub(super) in_flight: Option<InFlight>,
    /// The host routes matched on, and what to forward for an absolute-form target.
    pub(super) form: RequestForm,
    /// The forwarding values of this connection's own hop: built at its first proxied request,
    /// carried to the next requests of an HTTP/1 connection by `persist_connection_context`.
    pub(super) own_hop: Option<Arc<OwnHop>>,
    /// An admission on a `count_status` route, until the upstream's status says whether it
    /// counts.
    pub(super) ticket: Option<crate::limiter::settle::Ticket>,
    /// The leases of the route's concurrency limits this request holds, given back when it
    /// ends (`logging`), however it ends; after a client's abort, once the upstream is done.
    pub(super) lease: Option<crate::limiter::lease::Lease>,
    /// Who ended an upgraded request's tunnel first, for `settle` (see [`Tunnel`]).
    pub(super) tunnel: Tunnel,
    /// `settle = "json:…"`: the scan of the response body for its usage, until its end.
    pub(super) scan: Option<Box<crate::response::usage::Scan>>,
}

/// An upgraded request (`101`): its tunnel ends cleanly whichever side closes, so a client
/// leaving the session is told apart by its side ending while the upstream's was still open.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tunnel {
    /// No `101` (yet).
    #[default]
    None,
    /// Switched; neither side has ended.
    Open,
    /// The client ended its side first: it left the session.
    ClientLeft,
    /// The upstream ended its side first (or alone).
    UpstreamEnded,
}

impl RequestCtx {
    /// The buckets this request counts in on `route`: its own (`key`), and those of the
    /// route's limits with keys of their own.
    pub(super) fn buckets<'a>(&'a self, route: &'a Route) -> Buckets<'a> {
        Buckets::stacked(&self.key, &self.limit_keys, &route.spec.limit_keys.of_limit)
    }

    pub(super) fn route(&self) -> Option<&Route> {
        Some(&self.rules.as_ref()?.routes[self.route?])
    }

    /// This request's upstream failed it before any head came (a `502` or `504` of the
    /// upstream's making): counted against the server's `max_fails`, unless its connect
    /// failed and was counted then.
    pub(super) fn upstream_failed(&self, e: &pingora::Error) {
        use pingora::{ErrorSource, ErrorType};
        let upstream_made = *e.esource() == ErrorSource::Upstream
            && !matches!(e.etype(), ErrorType::HTTPStatus(_))
            && self.timing.upstream_head.is_none();
        let (Some(server), Some(route), Some(rules)) = (self.upstream, self.route(), &self.rules)
        else {
            return;
        };
        let counted = (self.failed_servers.iter()).any(|f| f.as_inet() == Some(&server));
        if upstream_made && !counted {
            rules.upstreams[route.spec.upstream]
                .health
                // Its kind only: a refused head's context quotes the head (cookies, tokens),
                // which the log must never carry (issue 52 row 11).
                .failed(server, &e.etype().as_str());
        }
    }

    /// Count a decision and remember it for the access log.
    pub(super) fn record(&mut self, route: &Route, decision: Decision) {
        if crate::proxy::bench_switch::on(crate::proxy::bench_switch::Layer::Metrics) {
            route.metrics.decision(decision);
        }
        self.decision = Some(decision);
    }
}
