//! The request's end (the `logging` hook): its duration observed, its admission settled
//! (`count_status`, `settle`), its leases let go, and its access-log line written.

use pingora::prelude::*;
use pingora::proxy::Session;

use super::ctx::{RequestCtx, Tunnel};
use super::{usage, SlideGate};
use crate::access_log::Known;
use crate::limiter::settle::Ended;
use crate::metrics::NO_ROUTE_DURATION;
use crate::proxy::bench_switch::{on, Layer};

impl SlideGate {
    /// Everything a request leaves behind when it ends, however it ended (sent whole, client
    /// gone, upstream failed).
    pub(super) fn end(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        crate::edge::response_done(session);
        let duration = ctx.timing.start.elapsed();
        let histogram = match ctx.route() {
            Some(route) => &route.metrics.request_duration,
            None => &*NO_ROUTE_DURATION,
        };
        if on(Layer::Metrics) {
            histogram.observe(duration.as_secs_f64());
        }
        // Done: leave the in-flight gauge now rather than whenever the context is dropped.
        ctx.in_flight = None;
        // A body whose end came with its trailers: what its scan found is final.
        if let (Some(mut scan), None) = (ctx.scan.take(), e) {
            usage::finish(&mut scan, ctx.ticket.as_mut());
        }
        let settled_cost = (ctx.ticket.as_ref()).and_then(|t| t.settled?.cost());
        // `count_status` and `settle` correct the admission (how depends on how it ended).
        if let (Some(ticket), Some(route)) = (ctx.ticket.take(), ctx.route()) {
            let ended = match e {
                // A session its client closed while the upstream's side was open: the client
                // left (for `settle`'s `max_cost`), though the tunnel ended cleanly.
                None if ctx.tunnel == Tunnel::ClientLeft => Ended::ClientLeft,
                None => Ended::Whole,
                Some(e) if crate::logs::hygiene::is_client_abort(e) => Ended::ClientLeft,
                Some(_) => Ended::Failed,
            };
            let bucket = (ctx.key.as_str(), ctx.limit_keys.as_slice());
            (self.limiter).settle(route, bucket, ticket, ended);
        }
        // However the request ended (sent whole, client gone, upstream failed), its leases go.
        ctx.lease = None;
        let Some(log) = &self.access_log else {
            return;
        };
        let edge_408 = crate::edge::answered_408(session);
        let status = match session.response_written() {
            Some(resp) => resp.status.as_u16(),
            // The edge cut the body at client_body_timeout and answered itself.
            None if edge_408.is_some() => 408,
            // nginx's 499: the client closed the connection before a response was sent.
            None if e.is_some_and(crate::logs::hygiene::is_client_abort) => 499,
            None => 0,
        };
        let refused = ctx.refused.map(|why| why.to_string());
        let known = Known {
            client: ctx.client,
            host: ctx.form.host.as_deref(),
            route: ctx.route(),
            decision: ctx.decision,
            key: &ctx.key,
            refused_by: ctx.refused_by,
            cost: ctx.cost,
            settled_cost,
            upstream: ctx.upstream,
            upstream_time: ctx.timing.upstream(),
            duration,
            status,
            error: edge_408.or(refused.as_deref()),
            request_ids: ctx.rules.as_ref().is_some_and(|r| r.request_id.assigns()),
        };
        log.request(session, known);
    }
}
