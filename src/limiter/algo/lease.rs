//! Concurrency limits ([`LimitKind::Lease`](super::LimitKind::Lease)): at most `requests`
//! requests in flight per bucket. Each admitted request holds one lease: an entry stamped with
//! its admission time, as the exact log's, which leaves when the request ends (the proxy gives
//! it back through [`Store::refund`](crate::limiter::Store::refund)) or, should the proxy that
//! holds it die, one `lease_ttl` (the limit's window) after it was stamped. A request still
//! running renews its lease ([`Store::renew`](crate::limiter::Store::renew)): its entry is
//! replaced by one stamped now (in Redis, `lua/renew/script.lua`). So the record and
//! its rules are the log's ([`Entries`]), and in Redis the same LIST and the same Lua: the
//! lease's ARGV value ([`SCRIPT_ARG`]) matches no other kind's `@when`, so it runs the log's
//! sections, the default branch (`lua/kinds/log/`).
//!
//! What differs is what a denial tells: a lease may be given back at any moment, so a full
//! lease limit promises no wait ([`RETRY_US`], `Retry-After: 1`), and the deny cache never
//! remembers a decision of a route with a lease limit (a release would not reach it).

use std::time::Duration;

use super::log::{ceil_secs, Entries};
use super::{
    state_of, Kind, KindOptions, Limit, LimitId, OptionError, QuotaUnit, RecordRules, Unit,
};
use crate::limiter::{LimitState, LimitView};

/// The third ARGV value of a lease limit in the sliding-window script: 1, of the values 1 to
/// 999 that no other kind's `@when` claims, so the log's (default) sections run it.
pub const SCRIPT_ARG: i64 = 1;

/// A concurrency limit: no parameter but its `lease_ttl` (the window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lease;

impl Kind for Lease {
    type Record = Leases;

    fn new_record(self) -> Leases {
        Leases::default()
    }

    /// `concurrent` and `lease_ttl`: the config's own keys.
    fn from_options(_: &KindOptions<'_>) -> Option<Result<(Self, Duration), OptionError>> {
        None
    }

    /// `<lease_ttl ms>c`: its own letter, never the key of a log of the same window.
    fn push_key_suffix(self, window_ms: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(itoa::Buffer::new().format(window_ms).as_bytes());
        out.push(b'c');
    }

    /// `concurrent` (a route has at most one per key).
    fn policy_suffix(self, _window_ms: u32) -> String {
        "concurrent".to_owned()
    }

    fn script_args(self, window_us: u64) -> [i64; 2] {
        [window_us as i64, SCRIPT_ARG]
    }

    /// At most [`RETRY_US`]: a lease may be given back at any moment.
    fn state_from_reply(self, reply: &[i64]) -> LimitState {
        state_of(reply, RETRY_US)
    }

    fn view_from_inspect(self, _: &Limit, head: [i64; 3], values: &[i64]) -> Option<LimitView> {
        let mut view = super::log::view_from_inspect(head, values);
        view.reset = view.reset.min(Duration::from_micros(RETRY_US));
        Some(view)
    }

    fn unit(self) -> Unit {
        Unit::Requests
    }

    fn quota_unit(self) -> QuotaUnit {
        QuotaUnit::ConcurrentRequests
    }

    /// The `lease_ttl`.
    fn policy_window_s(self, window: Duration) -> Option<u64> {
        Some(ceil_secs(window))
    }

    /// One no resolution has (a slot divides a window of at most a month).
    fn summary_tag(self) -> u32 {
        u32::MAX
    }

    /// A lease's deadline.
    fn frees_if_recorded(self, window_us: u64, now: u64) -> u64 {
        now + window_us
    }

    fn is_lease(self) -> bool {
        true
    }

    fn resolution_us(self) -> Option<u64> {
        None
    }

    /// Its entries say it all.
    fn about(self, _now_unix_us: u64) -> Option<String> {
        None
    }
}

/// The `reset` a full lease limit reports: one second, since any request in flight may end
/// at any moment (the draft's `Retry-After: 1`).
pub const RETRY_US: u64 = 1_000_000;

/// Leases held: the admission time of each (µs on the store's clock), oldest first.
#[derive(Debug, Default, Clone)]
pub struct Leases(Entries);

impl RecordRules for Leases {
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
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64) {
        self.0.seed(id, count, frees_us)
    }
    fn heap_bytes(&self) -> usize {
        self.0.heap_bytes()
    }
    fn growth(&self, id: LimitId) -> usize {
        self.0.growth(id)
    }
    /// None: a lease is a request in flight, which ends with the process (the next one starts
    /// with none held).
    fn persisted(&self, _id: LimitId) -> Vec<(u64, u32)> {
        Vec::new()
    }
    /// The leases held, each by its admission time.
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView {
        let mut view = self.0.view(limit, now, to_unix);
        view.reset = view.reset.min(Duration::from_micros(RETRY_US));
        view
    }
}

#[cfg(test)]
mod tests {
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
