//! Concurrency limits ([`LimitKind::Lease`](super::LimitKind::Lease)): at most `requests`
//! requests in flight per bucket. Each admitted request holds one lease: an entry stamped with
//! its admission time, as the exact log's, which leaves when the request ends (the proxy gives
//! it back through [`Store::refund`](crate::limiter::Store::refund)) or, should the proxy that
//! holds it die, one `lease_ttl` (the limit's window) after it was stamped. A request still
//! running renews its lease ([`Store::renew`](crate::limiter::Store::renew)): its entry is
//! replaced by one stamped now (in Redis, `lua/renew/script.lua`). So the record and
//! its rules are the log's ([`Entries`]), and in Redis the same LIST and the same Lua: the
//! lease's ARGV value ([`SCRIPT_ARG`]) matches no other kind's `@when`, so it runs the log's
//! sections, the default branch (`lua/kinds/log.lua`).
//!
//! What differs is what a denial tells: a lease may be given back at any moment, so a full
//! lease limit promises no wait ([`RETRY_US`], `Retry-After: 1`), and the deny cache never
//! remembers a decision of a route with a lease limit (a release would not reach it).

use super::log::Entries;
use super::{Limit, LimitId, Rules};
use crate::limiter::LimitView;

/// The third ARGV value of a lease limit in the sliding-window script: 1, of the values 1 to
/// 999 that no other kind's `@when` claims, so the log's (default) sections run it.
pub const SCRIPT_ARG: u64 = 1;

/// The `reset` a full lease limit reports: one second, since any request in flight may end
/// at any moment (the draft's `Retry-After: 1`).
pub const RETRY_US: u64 = 1_000_000;

/// Leases held: the admission time of each (µs on the store's clock), oldest first.
#[derive(Debug, Default, Clone)]
pub struct Leases(Entries);

impl Rules for Leases {
    fn evict(&mut self, id: LimitId, now: u64) {
        self.0.evict(id, now)
    }
    fn count(&self) -> u64 {
        self.0.count()
    }
    /// One lease, whatever the weight (a concurrency limit counts requests).
    fn push(&mut self, id: LimitId, now: u64, _weight: u32) {
        self.0.push(id, now, 1)
    }
    /// At most [`RETRY_US`]: a lease is usually given back long before its deadline.
    fn reset_us(&self, id: LimitId, requests: u32, now: u64) -> u64 {
        self.0.reset_us(id, requests, now).min(RETRY_US)
    }
    /// Give back the lease taken at `at`.
    fn refund(&mut self, id: LimitId, at: u64, _amount: u32) {
        self.0.refund(id, at, 1)
    }
    fn newest(&self, id: LimitId) -> Option<u64> {
        self.0.newest(id)
    }
    fn frees_us(&self, id: LimitId) -> u64 {
        self.0.frees_us(id)
    }
    fn frees_if_recorded(id: LimitId, now: u64) -> u64 {
        Entries::frees_if_recorded(id, now)
    }
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64) {
        self.0.seed(id, count, frees_us)
    }
    fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }
    fn growth(&self, id: LimitId) -> usize {
        self.0.growth(id)
    }
    /// The leases held, each by its admission time.
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView {
        let mut view = self.0.view(limit, now, to_unix);
        view.reset = view.reset.min(std::time::Duration::from_micros(RETRY_US));
        view
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limit() -> Limit {
        Limit::lease(2, Duration::from_secs(2))
    }

    /// Admit as the store does: evict, then record if below `requests`.
    fn admit(l: &mut Leases, now: u64) -> bool {
        let id = limit().id();
        l.evict(id, now);
        let ok = l.count() < u64::from(limit().requests);
        if ok {
            l.push(id, now, 1);
        }
        ok
    }

    #[test]
    fn n_leases_then_a_release_frees_one() {
        let mut l = Leases::default();
        assert!(admit(&mut l, 10) && admit(&mut l, 20));
        assert!(!admit(&mut l, 30));
        assert!(l.reset_us(limit().id(), 2, 30) <= RETRY_US);
        l.refund(limit().id(), 10, 1);
        assert!(admit(&mut l, 40));
        assert!(!admit(&mut l, 50));
    }

    #[test]
    fn a_lease_not_given_back_leaves_at_its_deadline() {
        let mut l = Leases::default();
        assert!(admit(&mut l, 1) && admit(&mut l, 2));
        assert!(!admit(&mut l, 2_000_000));
        assert!(admit(&mut l, 2_000_001));
    }

    #[test]
    fn a_lease_limit_has_its_own_id_key_and_policy_name() {
        let ttl = Duration::from_secs(2);
        assert_ne!(limit().id(), Limit::log(2, ttl).id());
        assert_eq!(limit().id().to_string(), "2000c");
        assert_eq!(limit().id().policy_suffix(), "concurrent");
        assert_eq!(limit().script_args(), [2, 2_000_000, SCRIPT_ARG, 1]);
    }
}
