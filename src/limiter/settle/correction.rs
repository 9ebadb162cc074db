//! The pure rules of the settle layer: what an upstream's answer does to an admission under
//! `count_status` ([`counts`]), what a request's real cost does to its charge ([`Settlement`]),
//! and the correction due when its response ends ([`correction`]), in which part of the route's
//! limits ([`Scope`], [`scope_of`]). [`Ticket`] is what an admission carries until then.

use http::StatusCode;

use crate::limiter::{DecidedBy, Limit, Unit};

/// An admission that may be given back or settled: when its entries were recorded, and by
/// which store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// [`Verdict::recorded_times`](crate::limiter::Verdict::recorded_times): one time for
    /// every limit, or one per limit.
    pub recorded_at: Box<[u64]>,
    /// The store that recorded it (the local log after a shared-store failure).
    pub by: DecidedBy,
    /// The upstream's status gave the admission back: given back when the response has gone
    /// out.
    pub due: bool,
    /// The request's cost: what its cost limits were charged.
    pub cost: u32,
    /// The real cost the upstream reported (`settle`): `None` until a field carried one.
    pub settled: Option<Reported>,
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

    /// This ticket, to be given back once the response is complete.
    pub fn due(self) -> Ticket {
        Ticket { due: true, ..self }
    }
}

/// What the upstream reported of a request's real cost (`settle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// A cost.
    Cost(u32),
    /// A field that is no cost (the charge then stands).
    Invalid,
    /// `settle = "json:…"`: the body, or one of its events, was over `settle_scan_bytes`,
    /// so it was not read (the charge stands).
    Oversized,
    /// `settle = "json:…"`: the body came compressed (`Content-Encoding`), so it was not read
    /// (the charge stands).
    Encoded,
}

impl Reported {
    /// The cost reported, if it is one.
    pub fn cost(self) -> Option<u32> {
        match self {
            Reported::Cost(cost) => Some(cost),
            Reported::Invalid | Reported::Oversized | Reported::Encoded => None,
        }
    }
}

/// What a settlement does to a request's charge in the route's cost limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The real cost is what was charged.
    Unchanged,
    /// Charged more than the real cost: give the difference back.
    GiveBack(u32),
    /// Charged less: charge the difference on top (the bucket may go into debt).
    Charge(u32),
}

impl Settlement {
    /// The correction of a charge of `charged` by a real cost of `real`.
    pub fn of(charged: u32, real: u32) -> Settlement {
        match real.cmp(&charged) {
            std::cmp::Ordering::Equal => Settlement::Unchanged,
            std::cmp::Ordering::Less => Settlement::GiveBack(charged - real),
            std::cmp::Ordering::Greater => Settlement::Charge(real - charged),
        }
    }
}

/// What an upstream answer does to an admission under `count_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counts {
    /// A final status not in `count_status`: the admission is given back.
    GiveBack,
    /// A final status in `count_status`: the admission counts.
    Keep,
    /// An interim `1xx` (e.g. `100 Continue`): the real status follows.
    Wait,
}

/// What an upstream answer of `status` does under `count_status`; `101` is final.
pub fn counts(count_status: &[StatusCode], status: StatusCode) -> Counts {
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        Counts::Wait
    } else if count_status.contains(&status) {
        Counts::Keep
    } else {
        Counts::GiveBack
    }
}

/// How a response ended, as its correction needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Sent whole.
    Whole,
    /// The client left (closed, reset its stream, stopped reading past the send timeout).
    ClientLeft,
    /// The upstream failed, or the proxy did.
    Failed,
}

/// What correcting an admission does at the end of its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correction {
    /// Nothing; the settlement's result to count, if the route settles.
    Nothing(Option<&'static str>),
    /// Give back this much in this part of the route's limits.
    GiveBack(Scope, u32),
    /// Charge this much more in the cost limits.
    Charge(u32),
}

/// The correction of `ticket` at the end of a response that `ended` so, on a route that
/// `settles` (with `max_cost`). Give-backs need the response sent whole (cut off, the charge
/// stands); a higher real cost is charged however it ended (the upstream reported it); a
/// client that left after the head without the cost having come (it was due in the trailer)
/// is charged up to `max_cost`.
pub fn correction(
    ticket: &Ticket,
    settles: bool,
    max_cost: Option<u32>,
    ended: Ended,
) -> Correction {
    let whole = ended == Ended::Whole;
    if ticket.due {
        return match whole {
            true => Correction::GiveBack(Scope::Counted, ticket.cost),
            false => Correction::Nothing(None),
        };
    }
    if !settles {
        return Correction::Nothing(None);
    }
    match ticket.settled {
        Some(Reported::Cost(real)) => match Settlement::of(ticket.cost, real) {
            Settlement::Unchanged => Correction::Nothing(Some("unchanged")),
            Settlement::GiveBack(d) if whole => Correction::GiveBack(Scope::Cost, d),
            Settlement::GiveBack(_) => Correction::Nothing(Some("cut_off")),
            Settlement::Charge(d) => Correction::Charge(d),
        },
        Some(Reported::Invalid) => Correction::Nothing(Some("invalid")),
        Some(Reported::Oversized) => Correction::Nothing(Some("oversized")),
        Some(Reported::Encoded) => Correction::Nothing(Some("encoded")),
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
pub enum Scope {
    /// The limits that count requests (`count_status`).
    Counted,
    /// The concurrency limits (the request ended).
    Leases,
    /// The cost limits (`settle`).
    Cost,
}

impl Scope {
    /// True when `limit` is one of this part.
    pub fn holds(self, limit: &Limit) -> bool {
        match self {
            Scope::Counted => !limit.is_lease(),
            Scope::Leases => limit.is_lease(),
            Scope::Cost => limit.unit() == Unit::Cost,
        }
    }
}

/// `part` of a route's `limits`, with their buckets' indexes (`of_limit`, empty: all the
/// route's) and record times (one for all, or one per limit); `None` when it has none.
pub fn scope_of(
    part: Scope,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_keeps_its_limits_buckets_and_times() {
        let w = std::time::Duration::from_secs(60);
        let limits = [Limit::log(5, w), Limit::lease(2, w), Limit::log(9, w / 2)];
        let (lease, counted) = (Scope::Leases, Scope::Counted);
        assert_eq!(
            scope_of(lease, &limits, &[], &[7]),
            Some((vec![limits[1]], vec![], vec![7]))
        );
        assert_eq!(
            scope_of(counted, &limits, &[0, 1, 2], &[4, 5, 6]),
            Some((vec![limits[0], limits[2]], vec![0, 2], vec![4, 6]))
        );
        assert_eq!(scope_of(lease, &limits[..1], &[], &[7]), None);
    }

    #[test]
    fn a_settlement_gives_back_or_charges_the_difference() {
        assert_eq!(Settlement::of(50, 50), Settlement::Unchanged);
        assert_eq!(Settlement::of(50, 10), Settlement::GiveBack(40));
        assert_eq!(Settlement::of(1, 5000), Settlement::Charge(4999));
    }

    #[test]
    fn a_final_status_not_listed_gives_the_admission_back() {
        let failures = [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN];
        let cases = [
            (200, Counts::GiveBack),
            (302, Counts::GiveBack),
            (401, Counts::Keep),
            (403, Counts::Keep),
            (500, Counts::GiveBack),
            (101, Counts::GiveBack),
            (100, Counts::Wait),
            (103, Counts::Wait),
        ];
        for (code, want) in cases {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(counts(&failures, status), want, "{code}");
        }
    }

    #[test]
    fn a_correction_gives_back_only_whole_and_charges_however_it_ended() {
        use Correction::{Charge, GiveBack, Nothing};
        use Ended::{ClientLeft, Failed, Whole};
        let ticket = |settled: Option<Reported>, answered| Ticket {
            settled,
            answered,
            ..Ticket::new(&[1], DecidedBy::Store, 100)
        };
        let (max, ok) = (Some(5000), |n| Some(Reported::Cost(n)));
        let cases = [
            // count_status: given back only once the response went out whole.
            (
                ticket(None, true).due(),
                false,
                Whole,
                GiveBack(Scope::Counted, 100),
            ),
            (ticket(None, true).due(), true, ClientLeft, Nothing(None)),
            (ticket(ok(5), true), false, Whole, Nothing(None)),
            // settle: lower is given back only whole; higher is charged however it ended.
            (ticket(ok(30), true), true, Whole, GiveBack(Scope::Cost, 70)),
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
                ticket(Some(Reported::Invalid), true),
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
