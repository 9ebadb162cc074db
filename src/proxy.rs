//! The Pingora side: [`SlideGate`] implements `ProxyHttp` and wires each hook to the small
//! functions of the other modules (route match, client key, limiter decision, headers, metrics).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use once_cell::sync::Lazy;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::header::HOST;
use http::{HeaderValue, StatusCode};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use prometheus::Histogram;

use crate::access_log::{AccessLog, Record};
use crate::config::OnError;
use crate::forwarding::{self, Hop, Scheme};
use crate::keys::bucket_key;
use crate::limiter::{Store, StoreError, Verdict};
use crate::metrics::{Decision, StoreErrorMetrics, METRICS};
use crate::ratelimit_headers::{problem_body, ratelimit_field, retry_after_secs, static_problem};
use crate::routes::{host_without_port, normalize_path, Route, Rules};

/// Header names of draft-ietf-httpapi-ratelimit-headers-10.
const RATELIMIT_POLICY: &str = "RateLimit-Policy";
const RATELIMIT: &str = "RateLimit";
/// Spelled out so the header goes out in its usual case (Pingora keeps the case it is given).
const RETRY_AFTER: &str = "Retry-After";

/// Bodies of the responses that never vary, built once.
static NOT_FOUND_BODY: Lazy<Bytes> =
    Lazy::new(|| static_problem(StatusCode::NOT_FOUND, "no route matches this request"));
static UNAVAILABLE_BODY: Lazy<Bytes> =
    Lazy::new(|| static_problem(StatusCode::SERVICE_UNAVAILABLE, "rate limiter unavailable"));

/// The proxy: current rules (hot-swappable) and the limit store.
pub struct SlideGate {
    rules: Arc<ArcSwap<Rules>>,
    store: Arc<dyn Store>,
    limiter_duration: Histogram,
    store_errors: StoreErrorMetrics,
    access_log: Option<AccessLog>,
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
            access_log: None,
        }
    }

    /// Send one line per request to `log`.
    pub fn with_access_log(mut self, log: Option<AccessLog>) -> Self {
        self.access_log = log;
        self
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

/// When the phases of a request happened; shared by the access log and the request metrics.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The request header has been read (the context is created then).
    pub start: Instant,
    /// The first upstream server was chosen (connect, retries and the request follow).
    pub upstream_start: Option<Instant>,
    /// The upstream's final response header arrived (`1xx` do not count).
    pub upstream_head: Option<Instant>,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            start: Instant::now(),
            upstream_start: None,
            upstream_head: None,
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
    client: Option<IpAddr>,
    /// What the limiter decided (as counted in `slidegate_requests_total`).
    decision: Option<Decision>,
    /// The upstream server this request was last sent to.
    upstream: Option<SocketAddr>,
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
}

impl RequestCtx {
    fn route(&self) -> Option<&Route> {
        Some(&self.rules.as_ref()?.routes[self.route?])
    }

    /// Count a decision and remember it for the access log.
    fn record(&mut self, route: &Route, decision: Decision) {
        route.metrics.decision(decision);
        self.decision = Some(decision);
    }
}

/// An HTTP/1.0 client cannot read chunked framing: send it the body close-delimited (no
/// `Transfer-Encoding`, connection closed at the end), as nginx does.
fn close_delimit_for_http10(session: &mut Session, resp: &mut ResponseHeader) {
    if session.req_header().version == http::Version::HTTP_10
        && resp.headers.contains_key(http::header::TRANSFER_ENCODING)
    {
        resp.remove_header(&http::header::TRANSFER_ENCODING);
        session.set_keepalive(None);
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
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let rules = self.rules.load_full();
        ctx.rules = Some(rules.clone());
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip())
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        let req = session.req_header();
        let client = rules.client_ip.resolve(peer, &req.headers);
        ctx.client = Some(client);
        let host = req
            .uri
            .host()
            .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()))
            .map(host_without_port);
        let path = normalize_path(req.uri.path());
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
            ctx.record(route, Decision::Allowed);
            return Ok(false);
        }
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
                    ctx.record(route, Decision::ErrorDenied);
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
                ctx.record(route, Decision::ErrorAllowed);
                return Ok(false);
            }
        };

        if route.spec.shadow {
            // Dry run: count what would have happened, but show the client nothing.
            if verdict.admitted {
                ctx.record(route, Decision::Allowed);
            } else {
                ctx.record(route, Decision::ShadowDenied);
                log::debug!("route {}: shadow deny for {}", route.spec.name, ctx.key);
            }
            return Ok(false);
        }

        let mut field = String::with_capacity(48 * route.spec.limits.len());
        ratelimit_field(&mut field, &route.policy_names, &verdict);
        let ratelimit = HeaderValue::try_from(field).ok();
        if verdict.admitted {
            ctx.record(route, Decision::Allowed);
            ctx.ratelimit = ratelimit;
            return Ok(false);
        }

        ctx.record(route, Decision::Denied);
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
        // Skip servers this request already failed to connect to.
        let failed = &ctx.failed_servers;
        let backend = pool
            .lb
            .select_with(b"", 256, |b, healthy| healthy && !failed.contains(&b.addr));
        let backend = backend.ok_or_else(|| {
            Error::explain(
                ErrorType::ConnectNoRoute,
                format!("upstream {} has no server", pool.name),
            )
        })?;
        let Some(addr) = backend.addr.as_inet().copied() else {
            return Error::e_explain(ErrorType::InternalError, "upstream is not an IP address");
        };
        ctx.upstream = Some(addr);
        ctx.timing.upstream_start.get_or_insert_with(Instant::now);
        let mut peer = pool.transport.peer(addr);
        // Bound connection setup so a black-holed upstream becomes a prompt 502.
        peer.options.connection_timeout = Some(Duration::from_secs(5));
        peer.options.total_connection_timeout = Some(Duration::from_secs(10));
        // Like nginx's proxy_read_timeout / proxy_send_timeout: a hung upstream is cut after 60 s
        // of silence instead of holding the connection forever.
        peer.options.read_timeout = Some(Duration::from_secs(60));
        peer.options.write_timeout = Some(Duration::from_secs(60));
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
        if let (Some(peer), Some(rules)) = (
            session.client_addr().and_then(|a| a.as_inet()),
            ctx.rules.as_ref(),
        ) {
            let peer = peer.ip();
            let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
            let hop = Hop {
                peer,
                client: ctx.client.unwrap_or(peer),
                peer_trusted: rules.client_ip.is_trusted(peer),
                scheme: if tls { Scheme::Https } else { Scheme::Http },
            };
            forwarding::apply(upstream_request, &hop)?;
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(route) = ctx.route() {
            route
                .metrics
                .upstream_status(upstream_response.status.as_u16());
        }
        // A 100 Continue is not the upstream's answer.
        if !upstream_response.status.is_informational() {
            ctx.timing.upstream_head.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(r), Some(route)) = (ctx.ratelimit.take(), ctx.route()) {
            insert_ratelimit_fields(resp, route, r)?;
        }
        close_delimit_for_http10(session, resp);
        Ok(())
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let Some(log) = &self.access_log else {
            return;
        };
        let req = session.req_header();
        let host = req
            .uri
            .host()
            .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()))
            .map(host_without_port);
        let status = match session.response_written() {
            Some(resp) => resp.status.as_u16(),
            // nginx's 499: the client closed the connection before a response was sent.
            None if e.is_some_and(crate::log_hygiene::is_client_abort) => 499,
            None => 0,
        };
        log.send(Record {
            time: SystemTime::now(),
            client: ctx.client,
            method: req.method.as_str(),
            host,
            path: req.uri.path(),
            version: req.version,
            status,
            route: ctx.route().map(|r| r.spec.name.as_str()),
            decision: ctx.decision,
            upstream: ctx.upstream,
            upstream_time: ctx.timing.upstream(),
            duration: ctx.timing.start.elapsed(),
            bytes_sent: session.body_bytes_sent(),
        });
    }

    fn suppress_error_log(&self, session: &Session, _ctx: &RequestCtx, error: &Error) -> bool {
        crate::log_hygiene::suppress(session, error)
    }

    fn request_summary(&self, session: &Session, _ctx: &RequestCtx) -> String {
        crate::log_hygiene::summary(session)
    }
}
