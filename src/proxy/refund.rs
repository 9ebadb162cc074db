//! `count_status` and `settle`: an admission stays counted while the request is in flight.
//! It gives it back when the upstream answers with a status the route does not count (failed
//! logins count, successful ones do not), and its charge in the cost limits is corrected to
//! the real cost the upstream reports (`settle`). Anything given back waits for the response
//! to have gone out whole; a higher real cost is charged however the response ended, and a
//! client that leaves after the response head but before the trailer that would have carried
//! its cost is charged up to the route's `max_cost`, the most it could have been (else leaving
//! just before the trailer would make any cost free). The pure parts ([`settle`],
//! [`correction`], [`Settlement`]) decide; [`Limiter::refund`] sends the correction to the
//! store that recorded the admission, off the response path.

use http::StatusCode;

use super::limiter::Limiter;
use super::outcome::DecidedBy;
use crate::cost::{CostError, Settlement};
use crate::limiter::{Admission, Buckets, Change, Limit, Unit};
use crate::metrics::METRICS;
use crate::routes::Route;

/// An admission that may be given back: when its entries were recorded, and by which store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ticket {
    /// [`Verdict::recorded_times`](crate::limiter::Verdict::recorded_times): one time for
    /// every limit, or one per limit.
    pub recorded_at: Box<[u64]>,
    /// The store that recorded it (the local log after a shared-store failure).
    pub by: DecidedBy,
    /// The upstream's status gave the admission back: refunded when the response has gone out.
    pub due: bool,
    /// The request's cost: what its cost limits were charged.
    pub cost: u32,
    /// The real cost the upstream reported (`settle`): `None` until a field carried one.
    pub settled: Option<Result<u32, CostError>>,
    /// A final response head came from the upstream (its trailer may still carry the cost).
    pub answered: bool,
    /// A gRPC call's outcome (`grpc-status`) is still to come in its trailers, which decide
    /// `count_status` (until then the admission counts).
    pub grpc_pending: bool,
}

impl Ticket {
    /// An admission that counts until its upstream answers.
    pub fn new(recorded_at: &[u64], by: DecidedBy, cost: u32) -> Ticket {
        Ticket {
            recorded_at: recorded_at.into(),
            by,
            due: false,
            cost,
            settled: None,
            answered: false,
            grpc_pending: false,
        }
    }

    /// This ticket, to be refunded once the response is complete.
    pub fn due(self) -> Ticket {
        Ticket { due: true, ..self }
    }

    /// This ticket after the upstream's response head (`None`: nothing left to correct):
    /// `count_status` decides whether the admission counts, `settle` reads the real cost in a
    /// final head (a `101` is one). An interim `1xx` (e.g. `100 Continue`) is followed by the
    /// real head.
    ///
    /// A gRPC answer (`200`, `content-type: application/grpc`) says how the call went in
    /// `grpc-status`: in its head when it is trailers-only, else in its trailers; `count_status`
    /// reads the HTTP status that code stands for ([`crate::grpc::http_status`]).
    pub fn answered(self, route: &Route, head: &pingora::http::ResponseHeader) -> Option<Ticket> {
        let settles = route.spec.cost.settle.is_some();
        let count_status = route.spec.counting.count_status.as_deref();
        let grpc = count_status.is_some()
            && head.status == StatusCode::OK
            && crate::grpc::is_grpc(head.headers.get(http::header::CONTENT_TYPE));
        let status = match grpc.then(|| crate::grpc::status_of(&head.headers)) {
            Some(Some(code)) => crate::grpc::http_status(code),
            Some(None) => {
                let settled = settles.then(|| route.spec.cost.settled(&head.headers));
                return Some(Ticket {
                    grpc_pending: true,
                    answered: true,
                    settled: settled.flatten(),
                    ..self
                });
            }
            None => head.status,
        };
        let mut held = match count_status {
            None => self,
            Some(count_status) => match settle(count_status, status) {
                Settle::GiveBack => self.due(),
                Settle::Keep if settles => self,
                Settle::Keep => return None,
                Settle::Wait => return Some(self),
            },
        };
        // A `101` is final: an upgrade's only head, so its settle value is read here (a
        // tunnel has no trailer) and a client leaving the session is one that left early.
        if !super::upstream_fields::is_interim(head.status) {
            held.answered = true;
            if settles {
                held.settled = route.spec.cost.settled(&head.headers);
            }
        }
        Some(held)
    }

    /// `settle`: a real cost only known at the end of the body, in the response's trailers
    /// (an HTTP/2 upstream's, or an HTTP/1.1 upstream's chunked trailer section, which the
    /// vendored `pingora-core` keeps). A value in the head wins.
    pub fn trailers(&mut self, route: &Route, trailers: &http::HeaderMap) {
        if self.settled.is_none() {
            self.settled = route.spec.cost.settled(trailers);
        }
        let count_status = route.spec.counting.count_status.as_deref();
        if let (true, Some(count_status)) = (std::mem::take(&mut self.grpc_pending), count_status) {
            let code = crate::grpc::status_of(trailers);
            let status = code.map(crate::grpc::http_status);
            if status.is_some_and(|s| settle(count_status, s) == Settle::GiveBack) {
                self.due = true;
            }
        }
    }
}

/// What an upstream answer does to an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// A final status not in `count_status`: the admission is given back.
    GiveBack,
    /// A final status in `count_status`: the admission counts.
    Keep,
    /// An interim `1xx` (e.g. `100 Continue`): the real status follows.
    Wait,
}

/// What an upstream answer of `status` does under `count_status`; `101` is final.
pub(super) fn settle(count_status: &[StatusCode], status: StatusCode) -> Settle {
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        Settle::Wait
    } else if count_status.contains(&status) {
        Settle::Keep
    } else {
        Settle::GiveBack
    }
}

/// How a response ended, as its correction needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Sent whole.
    Whole,
    /// The client left (closed, reset its stream, stopped reading past the send timeout).
    ClientLeft,
    /// The upstream failed, or the proxy did.
    Failed,
}

/// What correcting an admission does at the end of its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Correction {
    /// Nothing; the settlement's result to count, if the route settles.
    Nothing(Option<&'static str>),
    /// Give back this much in this part of the route's limits.
    GiveBack(Part, u32),
    /// Charge this much more in the cost limits.
    Charge(u32),
}

/// The correction of `ticket` at the end of a response that `ended` so, on a route that
/// `settles` (with `max_cost`). Give-backs need the response sent whole (cut off, the charge
/// stands); a higher real cost is charged however it ended (the upstream reported it); a
/// client that left after the head without the cost having come (it was due in the trailer)
/// is charged up to `max_cost`.
pub(super) fn correction(
    ticket: &Ticket,
    settles: bool,
    max_cost: Option<u32>,
    ended: Ended,
) -> Correction {
    let whole = ended == Ended::Whole;
    if ticket.due {
        return match whole {
            true => Correction::GiveBack(Part::Counted, ticket.cost),
            false => Correction::Nothing(None),
        };
    }
    if !settles {
        return Correction::Nothing(None);
    }
    match ticket.settled {
        Some(Ok(real)) => match Settlement::of(ticket.cost, real) {
            Settlement::Unchanged => Correction::Nothing(Some("unchanged")),
            Settlement::GiveBack(d) if whole => Correction::GiveBack(Part::Cost, d),
            Settlement::GiveBack(_) => Correction::Nothing(Some("cut_off")),
            Settlement::Charge(d) => Correction::Charge(d),
        },
        Some(Err(_)) => Correction::Nothing(Some("invalid")),
        None if whole => Correction::Nothing(Some("missing")),
        None => match max_cost {
            Some(max) if ended == Ended::ClientLeft && ticket.answered && max > ticket.cost => {
                Correction::Charge(max - ticket.cost)
            }
            _ => Correction::Nothing(Some("cut_off")),
        },
    }
}

/// Which limits of a route a refund gives back: each entry is given back once, so a
/// `count_status` refund leaves the leases to the release at the request's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// The limits that count requests (`count_status`).
    Counted,
    /// The concurrency limits (the request ended).
    Leases,
    /// The cost limits (`settle`).
    Cost,
}

impl Part {
    fn holds(self, limit: &Limit) -> bool {
        match self {
            Part::Counted => !limit.is_lease(),
            Part::Leases => limit.is_lease(),
            Part::Cost => limit.unit() == Unit::Cost,
        }
    }
}

/// `part` of a route's `limits`, with their buckets' indexes (`of_limit`, empty: all the
/// route's) and record times (one for all, or one per limit); `None` when it has none.
pub(super) fn part_of(
    part: Part,
    limits: &[Limit],
    of_limit: &[u8],
    at: &[u64],
) -> Option<(Vec<Limit>, Vec<u8>, Vec<u64>)> {
    let picked = || (0..limits.len()).filter(|&i| part.holds(&limits[i]));
    picked().next()?;
    let limits = picked().map(|i| limits[i]).collect();
    let of_limit = match of_limit.is_empty() {
        true => Vec::new(),
        false => picked().map(|i| of_limit[i]).collect(),
    };
    let at = match at.len() {
        1 => at.to_vec(),
        _ => picked().filter_map(|i| at.get(i).copied()).collect(),
    };
    Some((limits, of_limit, at))
}

impl Limiter {
    /// Correct `ticket`'s admission at the end of its response (see [`correction`]): give it
    /// back in the limits that count requests when its status is not counted (the leases are
    /// the request's [`Lease`](super::lease::Lease)'s to give back), else correct its cost
    /// limits to the real cost the upstream reported (`settle`). Each limit in its own bucket
    /// (`bucket` the route's, `own` the limits' own keys' as the request computed them).
    pub(super) fn refund(
        &self,
        route: &Route,
        (bucket, own): (&str, &[String]),
        ticket: Ticket,
        ended: Ended,
    ) {
        let cost = &route.spec.cost;
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
                Correction::Charge(weight) => (Part::Cost, weight, Change::Charge),
            };
        self.amend(route, (bucket, own), ticket, (part, weight), change);
    }

    /// Apply `change` of `weight` to `ticket`'s admission in `part` of the route's limits, in
    /// a task of its own: the response does not wait for the store, and until the store has
    /// applied it the admission counts as charged (the bound errs on the safe side for a give
    /// back; a charge lands a moment late). A failure leaves the charge as it was, and is
    /// counted.
    fn amend(
        &self,
        route: &Route,
        (bucket, own): (&str, &[String]),
        ticket: Ticket,
        (part, weight): (Part, u32),
        change: Change,
    ) {
        let Some(store) = self.fallback().store_of(ticket.by).cloned() else {
            return;
        };
        // The weight in the cost limits (a route with none: the limits as they are).
        let weighted = super::limiter::weighted(route, weight);
        let all = weighted.as_deref().unwrap_or(&route.spec.limits);
        let of_limit = &route.spec.limit_keys.of_limit;
        let Some((limits, of_limit, at)) = part_of(part, all, of_limit, &ticket.recorded_at) else {
            return;
        };
        let (name, bucket, own) = (route.spec.name.clone(), bucket.to_owned(), own.to_vec());
        let settles = route.spec.cost.settle.is_some();
        let policies = if settles {
            cost_policies(route)
        } else {
            Vec::new()
        };
        let charged = ticket.cost;
        tokio::spawn(async move {
            let buckets = Buckets::stacked(&bucket, &own, &of_limit);
            let admission = Admission::new(&name, &buckets, &limits, &at).with_change(change);
            let result = store.refund(admission).await;
            if let Err(e) = &result {
                log::debug!("route {name}: correcting an admission failed, it stands: {e}");
            }
            let (counter, outcome) = match (part, change, result.is_ok()) {
                (Part::Cost, _, false) => (&METRICS.settlements, "error"),
                (Part::Cost, Change::GiveBack, true) => (&METRICS.settlements, "given_back"),
                (Part::Cost, Change::Charge, true) => (&METRICS.settlements, "charged"),
                (_, _, true) => (&METRICS.refunds, "ok"),
                (_, _, false) => (&METRICS.refunds, "error"),
            };
            counter.with_label_values(&[name.as_str(), outcome]).inc();
            if settles {
                // What the cost limits hold of this request once settled, in units.
                let units = match (part, change, result.is_ok()) {
                    (Part::Cost, Change::GiveBack, true) => charged.saturating_sub(weight),
                    (Part::Cost, Change::Charge, true) => charged.saturating_add(weight),
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
    let cost = limits.filter(|(l, _)| l.unit() == crate::limiter::Unit::Cost);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_keeps_its_limits_buckets_and_times() {
        let w = std::time::Duration::from_secs(60);
        let limits = [Limit::log(5, w), Limit::lease(2, w), Limit::log(9, w / 2)];
        let (lease, counted) = (Part::Leases, Part::Counted);
        assert_eq!(
            part_of(lease, &limits, &[], &[7]),
            Some((vec![limits[1]], vec![], vec![7]))
        );
        assert_eq!(
            part_of(counted, &limits, &[0, 1, 2], &[4, 5, 6]),
            Some((vec![limits[0], limits[2]], vec![0, 2], vec![4, 6]))
        );
        assert_eq!(part_of(lease, &limits[..1], &[], &[7]), None);
    }

    #[test]
    fn a_final_status_not_listed_gives_the_admission_back() {
        let failures = [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN];
        let cases = [
            (200, Settle::GiveBack),
            (302, Settle::GiveBack),
            (401, Settle::Keep),
            (403, Settle::Keep),
            (500, Settle::GiveBack),
            (101, Settle::GiveBack),
            (100, Settle::Wait),
            (103, Settle::Wait),
        ];
        for (code, want) in cases {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(settle(&failures, status), want, "{code}");
        }
    }

    #[test]
    fn a_correction_gives_back_only_whole_and_charges_however_it_ended() {
        use Correction::{Charge, GiveBack, Nothing};
        use Ended::{ClientLeft, Failed, Whole};
        let ticket = |settled: Option<Result<u32, CostError>>, answered| Ticket {
            settled,
            answered,
            ..Ticket::new(&[1], DecidedBy::Store, 100)
        };
        let (max, ok) = (Some(5000), |n| Some(Ok(n)));
        let cases = [
            // count_status: given back only once the response went out whole.
            (
                ticket(None, true).due(),
                false,
                Whole,
                GiveBack(Part::Counted, 100),
            ),
            (ticket(None, true).due(), true, ClientLeft, Nothing(None)),
            (ticket(ok(5), true), false, Whole, Nothing(None)),
            // settle: lower is given back only whole; higher is charged however it ended.
            (ticket(ok(30), true), true, Whole, GiveBack(Part::Cost, 70)),
            (
                ticket(ok(30), true),
                true,
                ClientLeft,
                Nothing(Some("cut_off")),
            ),
            (
                ticket(ok(100), true),
                true,
                Failed,
                Nothing(Some("unchanged")),
            ),
            (ticket(ok(1500), true), true, Whole, Charge(1400)),
            (ticket(ok(1500), true), true, ClientLeft, Charge(1400)),
            (ticket(ok(1500), false), true, Failed, Charge(1400)),
            (
                ticket(Some(Err(CostError::Malformed)), true),
                true,
                Whole,
                Nothing(Some("invalid")),
            ),
            (ticket(None, true), true, Whole, Nothing(Some("missing"))),
            // Gone after the head, before the trailer with the cost: up to max_cost.
            (ticket(None, true), true, ClientLeft, Charge(4900)),
            // Gone before any head, or the upstream failed: the estimate stands.
            (
                ticket(None, false),
                true,
                ClientLeft,
                Nothing(Some("cut_off")),
            ),
            (ticket(None, true), true, Failed, Nothing(Some("cut_off"))),
        ];
        for (i, (t, settles, ended, want)) in cases.into_iter().enumerate() {
            assert_eq!(correction(&t, settles, max, ended), want, "case {i}");
        }
        // No max_cost, or one the estimate already reaches: the estimate stands.
        let gone = ticket(None, true);
        assert_eq!(
            correction(&gone, true, None, ClientLeft),
            Nothing(Some("cut_off"))
        );
        assert_eq!(
            correction(&gone, true, Some(100), ClientLeft),
            Nothing(Some("cut_off"))
        );
    }
}
