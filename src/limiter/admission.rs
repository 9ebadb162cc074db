//! [`Admission`]: one admission as a store recorded it, which [`Store::refund`](super::Store::refund)
//! gives back (or charges more, [`Change::Charge`]) and [`Store::renew`](super::Store::renew)
//! renews.

use super::{Buckets, Limit};

/// What [`Store::refund`](super::Store::refund) does to an admission's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Change {
    /// Take each limit's weight back (`count_status`, a lease's release, a cost settled lower
    /// than charged).
    #[default]
    GiveBack,
    /// Add each limit's weight on top, in the slot of the store's now, with no room check: a
    /// cost settled higher than charged. Only cost limits (slotted) take a charge; the bucket may
    /// go over its quota (debt), which later requests wait out.
    Charge,
}

/// One admission of `route` under `limits`, each limit in its bucket of `buckets`, recorded at
/// `recorded_at` ([`Verdict::recorded_times`](super::Verdict::recorded_times): one time for
/// all, or one per limit).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The route's name.
    pub route: &'a str,
    /// The bucket of each limit.
    pub buckets: &'a Buckets<'a>,
    /// The limits it was recorded in, each with the weight to give back or charge.
    pub limits: &'a [Limit],
    /// When: one time for all, or one per limit.
    pub recorded_at: &'a [u64],
    /// Give back (the default) or charge.
    pub change: Change,
}

impl<'a> Admission<'a> {
    /// The admission of `route` under `limits` in `buckets` at `recorded_at`, to be given back.
    pub fn new(
        route: &'a str,
        buckets: &'a Buckets<'a>,
        limits: &'a [Limit],
        recorded_at: &'a [u64],
    ) -> Admission<'a> {
        Admission {
            route,
            buckets,
            limits,
            recorded_at,
            change: Change::GiveBack,
        }
    }

    /// The same admission with `change` to apply.
    pub fn with_change(self, change: Change) -> Admission<'a> {
        Admission { change, ..self }
    }

    /// Its parts, in the order of [`Admission::new`]'s arguments.
    pub fn parts(self) -> (&'a str, &'a Buckets<'a>, &'a [Limit], &'a [u64]) {
        (self.route, self.buckets, self.limits, self.recorded_at)
    }
}
