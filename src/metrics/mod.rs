//! Prometheus metrics, registered in the default registry that `pingora-prometheus` and the
//! admin endpoint gather from (both use prometheus 0.14; another version would hide them).
//!
//! Labels are bounded: route names come from the config, never from requests.

mod handles;

use std::sync::LazyLock;

pub use handles::{Decision, LimiterMetrics, RouteMetrics, StoreErrorMetrics};

use prometheus::{
    register_histogram_vec, register_int_counter, register_int_counter_vec, register_int_gauge,
    register_int_gauge_vec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec,
};

/// The proxy's metrics: everything but `slidegate_client_aborts_total` ([`crate::logs::hygiene`])
/// and `slidegate_access_log_dropped_total` ([`crate::access_log`]), which live with what they
/// count.
pub struct Metrics {
    /// `slidegate_requests_total{route,decision}`.
    pub requests: IntCounterVec,
    /// `slidegate_no_route_total`: requests answered 404 because no route matched.
    pub no_route: IntCounter,
    /// `slidegate_limiter_duration_seconds{backend}`.
    pub limiter_duration: HistogramVec,
    /// `slidegate_upstream_responses_total{route,class}`.
    pub upstream_responses: IntCounterVec,
    /// `slidegate_store_errors_total{kind}`.
    pub store_errors: IntCounterVec,
    /// `slidegate_config_reloads_total{result}`.
    pub config_reloads: IntCounterVec,
    /// `slidegate_client_connections`: client connections open on the proxy listener.
    pub client_connections: IntGauge,
    /// `slidegate_client_connections_refused_total`: closed at once over `max_connections`.
    pub client_connections_refused: IntCounter,
    /// `slidegate_client_header_timeouts_total`: heads cut by `client_header_timeout`.
    pub client_header_timeouts: IntCounter,
    /// `slidegate_client_idle_closed_total`: connections closed with no request in time.
    pub client_idle_closed: IntCounter,
    /// `slidegate_client_body_timeouts_total`: request bodies cut by `client_body_timeout`.
    pub client_body_timeouts: IntCounter,
    /// `slidegate_client_send_timeouts_total`: connections cut by `send_timeout`.
    pub client_send_timeouts: IntCounter,
    /// `slidegate_bad_requests_total`: requests answered 400 before routing.
    pub bad_requests: IntCounter,
    /// `slidegate_store_evictions_total`: clients evicted from the full memory store.
    pub store_evictions: IntCounter,
    /// `slidegate_memory_overflow_total{route}`: decisions the memory store made in a route's
    /// summary of evicted clients alone, its share too small to hold one client's bucket.
    pub memory_overflow: IntCounterVec,
    /// `slidegate_refunds_total{route,result}`: admissions given back under `count_status`
    /// (`result="ok"`), or whose refund failed and kept the admission counted (`"error"`).
    pub refunds: IntCounterVec,
    /// `slidegate_leases_held{route}`: leases of concurrency limits this proxy took and has
    /// not given back yet (per proxy: other proxies sharing the store hold their own).
    pub leases_held: IntGaugeVec,
    /// `slidegate_cost_admitted_total{route,limit}` / `slidegate_cost_denied_total{route,limit}`:
    /// cost units of admitted / denied requests in each cost limit (`limit`: its policy name).
    pub cost_admitted: IntCounterVec,
    /// See [`Metrics::cost_admitted`].
    pub cost_denied: IntCounterVec,
    /// `slidegate_cost_settled_total{route,limit}`: on a `settle` route, the cost units each
    /// request holds in each cost limit once settled (the real cost the upstream reported, or
    /// the charge where it stands), so a dashboard shows units used, not estimated.
    pub cost_settled: IntCounterVec,
    /// `slidegate_limit_denials_total{route,limit}`: denials counted under each limit that had
    /// no room (`limit`: its policy name, as in the RateLimit fields; a denial by two full
    /// limits counts in both).
    pub limit_denials: IntCounterVec,
    /// `slidegate_limit_admissions_total{route,limit}`: admissions counted in each limit.
    pub limit_admissions: IntCounterVec,
    /// `slidegate_build_info{version,commit}`: 1, naming the running build.
    pub build_info: IntGaugeVec,
    /// `slidegate_plan_requests_total{route,plan}`: limited requests of a route with plans,
    /// by the plan their client's limits came from (bounded by the config's plans).
    pub plan_requests: IntCounterVec,
    /// `slidegate_plan_fallbacks_total{route,reason}`: client plans read that could not be
    /// used: `unknown_plan` (the store names a plan the config lacks: the default counts the
    /// client) or `store_error` (the read failed: the plan read before, else the default).
    pub plan_fallbacks: IntCounterVec,
    /// `slidegate_settlements_total{route,result}`: requests of a `settle` route whose real
    /// cost corrected the charge (`given_back`, `charged`, `unchanged`), or did not (`missing`,
    /// `invalid`, `cut_off`, `oversized`, `encoded`, `error`: the charge stands).
    pub settlements: IntCounterVec,
    /// `slidegate_request_duration_seconds{route}`: whole requests, from the first hook to the
    /// logging hook. `route=""` holds requests that matched no route (no route name is empty).
    pub request_duration: HistogramVec,
    /// `slidegate_upstream_duration_seconds{route}`: from choosing the upstream (connect
    /// included) until its final response head (a `100 Continue` is not one).
    pub upstream_duration: HistogramVec,
    /// `slidegate_delay_seconds{route}`: how long each request that waited for room
    /// (`max_delay`) waited, whatever it got after.
    pub delay: HistogramVec,
    /// `slidegate_requests_in_flight`: requests between their first hook and their end.
    pub in_flight: IntGauge,
    /// `slidegate_requests_waiting`: requests waiting for room now (`max_delay`).
    pub waiting: IntGauge,
    /// `slidegate_delay_refused_total`: denials answered at once because `store.max_delayed`
    /// requests were already waiting.
    pub delay_refused: IntCounter,
    /// `slidegate_tls_handshake_failures_total{reason}`: client TLS handshakes that failed
    /// (`reason="error"`: bad or no TLS, unknown SNI name, no shared version) or did not end
    /// within `client_header_timeout` (`"timeout"`).
    pub tls_handshake_failures: IntCounterVec,
    /// `slidegate_upstream_connect_failures_total{upstream}`: connections to an upstream
    /// server that could not be made (refused, timed out, unreachable).
    pub upstream_connect_failures: IntCounterVec,
    /// `slidegate_store_ready`: 1 while the store answers (what `/readyz?store` says), else 0, so
    /// Prometheus can alert on the store without probing it (`/readyz` stays 200 through a
    /// store outage unless every route fails closed: [`crate::admin::readiness`]).
    pub store_ready: IntGauge,
}

/// Buckets of the request and upstream duration histograms: 0.5 ms (a limited route answered
/// locally) to 60 s (the upstream read timeout).
const REQUEST_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Buckets of the delay histogram: 1 ms to 60 s (the largest `max_delay`).
const DELAY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Create every series that has no labels, so `/metrics` shows them (at zero) from the start.
///
/// The standard `process_*` metrics (CPU, memory, open fds, start time) need no call: with the
/// prometheus crate's `process` feature, its default registry registers a `ProcessCollector` for
/// this process when it is first used (Linux only), and `/metrics` gathers that registry.
pub fn init() {
    for reason in ["error", "timeout"] {
        METRICS.tls_handshake_failures.with_label_values(&[reason]);
    }
}

/// Counts a request in `slidegate_requests_in_flight` for as long as it lives: created with the
/// request's context, dropped with it, so no early return or error path can leak a count.
pub struct InFlight(());

impl InFlight {
    /// Count one more request in flight.
    pub fn enter() -> InFlight {
        METRICS.in_flight.inc();
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        METRICS.in_flight.dec();
    }
}

/// The process-wide metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    Metrics {
    requests: register_int_counter_vec!(
        "slidegate_requests_total",
        "Requests matched to a route, by limiter decision",
        &["route", "decision"]
    )
    .expect("register slidegate_requests_total"),
    no_route: register_int_counter!(
        "slidegate_no_route_total",
        "Requests that matched no route (answered 404)"
    )
    .expect("register slidegate_no_route_total"),
    limiter_duration: register_histogram_vec!(
        "slidegate_limiter_duration_seconds",
        "Time to reach a limiter decision, including timeouts",
        &["backend"],
        vec![
            0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25
        ]
    )
    .expect("register slidegate_limiter_duration_seconds"),
    upstream_responses: register_int_counter_vec!(
        "slidegate_upstream_responses_total",
        "Responses received from upstreams, by route and status class",
        &["route", "class"]
    )
    .expect("register slidegate_upstream_responses_total"),
    store_errors: register_int_counter_vec!(
        "slidegate_store_errors_total",
        "Limiter decisions that failed, by kind",
        &["kind"]
    )
    .expect("register slidegate_store_errors_total"),
    config_reloads: register_int_counter_vec!(
        "slidegate_config_reloads_total",
        "Configuration reloads, by result",
        &["result"]
    )
    .expect("register slidegate_config_reloads_total"),
    request_duration: register_histogram_vec!(
        "slidegate_request_duration_seconds",
        "Whole requests, from the first proxy hook to the logging hook, by route (\"\" = no route matched)",
        &["route"],
        REQUEST_BUCKETS.to_vec()
    )
    .expect("register slidegate_request_duration_seconds"),
    upstream_duration: register_histogram_vec!(
        "slidegate_upstream_duration_seconds",
        "Upstream time, connect included, until the upstream's final response head, by route",
        &["route"],
        REQUEST_BUCKETS.to_vec()
    )
    .expect("register slidegate_upstream_duration_seconds"),
    delay: register_histogram_vec!(
        "slidegate_delay_seconds",
        "Time requests waited for room (max_delay) before their final decision, by route",
        &["route"],
        DELAY_BUCKETS.to_vec()
    )
    .expect("register slidegate_delay_seconds"),
    in_flight: register_int_gauge!(
        "slidegate_requests_in_flight",
        "Requests being processed by the proxy"
    )
    .expect("register slidegate_requests_in_flight"),
    waiting: register_int_gauge!(
        "slidegate_requests_waiting",
        "Requests waiting for room (max_delay) now"
    )
    .expect("register slidegate_requests_waiting"),
    delay_refused: register_int_counter!(
        "slidegate_delay_refused_total",
        "Denials answered at once because store.max_delayed requests were already waiting"
    )
    .expect("register slidegate_delay_refused_total"),
    tls_handshake_failures: register_int_counter_vec!(
        "slidegate_tls_handshake_failures_total",
        "Client TLS handshakes that failed (error) or did not finish in time (timeout)",
        &["reason"]
    )
    .expect("register slidegate_tls_handshake_failures_total"),
    upstream_connect_failures: register_int_counter_vec!(
        "slidegate_upstream_connect_failures_total",
        "Connections to an upstream server that could not be made, by upstream",
        &["upstream"]
    )
    .expect("register slidegate_upstream_connect_failures_total"),
    store_ready: register_int_gauge!(
        "slidegate_store_ready",
        "1 while the limit store answers (as /readyz?store), 0 otherwise"
    )
    .expect("register slidegate_store_ready"),
    client_connections: register_int_gauge!(
        "slidegate_client_connections",
        "Client connections currently open on the proxy listener"
    )
    .expect("register slidegate_client_connections"),
    client_connections_refused: register_int_counter!(
        "slidegate_client_connections_refused_total",
        "Client connections closed at once because max_connections were open"
    )
    .expect("register slidegate_client_connections_refused_total"),
    client_header_timeouts: register_int_counter!(
        "slidegate_client_header_timeouts_total",
        "Request heads not received within client_header_timeout (answered 408)"
    )
    .expect("register slidegate_client_header_timeouts_total"),
    client_idle_closed: register_int_counter!(
        "slidegate_client_idle_closed_total",
        "Client connections closed because no request began in time"
    )
    .expect("register slidegate_client_idle_closed_total"),
    client_body_timeouts: register_int_counter!(
        "slidegate_client_body_timeouts_total",
        "Request bodies not received within client_body_timeout (answered 408)"
    )
    .expect("register slidegate_client_body_timeouts_total"),
    client_send_timeouts: register_int_counter!(
        "slidegate_client_send_timeouts_total",
        "Client connections closed because the client took no response bytes for send_timeout"
    )
    .expect("register slidegate_client_send_timeouts_total"),
    bad_requests: register_int_counter!(
        "slidegate_bad_requests_total",
        "Requests answered 400 before routing (method, target, Host, Content-Length)"
    )
    .expect("register slidegate_bad_requests_total"),
    store_evictions: register_int_counter!(
        "slidegate_store_evictions_total",
        "Clients evicted from the memory store to stay within max_memory"
    )
    .expect("register slidegate_store_evictions_total"),
    memory_overflow: register_int_counter_vec!(
        "slidegate_memory_overflow_total",
        "Memory store decisions made in a route's summary alone (its share too small for one bucket)",
        &["route"]
    )
    .expect("register slidegate_memory_overflow_total"),
    refunds: register_int_counter_vec!(
        "slidegate_refunds_total",
        "Admissions given back because the upstream status is not in the route's count_status",
        &["route", "result"]
    )
    .expect("register slidegate_refunds_total"),
    leases_held: register_int_gauge_vec!(
        "slidegate_leases_held",
        "Leases of concurrency limits this proxy took and has not given back yet",
        &["route"]
    )
    .expect("register slidegate_leases_held"),
    cost_admitted: register_int_counter_vec!(
        "slidegate_cost_admitted_total",
        "Cost units of admitted requests, per cost limit (unit = \"cost\")",
        &["route", "limit"]
    )
    .expect("register slidegate_cost_admitted_total"),
    cost_denied: register_int_counter_vec!(
        "slidegate_cost_denied_total",
        "Cost units of denied requests, per cost limit (unit = \"cost\")",
        &["route", "limit"]
    )
    .expect("register slidegate_cost_denied_total"),
    cost_settled: register_int_counter_vec!(
        "slidegate_cost_settled_total",
        "Cost units of settle routes' requests once settled, per cost limit",
        &["route", "limit"]
    )
    .expect("register slidegate_cost_settled_total"),
    limit_denials: register_int_counter_vec!(
        "slidegate_limit_denials_total",
        "Denials, under each limit that had no room (limit: its policy name)",
        &["route", "limit"]
    )
    .expect("register slidegate_limit_denials_total"),
    plan_requests: register_int_counter_vec!(
        "slidegate_plan_requests_total",
        "Limited requests of a route with plans, by their client's plan",
        &["route", "plan"]
    )
    .expect("register slidegate_plan_requests_total"),
    plan_fallbacks: register_int_counter_vec!(
        "slidegate_plan_fallbacks_total",
        "Client plan reads that could not be used (reason: unknown_plan, store_error)",
        &["route", "reason"]
    )
    .expect("register slidegate_plan_fallbacks_total"),
    limit_admissions: register_int_counter_vec!(
        "slidegate_limit_admissions_total",
        "Admissions, counted in each limit of the route (limit: its policy name)",
        &["route", "limit"]
    )
    .expect("register slidegate_limit_admissions_total"),
    build_info: {
        let info = register_int_gauge_vec!(
            "slidegate_build_info",
            "1, with the running build's version and commit as labels",
            &["version", "commit"]
        )
        .expect("register slidegate_build_info");
        let commit = option_env!("SLIDEGATE_COMMIT").unwrap_or("unknown");
        info.with_label_values(&[env!("CARGO_PKG_VERSION"), commit]).set(1);
        info
    },
    settlements: register_int_counter_vec!(
        "slidegate_settlements_total",
        "Requests of a settle route, by what their real cost did to the charge",
        &["route", "result"]
    )
    .expect("register slidegate_settlements_total"),
}
});

/// `slidegate_request_duration_seconds{route=""}`: requests that matched no route.
pub static NO_ROUTE_DURATION: LazyLock<Histogram> =
    LazyLock::new(|| METRICS.request_duration.with_label_values(&[""]));
