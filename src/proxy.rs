//! The Pingora side: [`SlideGate`] implements `ProxyHttp` and wires each hook to the small
//! functions of the other modules (route match, client key, limiter decision, headers, metrics).

use std::io::Write as _;
use std::sync::Arc;
use std::time::Instant;

use once_cell::sync::Lazy;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use prometheus::Histogram;

use crate::config::OnError;
use crate::keys::bucket_key;
use crate::limiter::{Store, StoreError, Verdict};
use crate::metrics::{Decision, InFlight, StoreErrorMetrics, METRICS, NO_ROUTE_DURATION};
use crate::ratelimit_headers::{problem_body, ratelimit_field, retry_after_secs, static_problem};
use crate::request_form::{self, RequestForm};
use crate::routes::{normalize_path, Route, Rules};

/// Header names of draft-ietf-httpapi-ratelimit-headers-10.
const RATELIMIT_POLICY: &str = "RateLimit-Policy";
const RATELIMIT: &str = "RateLimit";
/// Spelled out so the header goes out in its usual case (Pingora keeps the case it is given).
const RETRY_AFTER: &str = "Retry-After";

/// Bodies of the responses that never vary, built once.
static NOT_FOUND_BODY: Lazy<Bytes> =
    Lazy::new(|| static_problem(StatusCode::NOT_FOUND, "no route matches this request"));
static BAD_REQUEST_BODY: Lazy<Bytes> =
    Lazy::new(|| static_problem(StatusCode::BAD_REQUEST, "malformed request"));
static UNAVAILABLE_BODY: Lazy<Bytes> =
    Lazy::new(|| static_problem(StatusCode::SERVICE_UNAVAILABLE, "rate limiter unavailable"));

/// The proxy: current rules (hot-swappable) and the limit store.
pub struct SlideGate {
    rules: Arc<ArcSwap<Rules>>,
    store: Arc<dyn Store>,
    limiter_duration: Histogram,
    store_errors: StoreErrorMetrics,
}

impl SlideGate {
    /// A proxy over `rules` (shared with the reloader) deciding with `store`. The store owns
    /// the decision deadline (see [`Store`]): no second timer runs here.
    pub fn new(rules: Arc<ArcSwap<Rules>>, store: Arc<dyn Store>) -> Self {
        let limiter_duration = METRICS
            .limiter_duration
            .with_label_values(&[store.backend()]);
        SlideGate {
            rules,
            store,
            limiter_duration,
            store_errors: StoreErrorMetrics::default(),
        }
    }

    /// Decide with the store, timing and counting the outcome.
    async fn decide(&self, bucket: &str, route: &Route) -> Result<Verdict, StoreError> {
        let started = Instant::now();
        let result = self.store.check(bucket, &route.spec.limits).await;
        self.limiter_duration
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.store_errors.count(e);
        }
        result
    }
}

/// Per-request state.
#[derive(Default)]
pub struct RequestCtx {
    /// The rules this request started under (a reload mid-request does not affect it).
    rules: Option<Arc<Rules>>,
    /// Index of the matched route in `rules`.
    route: Option<usize>,
    /// `RateLimit` field to add to the upstream response.
    ratelimit: Option<HeaderValue>,
    /// The bucket key (route and client) of this request.
    key: String,
    /// Servers this request could not connect to (each retried on another server).
    failed_servers: Vec<pingora::protocols::l4::socket::SocketAddr>,
    /// When the request head had been read (`new_ctx`), for the request duration histogram.
    started: Option<Instant>,
    /// When the first upstream was chosen; taken at the upstream's final response head.
    upstream_started: Option<Instant>,
    /// Holds this request in `slidegate_requests_in_flight` until the context is dropped.
    in_flight: Option<InFlight>,
    /// The host routes matched on, and what to forward for an absolute-form target.
    form: RequestForm,
}

impl RequestCtx {
    fn route(&self) -> Option<&Route> {
        Some(&self.rules.as_ref()?.routes[self.route?])
    }
}

/// Add the `RateLimit-Policy` / `RateLimit` pair of one decision to a response.
fn insert_ratelimit_fields(
    header: &mut ResponseHeader,
    route: &Route,
    ratelimit: HeaderValue,
) -> Result<()> {
    if let Some(p) = &route.policy_header {
        header.insert_header(RATELIMIT_POLICY, p.clone())?;
    }
    header.insert_header(RATELIMIT, ratelimit)
}

/// Write a complete small response from the proxy itself.
async fn respond(
    session: &mut Session,
    mut header: ResponseHeader,
    content_type: &str,
    body: Bytes,
) -> Result<()> {
    header.insert_header("Content-Type", content_type)?;
    header.insert_header("Content-Length", body.len())?;
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
}

#[async_trait]
impl ProxyHttp for SlideGate {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            started: Some(Instant::now()),
            in_flight: Some(InFlight::enter()),
            ..RequestCtx::default()
        }
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        crate::edge_conn::head_received(session);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let rules = self.rules.load_full();
        ctx.rules = Some(rules.clone());
        ctx.form = match request_form::check(session.req_header_mut()) {
            Ok(form) => form,
            Err(why) => {
                // Like nginx: 400 and close; nothing of this request reaches a route.
                log::debug!("400: {why}");
                METRICS.bad_requests.inc();
                session.set_keepalive(None);
                respond(
                    session,
                    ResponseHeader::build(400, Some(4))?,
                    "application/problem+json",
                    BAD_REQUEST_BODY.clone(),
                )
                .await?;
                return Ok(true);
            }
        };
        let req = session.req_header();
        let host = ctx.form.host.as_deref();
        let path = normalize_path(request_form::match_path(req));
        let Some((idx, route)) = rules.find(host, &path, &req.method) else {
            METRICS.no_route.inc();
            respond(
                session,
                ResponseHeader::build(404, Some(4))?,
                "application/problem+json",
                NOT_FOUND_BODY.clone(),
            )
            .await?;
            return Ok(true);
        };
        ctx.route = Some(idx);
        if route.spec.limits.is_empty() {
            route.metrics.decision(Decision::Allowed);
            return Ok(false);
        }

        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip())
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        let req = session.req_header();
        let client = rules.client_ip.resolve(peer, &req.headers);
        bucket_key(
            &mut ctx.key,
            &route.spec.name,
            &route.spec.key,
            &req.headers,
            client,
        );

        let verdict = match self.decide(&ctx.key, route).await {
            Ok(v) => v,
            Err(e) => {
                // Per request at debug level only: an outage would otherwise write a log line
                // per request; the store logs its state changes and the metrics count errors.
                log::debug!("route {}: limiter error: {e}", route.spec.name);
                if route.spec.on_error == OnError::Deny && !route.spec.shadow {
                    route.metrics.decision(Decision::ErrorDenied);
                    let mut header = ResponseHeader::build(503, Some(4))?;
                    header.insert_header(RETRY_AFTER, "1")?;
                    respond(
                        session,
                        header,
                        "application/problem+json",
                        UNAVAILABLE_BODY.clone(),
                    )
                    .await?;
                    return Ok(true);
                }
                route.metrics.decision(Decision::ErrorAllowed);
                return Ok(false);
            }
        };

        if route.spec.shadow {
            // Dry run: count what would have happened, but show the client nothing.
            if verdict.admitted {
                route.metrics.decision(Decision::Allowed);
            } else {
                route.metrics.decision(Decision::ShadowDenied);
                log::debug!("route {}: shadow deny for {}", route.spec.name, ctx.key);
            }
            return Ok(false);
        }

        let mut field = String::with_capacity(48 * route.spec.limits.len());
        ratelimit_field(&mut field, &route.policy_names, &verdict);
        let ratelimit = HeaderValue::try_from(field).ok();
        if verdict.admitted {
            route.metrics.decision(Decision::Allowed);
            ctx.ratelimit = ratelimit;
            return Ok(false);
        }

        route.metrics.decision(Decision::Denied);
        let mut header = ResponseHeader::build(429, Some(6))?;
        if let Some(r) = ratelimit {
            insert_ratelimit_fields(&mut header, route, r)?;
        }
        header.insert_header(RETRY_AFTER, retry_after_secs(&verdict))?;
        let body = problem_body(&route.spec.name, &route.policy_names, &verdict);
        respond(session, header, "application/problem+json", body.into()).await?;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let (Some(rules), Some(route)) = (ctx.rules.as_ref(), ctx.route) else {
            return Error::e_explain(ErrorType::InternalError, "no route selected");
        };
        let pool = &rules.upstreams[rules.routes[route].spec.upstream];
        // The first attempt starts the upstream clock: retries on other servers count too.
        ctx.upstream_started.get_or_insert_with(Instant::now);
        // Skip servers this request already failed to connect to.
        let failed = &ctx.failed_servers;
        let addr = match &pool.only {
            // One address: no selection to make (the balancer's pick costs ~1,500 instructions).
            Some(addr) if failed.is_empty() => Some(addr.clone()),
            _ => pool
                .lb
                .select_with(b"", 256, |b, healthy| healthy && !failed.contains(&b.addr))
                .map(|b| b.addr),
        };
        let addr = addr.ok_or_else(|| {
            Error::explain(
                ErrorType::ConnectNoRoute,
                format!("upstream {} has no server", pool.name),
            )
        })?;
        let mut peer = HttpPeer::new(addr, false, String::new());
        // Per upstream (nginx proxy_connect_timeout / proxy_read_timeout / proxy_send_timeout):
        // a black-holed upstream becomes a prompt 502, a hung one is cut instead of holding the
        // connection forever; idle pooled connections are dropped after `idle_timeout`.
        let t = pool.timeouts;
        peer.options.connection_timeout = Some(t.connect);
        peer.options.total_connection_timeout = Some(t.connect * 2);
        peer.options.read_timeout = Some(t.read);
        peer.options.write_timeout = Some(t.write);
        peer.options.idle_timeout = Some(t.idle);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Like nginx's `proxy_next_upstream error`: a server we could not connect to never saw
        // the request, so try the next one, once per other server of the pool.
        ctx.failed_servers.push(peer._address.clone());
        let servers = ctx
            .route()
            .zip(ctx.rules.as_ref())
            .map_or(1, |(route, rules)| {
                rules.upstreams[route.spec.upstream].size
            });
        if ctx.failed_servers.len() < servers {
            log::warn!("upstream {peer} unreachable, trying the next server: {e}");
            e.set_retry(true);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        request_form::forward(&ctx.form, upstream_request)?;
        // Like nginx's `$proxy_add_x_forwarded_for`: every X-Forwarded-For line the client sent,
        // joined in order, then the socket peer.
        if let Some(peer) = session.client_addr().and_then(|a| a.as_inet()) {
            let mut value = Vec::with_capacity(64);
            for prev in upstream_request.headers.get_all("x-forwarded-for") {
                value.extend_from_slice(prev.as_bytes());
                value.extend_from_slice(b", ");
            }
            let _ = write!(value, "{}", peer.ip());
            upstream_request.insert_header("X-Forwarded-For", value)?;
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream_response.status;
        // A 1xx other than 101 (e.g. `100 Continue`) is followed by the real response head.
        let final_head =
            !status.is_informational() || status == http::StatusCode::SWITCHING_PROTOCOLS;
        let upstream_started = if final_head {
            ctx.upstream_started.take()
        } else {
            None
        };
        if let Some(route) = ctx.route() {
            route.metrics.upstream_status(status.as_u16());
            if let Some(t) = upstream_started {
                route
                    .metrics
                    .upstream_duration
                    .observe(t.elapsed().as_secs_f64());
            }
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(r), Some(route)) = (ctx.ratelimit.take(), ctx.route()) {
            insert_ratelimit_fields(resp, route, r)?;
        }
        Ok(())
    }

    async fn logging(
        &self,
        session: &mut Session,
        _e: Option<&pingora::Error>,
        ctx: &mut RequestCtx,
    ) {
        crate::edge_conn::response_done(session);
        if let Some(started) = ctx.started {
            let histogram = match ctx.route() {
                Some(route) => &route.metrics.request_duration,
                None => &*NO_ROUTE_DURATION,
            };
            histogram.observe(started.elapsed().as_secs_f64());
        }
        // Done: leave the in-flight gauge now rather than whenever the context is dropped.
        ctx.in_flight = None;
    }
}
