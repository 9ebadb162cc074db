//! Label handles resolved once, so the hot path never hashes labels: a route's
//! ([`RouteMetrics`]), the store's errors ([`StoreErrorMetrics`]) and what the limiter's layers
//! report ([`LimiterMetrics`]); the decisions a route counts ([`Decision`]).

use prometheus::{Histogram, IntCounter, IntGauge};

use super::METRICS;
use crate::limiter::{Observe, StoreError, StoreErrorKind};

/// The decisions counted in `slidegate_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted by every limit (or the route has no limits).
    Allowed,
    /// Denied with 429.
    Denied,
    /// A shadow route would have denied; forwarded anyway.
    ShadowDenied,
    /// The store failed and the route fails open.
    ErrorAllowed,
    /// The store failed and the route fails closed (503).
    ErrorDenied,
    /// The shared store failed; this proxy's local log admitted the request.
    LocalAllowed,
    /// The shared store failed; this proxy's local log denied the request (429).
    LocalDenied,
    /// The client is in the route's `exempt` networks: forwarded, the store not asked.
    Exempt,
    /// Denied at first, then admitted by the store after waiting for room (`max_delay`).
    Delayed,
    /// Shed with 503: more decisions were waiting for the shared store than this proxy
    /// queues (its own overload, not a store failure: `on_error` is not consulted).
    Overloaded,
}

impl Decision {
    /// Every decision, in the order of their metric handles.
    pub const ALL: [Decision; 10] = [
        Decision::Allowed,
        Decision::Denied,
        Decision::ShadowDenied,
        Decision::ErrorAllowed,
        Decision::ErrorDenied,
        Decision::LocalAllowed,
        Decision::LocalDenied,
        Decision::Exempt,
        Decision::Delayed,
        Decision::Overloaded,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::ShadowDenied => "shadow_denied",
            Decision::ErrorAllowed => "error_allowed",
            Decision::ErrorDenied => "error_denied",
            Decision::LocalAllowed => "local_allowed",
            Decision::LocalDenied => "local_denied",
            Decision::Exempt => "exempt",
            Decision::Delayed => "delayed",
            Decision::Overloaded => "overloaded",
        }
    }
}

/// Label handles of one route, resolved once at config load so the hot path never hashes labels.
#[derive(Clone)]
pub struct RouteMetrics {
    decisions: [IntCounter; Decision::ALL.len()],
    /// Upstream responses by status class 1xx..5xx (index 0..4); anything else goes to 5xx.
    upstream: [IntCounter; 5],
    /// `slidegate_request_duration_seconds{route}`.
    pub request_duration: Histogram,
    /// `slidegate_upstream_duration_seconds{route}`.
    pub upstream_duration: Histogram,
    /// `slidegate_delay_seconds{route}`.
    pub delay: Histogram,
    /// `slidegate_leases_held{route}`.
    pub leases_held: IntGauge,
    /// Per limit, in the route's order: `slidegate_limit_admissions_total` and
    /// `slidegate_limit_denials_total` of its policy name.
    pub limits: Vec<(IntCounter, IntCounter)>,
}

impl RouteMetrics {
    /// Resolve (and so create, at zero) every series of a route whose limits' policy names are
    /// `policies`.
    pub fn new(route: &str, policies: &[String]) -> Self {
        let m = &*METRICS;
        let d = |d: Decision| m.requests.with_label_values(&[route, d.as_str()]);
        let u = |c: &str| m.upstream_responses.with_label_values(&[route, c]);
        RouteMetrics {
            decisions: Decision::ALL.map(d),
            upstream: [u("1xx"), u("2xx"), u("3xx"), u("4xx"), u("5xx")],
            request_duration: m.request_duration.with_label_values(&[route]),
            upstream_duration: m.upstream_duration.with_label_values(&[route]),
            delay: m.delay.with_label_values(&[route]),
            leases_held: m.leases_held.with_label_values(&[route]),
            limits: (policies.iter())
                .map(|p| {
                    let l = [route, p.as_str()];
                    let counters = (&m.limit_admissions, &m.limit_denials);
                    (
                        counters.0.with_label_values(&l),
                        counters.1.with_label_values(&l),
                    )
                })
                .collect(),
        }
    }

    /// The current value of every decision counter of this route, in [`Decision::ALL`] order.
    pub fn decision_counts(&self) -> [(Decision, u64); Decision::ALL.len()] {
        Decision::ALL.map(|d| (d, self.decisions[d as usize].get()))
    }

    /// Count one decision.
    pub fn decision(&self, d: Decision) {
        self.decisions[d as usize].inc();
    }

    /// Count one upstream response.
    pub fn upstream_status(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.upstream[class].inc();
    }
}

/// `slidegate_store_errors_total` handles, resolved once, indexed by [`StoreErrorKind`].
#[derive(Clone)]
pub struct StoreErrorMetrics {
    by_kind: [IntCounter; StoreErrorKind::ALL.len()],
}

impl Default for StoreErrorMetrics {
    fn default() -> Self {
        let c = |kind: StoreErrorKind| METRICS.store_errors.with_label_values(&[kind.as_str()]);
        StoreErrorMetrics {
            by_kind: StoreErrorKind::ALL.map(c),
        }
    }
}

impl StoreErrorMetrics {
    /// Count one failed decision.
    pub fn count(&self, error: &StoreError) {
        if let Some(kind) = error.kind() {
            self.by_kind[kind as usize].inc();
        }
    }
}

/// What the limiter's layers report ([`Observe`]): `slidegate_limiter_duration_seconds{backend}`
/// and `slidegate_store_errors_total{kind}`.
pub struct LimiterMetrics {
    duration: Histogram,
    errors: StoreErrorMetrics,
}

impl LimiterMetrics {
    /// The handles of a store whose metric label is `backend`.
    pub fn new(backend: &str) -> LimiterMetrics {
        LimiterMetrics {
            duration: METRICS.limiter_duration.with_label_values(&[backend]),
            errors: StoreErrorMetrics::default(),
        }
    }
}

impl Observe for LimiterMetrics {
    fn answered(&self, took: std::time::Duration) {
        self.duration.observe(took.as_secs_f64());
    }

    fn failed(&self, error: &StoreError) {
        self.errors.count(error);
    }
}
