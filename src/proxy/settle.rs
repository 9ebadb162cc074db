//! The proxy side of the settle layer ([`crate::limiter::settle`]): what an upstream's head and
//! trailers say of an admission's [`Ticket`] (`count_status`, a gRPC call's outcome, the real
//! cost of `settle`), and at the end of the response its correction sent to the store that
//! recorded it, counted in the route's metrics. Anything given back waits for the response to
//! have gone out whole; a higher real cost is charged however the response ended, and a client
//! that leaves after the response head but before the trailer that would have carried its cost
//! is charged up to the route's `max_cost`, the most it could have been (else leaving just
//! before the trailer would make any cost free).

use http::StatusCode;

use super::limiter::Limiter;
use crate::limiter::settle::{
    self, correction, counts, scope_of, Correction, Counts, Ended, Recorded, Reported, Scope,
    Ticket,
};
use crate::limiter::{Change, Unit};
use crate::metrics::METRICS;
use crate::request::cost::CostError;
use crate::routes::Route;

/// `ticket` after the upstream's response head (`None`: nothing left to correct):
/// `count_status` decides whether the admission counts, `settle` reads the real cost in a
/// final head (a `101` is one). An interim `1xx` (e.g. `100 Continue`) is followed by the real
/// head.
///
/// A gRPC answer (`200`, `content-type: application/grpc`) says how the call went in
/// `grpc-status`: in its head when it is trailers-only, else in its trailers; `count_status`
/// reads the HTTP status that code stands for ([`crate::response::grpc::http_status`]).
pub(super) fn answered(
    ticket: Ticket,
    route: &Route,
    head: &pingora::http::ResponseHeader,
) -> Option<Ticket> {
    let settles = route.spec.cost.settle.is_some();
    let count_status = route.spec.counting.count_status.as_deref();
    let grpc = count_status.is_some()
        && head.status == StatusCode::OK
        && crate::response::grpc::is_grpc(head.headers.get(http::header::CONTENT_TYPE));
    let status = match grpc.then(|| crate::response::grpc::status_of(&head.headers)) {
        Some(Some(code)) => crate::response::grpc::http_status(code),
        Some(None) => {
            let settled = settles.then(|| reported(route, &head.headers));
            return Some(Ticket {
                grpc_pending: true,
                answered: true,
                settled: settled.flatten(),
                ..ticket
            });
        }
        None => head.status,
    };
    let mut held = match count_status {
        None => ticket,
        Some(count_status) => match counts(count_status, status) {
            Counts::GiveBack => ticket.due(),
            Counts::Keep if settles => ticket,
            Counts::Keep => return None,
            Counts::Wait => return Some(ticket),
        },
    };
    // A `101` is final: an upgrade's only head, so its settle value is read here (a tunnel has
    // no trailer) and a client leaving the session is one that left early.
    if !super::upstream_fields::is_interim(head.status) {
        held.answered = true;
        if settles {
            held.settled = reported(route, &head.headers);
        }
    }
    Some(held)
}

/// `settle`: a real cost only known at the end of the body, in the response's trailers (an
/// HTTP/2 upstream's, or an HTTP/1.1 upstream's chunked trailer section, which the vendored
/// `pingora-core` keeps). A value in the head wins.
pub(super) fn trailers(ticket: &mut Ticket, route: &Route, trailers: &http::HeaderMap) {
    if ticket.settled.is_none() {
        ticket.settled = reported(route, trailers);
    }
    let count_status = route.spec.counting.count_status.as_deref();
    if let (true, Some(count_status)) = (std::mem::take(&mut ticket.grpc_pending), count_status) {
        let code = crate::response::grpc::status_of(trailers);
        let status = code.map(crate::response::grpc::http_status);
        if status.is_some_and(|s| counts(count_status, s) == Counts::GiveBack) {
            ticket.due = true;
        }
    }
}

/// The real cost the route's `settle` field carries in `fields`, if it carries one.
fn reported(route: &Route, fields: &http::HeaderMap) -> Option<Reported> {
    let settled: Result<u32, CostError> = route.spec.cost.settled(fields)?;
    Some(settled.map_or(Reported::Invalid, Reported::Cost))
}

impl Limiter {
    /// Correct `ticket`'s admission at the end of its response (see [`correction()`]): give it
    /// back in the limits that count requests when its status is not counted (the leases are
    /// the request's [`Lease`](crate::limiter::lease::Lease)'s to give back), else correct its
    /// cost limits to the real cost the upstream reported (`settle`). Each limit in its own
    /// bucket (`bucket` the route's, `own` the limits' own keys' as the request computed them).
    pub(super) fn settle(
        &self,
        route: &Route,
        (bucket, own): (&str, &[String]),
        mut ticket: Ticket,
        ended: Ended,
    ) {
        let cost = &route.spec.cost;
        // `reserve = "max_cost"`: no report takes the charge past the reservation.
        if let Some(Reported::Cost(real)) = ticket.settled {
            ticket.settled = Some(Reported::Cost(cost.capped(real)));
        }
        let (part, weight, change) =
            match correction(&ticket, cost.settle.is_some(), cost.max, ended) {
                Correction::Nothing(result) => {
                    if let Some(result) = result {
                        let name = route.spec.name.as_str();
                        METRICS.settlements.with_label_values(&[name, result]).inc();
                        // The charge stands as it was.
                        count_settled(&route.spec.name, &cost_policies(route), ticket.cost);
                    }
                    return;
                }
                Correction::GiveBack(part, weight) => (part, weight, Change::GiveBack),
                Correction::Charge(weight) => (Scope::Cost, weight, Change::Charge),
            };
        let Some(store) = self.fallback().store_of(ticket.by).cloned() else {
            return;
        };
        // The weight in the cost limits (a route with none: the limits as they are).
        let weighted = super::limiter::weighted(route, weight);
        let all = weighted.as_deref().unwrap_or(&route.spec.limits);
        let of_limit = &route.spec.limit_keys.of_limit;
        let Some(part_limits) = scope_of(part, all, of_limit, &ticket.recorded_at) else {
            return;
        };
        let recorded = Recorded::new(&route.spec.name, (bucket, own), part_limits);
        let name = route.spec.name.clone();
        let settles = route.spec.cost.settle.is_some();
        let policies = if settles {
            cost_policies(route)
        } else {
            Vec::new()
        };
        let charged = ticket.cost;
        settle::amend(store, recorded, change, move |result| {
            let (counter, outcome) = match (part, change, result.is_ok()) {
                (Scope::Cost, _, false) => (&METRICS.settlements, "error"),
                (Scope::Cost, Change::GiveBack, true) => (&METRICS.settlements, "given_back"),
                (Scope::Cost, Change::Charge, true) => (&METRICS.settlements, "charged"),
                (_, _, true) => (&METRICS.refunds, "ok"),
                (_, _, false) => (&METRICS.refunds, "error"),
            };
            counter.with_label_values(&[name.as_str(), outcome]).inc();
            if settles {
                // What the cost limits hold of this request once settled, in units.
                let units = match (part, change, result.is_ok()) {
                    (Scope::Cost, Change::GiveBack, true) => charged.saturating_sub(weight),
                    (Scope::Cost, Change::Charge, true) => charged.saturating_add(weight),
                    _ => charged,
                };
                count_settled(&name, &policies, units);
            }
        });
    }
}

/// The policy names of `route`'s cost limits.
fn cost_policies(route: &Route) -> Vec<String> {
    let limits = route.spec.limits.iter().zip(&route.policy_names);
    let cost = limits.filter(|(l, _)| l.unit() == Unit::Cost);
    cost.map(|(_, name)| name.clone()).collect()
}

/// `slidegate_cost_settled_total{route,limit}`: a settled request's units in each cost limit.
fn count_settled(route: &str, policies: &[String], units: u32) {
    for policy in policies {
        let counter = METRICS
            .cost_settled
            .with_label_values(&[route, policy.as_str()]);
        counter.inc_by(u64::from(units));
    }
}
