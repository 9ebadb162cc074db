//! The Pingora side: [`SlideGate`] implements `ProxyHttp` and wires each hook to the small
//! functions of the other modules (route match, client key, limiter decision, headers, metrics).

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, ProxyWarnLogContext, Session};

use crate::metrics::InFlight;
use crate::proxy::bench_switch::{on, Layer};
use crate::request::form;
use crate::request::forwarding::{self, Hop, OwnHop, Scheme};

mod answer_fields;
pub mod bench_switch;
mod ctx;
#[cfg(test)]
mod delay_tests;
mod discard;
mod ended;
#[cfg(test)]
mod fallback_tests;
mod findings;
mod gate;
mod limiter;
mod outcome;
mod respond;
mod settle;
#[cfg(test)]
mod tests;
mod upstream_fields;
mod usage;

use ctx::Tunnel;
pub use ctx::{RequestCtx, Timing};
use findings::peer_ip;
pub use gate::SlideGate;
use outcome::outcome;
use respond::{close_delimit_for_http10, insert_legacy_fields, insert_ratelimit_fields};

#[async_trait]
impl ProxyHttp for SlideGate {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            in_flight: on(Layer::Metrics).then(InFlight::enter),
            ..RequestCtx::default()
        }
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        crate::edge::head_received(session);
        // An HTTP/2 stream whose client grants no flow-control window never blocks the socket,
        // so the edge's `send_timeout` (which watches the socket) never fires, and the stream
        // would hold its upstream connection and buffers for as long as the client keeps the
        // connection alive: each write of its body gets `send_timeout` instead, as nginx's
        // `send_timeout` bounds the time between two writes.
        if session.as_downstream().is_http2() {
            session
                .as_downstream_mut()
                .set_write_timeout(self.send_timeout);
        }
        // RFC 9112 §9.3.2: requests a client pipelines are answered in order, each one routed
        // and counted. Pingora's default drops every request after the first of a write and
        // closes; the opt-in is carried over to the connection's next requests.
        session.set_pipelining_enabled(true);
        // RFC 9110 §15.2: HTTP/1.0 defined no 1xx, so a server must not send one to an HTTP/1.0
        // client. Pingora forwards an upstream's 1xx unless told (its `100 Continue` exception
        // asks for `Expect` on HTTP/1.1, which such a request cannot be).
        if session.req_header().version < http::Version::HTTP_11 {
            session.as_downstream_mut().set_ignore_info_resp(true);
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        _body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if end_of_stream {
            crate::edge::body_done(session);
            if ctx.tunnel == Tunnel::Open {
                ctx.tunnel = Tunnel::ClientLeft;
            }
        } else if let Some(limit) = self.body_timeout.filter(|_| session.is_http2()) {
            // HTTP/2 streams share one socket, which the edge's body deadline cannot watch: a
            // body trickled just inside `read_timeout` would hold its stream and an upstream
            // connection for ever (issue 52 row 7). Timed from the first body bytes, so a
            // delayed (`max_delay`) admission does not count; a body that stops altogether is
            // the upstream's `read_timeout`'s to end.
            let started = *ctx.timing.body_start.get_or_insert_with(Instant::now);
            if started.elapsed() > limit {
                crate::metrics::METRICS.client_body_timeouts.inc();
                return Error::e_explain(
                    ErrorType::HTTPStatus(408),
                    "client_body_timeout: HTTP/2 request body not received in time",
                );
            }
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        if end_of_stream && ctx.tunnel == Tunnel::Open {
            ctx.tunnel = Tunnel::UpstreamEnded;
        }
        // `settle = "json:…"`: read as it passes, never held back.
        if let Some(scan) = ctx.scan.as_mut() {
            if usage::feed(scan, ctx.ticket.as_mut(), body.as_ref(), end_of_stream) {
                ctx.scan = None;
            }
        }
        Ok(None)
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let rules = self.rules.load_full();
        // First: every answer, the 400s of `find_out` included, carries the id.
        if rules.request_id.assigns() && on(Layer::RequestId) {
            crate::request::id::assign(session.req_header_mut());
        }
        ctx.rules = Some(rules.clone());
        let found = self.find_out(session, ctx, &rules).await;
        let outcome = outcome(&found);
        let route = ctx.route.map(|i| &rules.routes[i]);
        self.account(ctx, route, &outcome, found.store_error());
        let buckets = route.map(|route| ctx.buckets(route));
        respond::write_early(session, &outcome, route, &rules, buckets).await
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
        ctx.timing.upstream_start.get_or_insert_with(Instant::now);
        let server = pool.select(&ctx.failed_servers)?;
        ctx.upstream = Some(server);
        Ok(pool.peer(server))
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = respond::failure_status(e);
        ctx.upstream_failed(e);
        if code > 0 {
            // A failure before `request_filter` has no rules yet: the current ones name the
            // `Server`.
            let rules = ctx.rules.clone().unwrap_or_else(|| self.rules.load_full());
            let fields = ctx.route().map(|r| &r.spec.answers.response_headers);
            let server = rules.server_header.as_ref();
            let echo_id = rules.request_id.echoes();
            if let Err(write) = respond::write_failure(session, code, server, fields, echo_id).await
            {
                log::debug!("error response {code} not delivered: {write}");
            }
        }
        FailToProxy {
            error_code: code,
            // The request may be half read: the connection is not reused (Pingora's default).
            can_reuse_downstream: false,
        }
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
        let tried = ctx.failed_servers.len();
        let pool = (ctx.route().zip(ctx.rules.as_ref()))
            .map(|(route, rules)| &rules.upstreams[route.spec.upstream]);
        let retry = tried < pool.map_or(1, |p| p.size());
        if let Some(pool) = pool {
            // Counted, and one WARN line per upstream per interval instead of Pingora's
            // ERROR line per request (`suppress_error_log`).
            pool.connect_failed(peer, &e, retry);
            if let Some(server) = peer._address.as_inet() {
                // Its kind only: an error's context may quote what the upstream sent.
                pool.health.failed(*server, &e.etype().as_str());
            }
        }
        if retry {
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
        let upstream_name = (ctx.route().zip(ctx.rules.as_ref())).map_or("", |(route, rules)| {
            &rules.upstreams[route.spec.upstream].name
        });
        if on(Layer::RequestForm) {
            form::forward(&ctx.form, upstream_request, upstream_name)?;
        }
        if let Some(route) = ctx.route() {
            usage::ask_identity(route, upstream_request)?;
        }
        if !on(Layer::Forwarding) {
            return Ok(());
        }
        if let (Some(peer), Some(rules)) = (peer_ip(session), ctx.rules.as_ref()) {
            let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
            let scheme = if tls { Scheme::Https } else { Scheme::Http };
            let hop = Hop {
                peer,
                client: ctx.client.unwrap_or(peer),
                peer_trusted: rules.client_ip.is_trusted(peer),
                scheme,
            };
            if ctx.own_hop.is_none() {
                ctx.own_hop = OwnHop::new(peer, scheme).ok().map(Arc::new);
            }
            let set = rules.forwarded_headers;
            forwarding::apply(upstream_request, &hop, ctx.own_hop.as_deref(), set)?;
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream_response.status;
        crate::response::upgrade::check_switch(session.req_header(), upstream_response)?;
        crate::response::hop_by_hop::strip(upstream_response);
        // Taken before the route is borrowed; put back when this status is not the final one.
        let ticket = ctx.ticket.take();
        if status == http::StatusCode::SWITCHING_PROTOCOLS {
            ctx.tunnel = Tunnel::Open;
        }
        let Some(route) = ctx.route() else {
            return Ok(());
        };
        // Interim heads too: a hostile `103` must not carry forged fields either.
        if upstream_fields::owns_ratelimit_fields(route, ctx.decision) {
            upstream_fields::drop_ratelimit_fields(upstream_response);
        }
        let metrics = on(Layer::Metrics);
        if metrics {
            route.metrics.upstream_status(status.as_u16());
        }
        // The admission is given back once the response has gone out whole (`logging`): a client
        // that leaves before it keeps its admission counted.
        let mut held = ticket.and_then(|t| settle::answered(t, route, upstream_response));
        // A 1xx other than 101 (e.g. `100 Continue`) is followed by the real response head.
        let final_head = !upstream_fields::is_interim(status);
        let scan = final_head.then(|| usage::start(route, upstream_response, held.as_mut()));
        if final_head && ctx.timing.upstream_head.is_none() {
            let now = Instant::now();
            if let (Some(start), true) = (ctx.timing.upstream_start, metrics) {
                let took = now.saturating_duration_since(start);
                route.metrics.upstream_duration.observe(took.as_secs_f64());
            }
            ctx.timing.upstream_head = Some(now);
        }
        ctx.ticket = held;
        ctx.scan = scan.flatten();
        Ok(())
    }

    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let route = ctx.rules.as_ref().zip(ctx.route).map(|(r, i)| &r.routes[i]);
        if let (Some(route), Some(ticket)) = (route, ctx.ticket.as_mut()) {
            settle::trailers(ticket, route, trailers);
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // An interim head (`100 Continue`, `103 Early Hints`) is not the answer: the decision's
        // fields, the route's fields and the request id wait for the final one (taken here, the
        // final head would go without them). Only the upstream's `Server` is hidden as ever.
        if upstream_fields::is_interim(resp.status) {
            return match (&ctx.rules, on(Layer::AnswerHeaders)) {
                (Some(rules), true) => answer_fields::set(resp, rules.server_header.as_ref(), None),
                _ => Ok(()),
            };
        }
        if let (Some(r), Some(route), true) = (
            ctx.ratelimit.take(),
            ctx.route(),
            on(Layer::RateLimitFields),
        ) {
            insert_ratelimit_fields(resp, route, r)?;
            if let Some(legacy) = ctx.legacy.take() {
                insert_legacy_fields(resp, legacy)?;
            }
        }
        if let (Some(rules), true) = (&ctx.rules, on(Layer::AnswerHeaders)) {
            let fields = ctx.route().map(|r| &r.spec.answers.response_headers);
            answer_fields::set(resp, rules.server_header.as_ref(), fields)?;
        }
        close_delimit_for_http10(session, resp);
        match &ctx.rules {
            Some(rules) if rules.request_id.echoes() && on(Layer::RequestId) => {
                crate::request::id::echo(session.req_header(), resp)
            }
            _ => Ok(()),
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        self.end(session, e, ctx);
    }

    fn persist_connection_context(
        &self,
        _session: &Session,
        ctx: &RequestCtx,
    ) -> Option<Box<dyn Any + Send + Sync>> {
        // The connection's own forwarding values live as long as the connection (HTTP/1
        // keep-alive), so its next request does not format them again.
        let own = ctx.own_hop.clone()?;
        Some(Box::new(own))
    }

    fn on_connection_reuse(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
        prev: Box<dyn Any + Send + Sync>,
    ) {
        if let Ok(own) = prev.downcast::<Arc<OwnHop>>() {
            ctx.own_hop = Some(*own);
        }
    }

    fn suppress_error_log(&self, session: &Session, ctx: &RequestCtx, error: &Error) -> bool {
        let connect_logged = !ctx.failed_servers.is_empty();
        let upstream = (ctx.route().zip(ctx.rules.as_ref())).map_or("", |(route, rules)| {
            &rules.upstreams[route.spec.upstream].name
        });
        crate::logs::hygiene::suppress(session, connect_logged, upstream, error)
    }

    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        ctx: &RequestCtx,
        error: &Error,
        _context: ProxyWarnLogContext,
    ) -> bool {
        // A retry after a failed connect: `fail_to_connect` counted and logged it. An error
        // that may hold an upstream's head is logged only as `suppress_error_log` summarises it.
        (!ctx.failed_servers.is_empty() && crate::logs::hygiene::is_connect_failure(error))
            || crate::logs::hygiene::head::may_carry_head(error)
    }

    fn request_summary(&self, session: &Session, _ctx: &RequestCtx) -> String {
        crate::logs::hygiene::summary(session)
    }
}
