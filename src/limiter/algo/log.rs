//! The exact sliding-window log ([`Log`], [`LimitKind::Log`](super::LimitKind::Log)): one
//! timestamp per admitted request. Its record ([`Entries`]) and pure rules, which the memory
//! store runs; the
//! Redis script runs the same rules on a Redis LIST (`lua/kinds/log/`, DATA in its
//! header).
//!
//! An entry recorded at `t` counts while `t > now - window`: it leaves at exactly
//! `t + window`. Entries are pushed with a clock that never goes back, so they are sorted
//! oldest first and the expired ones are always a prefix.

use std::collections::VecDeque;
use std::time::Duration;

use super::{
    policy_text, state_of, Kind, KindOptions, Limit, LimitId, OptionError, QuotaUnit, RecordRules,
    Unit,
};
use crate::limiter::{LimitState, LimitView};

/// The third ARGV value of a log limit in the sliding-window script (`resolution`: 0 names
/// the log).
pub const SCRIPT_ARG: i64 = 0;

/// The exact log: no parameter but its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Log;

impl Kind for Log {
    type Record = Entries;

    fn new_record(self) -> Entries {
        Entries::default()
    }

    /// `requests` and `window`: the config's own keys.
    fn from_options(_: &KindOptions<'_>) -> Option<Result<(Self, Duration), OptionError>> {
        None
    }

    /// `<window ms>`.
    fn push_key_suffix(self, window_ms: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(itoa::Buffer::new().format(window_ms).as_bytes());
    }

    /// `60s`, `1500ms`.
    fn policy_suffix(self, window_ms: u32) -> String {
        policy_text(window_ms)
    }

    fn script_args(self, window_us: u64) -> [i64; 2] {
        [window_us as i64, SCRIPT_ARG]
    }

    fn state_from_reply(self, reply: &[i64]) -> LimitState {
        state_of(reply, u64::MAX)
    }

    fn view_from_inspect(self, _: &Limit, head: [i64; 3], values: &[i64]) -> Option<LimitView> {
        Some(view_from_inspect(head, values))
    }

    fn unit(self) -> Unit {
        Unit::Requests
    }

    fn quota_unit(self) -> QuotaUnit {
        QuotaUnit::Requests
    }

    /// Whole seconds, a sub-second window rounded up to 1.
    fn policy_window_s(self, window: Duration) -> Option<u64> {
        Some(ceil_secs(window))
    }

    fn summary_tag(self) -> u32 {
        0
    }

    fn frees_if_recorded(self, window_us: u64, now: u64) -> u64 {
        now + window_us
    }

    fn is_lease(self) -> bool {
        false
    }

    fn resolution_us(self) -> Option<u64> {
        None
    }

    /// Its entries say it all.
    fn about(self, _now_unix_us: u64) -> Option<String> {
        None
    }
}

/// Whole seconds rounded up, at least 1: a window as the `w` of `RateLimit-Policy`.
pub fn ceil_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

/// Admitted timestamps (µs on the store's clock), oldest first.
#[derive(Debug, Default, Clone)]
pub struct Entries(VecDeque<u64>);

/// The inspector script's view of a log: `[count, remaining, reset]`, then the newest
/// in-window entries (µs since the Unix epoch), oldest first.
pub fn view_from_inspect(head: [i64; 3], entries: &[i64]) -> LimitView {
    let [count, remaining, reset] = head;
    LimitView {
        count: count.max(0) as u64,
        remaining: remaining.clamp(0, i64::from(u32::MAX)) as u32,
        reset: Duration::from_micros(reset.max(0) as u64),
        entries_us: entries.iter().map(|&t| t.max(0) as u64).collect(),
        slots: Vec::new(),
    }
}

impl Entries {
    /// The recorded timestamps still in the window at `now`, oldest first (for the inspector).
    pub fn in_window(&self, id: LimitId, now: u64) -> impl Iterator<Item = u64> + '_ {
        let cutoff = now.saturating_sub(id.window_us());
        self.0.iter().copied().filter(move |&t| t > cutoff)
    }
}

impl RecordRules for Entries {
    fn evict(&mut self, id: LimitId, now: u64) {
        let cutoff = now.saturating_sub(id.window_us());
        while self.0.front().is_some_and(|&t| t <= cutoff) {
            self.0.pop_front();
        }
    }

    fn count(&self) -> u64 {
        self.0.len() as u64
    }

    /// A log's weight is always 1 (cost limits are slotted).
    fn push(&mut self, _id: LimitId, now: u64, _weight: u32) {
        if self.0.capacity() == 0 {
            // Most clients never have more than one entry: start exact.
            self.0.reserve_exact(1);
        }
        self.0.push_back(now);
    }

    /// A full log admits again when entry[len - requests] leaves: the oldest, unless a reload
    /// lowered `requests` below what the log already holds; a non-full one frees room when its
    /// oldest entry leaves; an empty one reports the window. `now` is never older than an
    /// entry (the store clamps it to the newest); saturate anyway.
    fn reset_us(&self, id: LimitId, requests: u32, now: u64) -> u64 {
        let pivot = self.0.len().saturating_sub(requests as usize);
        match self.0.get(pivot) {
            Some(&t) => (t + id.window_us()).saturating_sub(now),
            None => id.window_us(),
        }
    }

    /// The newest entry recorded at `at`, searched from the newest end (where a refund's
    /// entry is).
    fn refund(&mut self, _id: LimitId, at: u64, _amount: u32) {
        if let Some(i) = self.0.iter().rposition(|&t| t == at) {
            self.0.remove(i);
        }
    }

    fn newest(&self, _id: LimitId) -> Option<u64> {
        self.0.back().copied()
    }

    fn frees_us(&self, id: LimitId) -> u64 {
        self.0.back().map_or(0, |&t| t + id.window_us())
    }

    /// `count` entries one window before `frees_us`.
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64) {
        let at = frees_us.saturating_sub(id.window_us());
        self.0.reserve_exact(count as usize);
        self.0.extend(std::iter::repeat_n(at, count as usize));
    }

    fn heap_bytes(&self) -> usize {
        match self.0.capacity() {
            0 => 0,
            cap => (cap * 8).next_multiple_of(16),
        }
    }

    /// A full log doubles its capacity (a new one starts at one entry).
    fn growth(&self, _id: LimitId) -> usize {
        if self.0.len() == self.0.capacity() {
            (self.0.capacity().max(1) * 8).next_multiple_of(16)
        } else {
            0
        }
    }

    /// Each entry, one request at its time.
    fn persisted(&self, _id: LimitId) -> Vec<(u64, u32)> {
        self.0.iter().map(|&t| (t, 1)).collect()
    }

    /// The in-window entries, oldest first (the view keeps the newest
    /// [`MAX_VIEW_ENTRIES`](crate::limiter::MAX_VIEW_ENTRIES)).
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView {
        let live: Vec<u64> = self.in_window(limit.id(), now).map(to_unix).collect();
        LimitView::from_entries(limit, &live, to_unix(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::clock::{Clock, FakeClock};
    use crate::limiter::Limit;

    fn id() -> LimitId {
        Limit::log(3, Duration::from_secs(1)).id()
    }

    /// Admit as the store does: evict, then record if below `requests`.
    fn admit(e: &mut Entries, requests: u32, now: u64) -> bool {
        e.evict(id(), now);
        let ok = e.count() < u64::from(requests);
        if ok {
            e.push(id(), now, 1);
        }
        ok
    }

    #[test]
    fn an_entry_leaves_exactly_one_window_after_it_was_recorded() {
        let clock = FakeClock::default();
        let mut e = Entries::default();
        for _ in 0..3 {
            assert!(admit(&mut e, 3, clock.now_us()));
            clock.advance(Duration::from_millis(100));
        }
        // Full at 0.3 s: the entry of 0 s leaves at 1 s.
        assert!(!admit(&mut e, 3, clock.now_us()));
        assert_eq!(e.reset_us(id(), 3, clock.now_us()), 700_000);
        clock.advance(Duration::from_micros(699_999));
        assert!(!admit(&mut e, 3, clock.now_us()));
        clock.advance(Duration::from_micros(1));
        assert!(admit(&mut e, 3, clock.now_us()));
    }

    #[test]
    fn reset_is_the_window_when_empty_and_names_the_pivot_when_requests_were_lowered() {
        let clock = FakeClock::default();
        let mut e = Entries::default();
        assert_eq!(e.reset_us(id(), 3, clock.now_us()), 1_000_000);
        for _ in 0..3 {
            admit(&mut e, 3, clock.now_us());
            clock.advance(Duration::from_millis(100));
        }
        // Not full (limit 5): the oldest leaves at 1 s; lowered to 2: entry[1] (0.1 s).
        assert_eq!(e.reset_us(id(), 5, clock.now_us()), 700_000);
        assert_eq!(e.reset_us(id(), 2, clock.now_us()), 800_000);
    }

    #[test]
    fn a_refund_removes_its_own_entry_and_seeding_holds_until_the_figure_frees() {
        let mut e = Entries::default();
        for t in [10, 20, 20, 30] {
            e.push(id(), t, 1);
        }
        e.refund(id(), 20, 1);
        assert_eq!((e.count(), e.newest(id())), (3, Some(30)));
        e.refund(id(), 25, 1);
        assert_eq!(e.count(), 3);
        let mut s = Entries::default();
        s.seed(id(), 2, 1_500_000);
        assert_eq!(
            s.in_window(id(), 1_000_000).collect::<Vec<_>>(),
            [500_000; 2]
        );
        assert_eq!(s.frees_us(id()), 1_500_000);
        s.evict(id(), 1_500_000);
        assert_eq!(s.count(), 0);
    }

    #[test]
    fn bytes_start_at_one_entry_and_double() {
        let mut e = Entries::default();
        assert_eq!((e.heap_bytes(), e.growth(id())), (0, 16));
        e.push(id(), 1, 1);
        assert_eq!((e.heap_bytes(), e.growth(id())), (16, 16));
        e.push(id(), 2, 1);
        assert!(e.heap_bytes() >= 16);
    }
}
