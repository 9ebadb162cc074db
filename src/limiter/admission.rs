//! [`Admission`]: one admission as a store recorded it, which [`Store::refund`](super::Store::refund)
//! gives back and [`Store::renew`](super::Store::renew) renews.

use super::{Buckets, Limit};

/// One admission of `route` under `limits`, each limit in its bucket of `buckets`, recorded at
/// `recorded_at` ([`Verdict::recorded_times`](super::Verdict::recorded_times): one time for
/// all, or one per limit).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The route's name.
    pub route: &'a str,
    /// The bucket of each limit.
    pub buckets: &'a Buckets<'a>,
    /// The limits it was recorded in.
    pub limits: &'a [Limit],
    /// When: one time for all, or one per limit.
    pub recorded_at: &'a [u64],
}

impl<'a> Admission<'a> {
    /// The admission of `route` under `limits` in `buckets` at `recorded_at`.
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
        }
    }

    /// Its parts, in the order of [`Admission::new`]'s arguments.
    pub fn parts(self) -> (&'a str, &'a Buckets<'a>, &'a [Limit], &'a [u64]) {
        (self.route, self.buckets, self.limits, self.recorded_at)
    }
}
