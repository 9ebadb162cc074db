//! The memory store's record of one limit ([`Record`]) and the rules every kind's record
//! follows ([`Rules`]): the registry's one `match` over kinds for the memory store.

use super::{lease, log, slots, Limit, LimitId, LimitKind};
use crate::limiter::LimitView;

/// The pure rules of one kind's record of one limit, times in µs on one clock (the memory
/// store's [`Clock`](super::clock::Clock)). `id` gives the limit's shape, kept out of every
/// record's bytes.
pub trait Rules {
    /// Drop what left the window at `now`.
    fn evict(&mut self, id: LimitId, now: u64);
    /// Requests counted against the limit (after [`Rules::evict`]).
    fn count(&self) -> u64;
    /// Record one admitted request of `weight` at `now` (after [`Rules::evict`] at the same
    /// `now`, which is never before [`Rules::newest`]): 1 but in a cost limit, which is slotted.
    fn push(&mut self, id: LimitId, now: u64, weight: u32);
    /// Time until this limit admits again when full (at most `requests`), else until the
    /// oldest counted request leaves; the window when nothing is counted.
    fn reset_us(&self, id: LimitId, requests: u32, now: u64) -> u64;
    /// Take back `amount` (one request; a cost limit's charged cost) recorded at `at`, as far
    /// as it is still counted (a refund).
    fn refund(&mut self, id: LimitId, at: u64, amount: u32);
    /// The newest recorded time, so a decision's `now` never goes back.
    fn newest(&self, id: LimitId) -> Option<u64>;
    /// When everything counted now has left the window (0 when nothing is counted).
    fn frees_us(&self, id: LimitId) -> u64;
    /// When a request recorded at `now` would leave the window.
    fn frees_if_recorded(id: LimitId, now: u64) -> u64;
    /// Count `count` requests (into an empty record) that all leave at `frees_us`, which is at
    /// most [`Rules::frees_if_recorded`] at the current time.
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64);
    /// Heap bytes of the record (allocator size classes are multiples of 16 here).
    fn heap_bytes(&self) -> usize;
    /// Heap bytes one more [`Rules::push`] may allocate.
    fn growth(&self, id: LimitId) -> usize;
    /// For the inspector: what a decision at `now` would report for `limit`, recording
    /// nothing; `to_unix` maps the store's clock to the Unix one.
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView;
}

/// The memory store's record of one limit: one variant per kind, each its module's record.
#[derive(Debug, Clone)]
pub enum Record {
    /// [`LimitKind::Log`]: one timestamp per admission.
    Log(log::Entries),
    /// [`LimitKind::Slotted`]: one counter per slot.
    Slots(slots::SlotCounts),
    /// [`LimitKind::Lease`]: one entry per lease held.
    Lease(lease::Leases),
}

/// Run `$body` with `$r` bound to the record of whichever kind `$record` holds: the one
/// `match` on kinds that [`Record`]'s rules need. Bodies call `Rules::f(r, ..)`: a kind's
/// record may have inherent methods of the same names (`SlotCounts` takes a `SlotShape`).
macro_rules! each_kind {
    ($record:expr, $r:ident => $body:expr) => {
        match $record {
            Record::Log($r) => $body,
            Record::Slots($r) => $body,
            Record::Lease($r) => $body,
        }
    };
}

impl Record {
    /// An empty record of the limit `id`.
    pub fn new(id: LimitId) -> Record {
        match id.kind() {
            LimitKind::Log => Record::Log(log::Entries::default()),
            LimitKind::Slotted { .. } => Record::Slots(slots::SlotCounts::default()),
            LimitKind::Lease => Record::Lease(lease::Leases::default()),
        }
    }

    /// When a request of limit `id` recorded at `now` would leave the window.
    pub fn frees_if_recorded(id: LimitId, now: u64) -> u64 {
        match id.kind() {
            LimitKind::Log => log::Entries::frees_if_recorded(id, now),
            LimitKind::Slotted { .. } => slots::SlotCounts::frees_if_recorded(id, now),
            LimitKind::Lease => lease::Leases::frees_if_recorded(id, now),
        }
    }
}

impl Rules for Record {
    fn evict(&mut self, id: LimitId, now: u64) {
        each_kind!(self, r => Rules::evict(r, id, now))
    }
    fn count(&self) -> u64 {
        each_kind!(self, r => Rules::count(r))
    }
    fn push(&mut self, id: LimitId, now: u64, weight: u32) {
        each_kind!(self, r => Rules::push(r, id, now, weight))
    }
    fn reset_us(&self, id: LimitId, requests: u32, now: u64) -> u64 {
        each_kind!(self, r => Rules::reset_us(r, id, requests, now))
    }
    fn refund(&mut self, id: LimitId, at: u64, amount: u32) {
        each_kind!(self, r => Rules::refund(r, id, at, amount))
    }
    fn newest(&self, id: LimitId) -> Option<u64> {
        each_kind!(self, r => Rules::newest(r, id))
    }
    fn frees_us(&self, id: LimitId) -> u64 {
        each_kind!(self, r => Rules::frees_us(r, id))
    }
    fn frees_if_recorded(id: LimitId, now: u64) -> u64 {
        Record::frees_if_recorded(id, now)
    }
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64) {
        each_kind!(self, r => Rules::seed(r, id, count, frees_us))
    }
    fn heap_bytes(&self) -> usize {
        each_kind!(self, r => Rules::heap_bytes(r))
    }
    fn growth(&self, id: LimitId) -> usize {
        each_kind!(self, r => Rules::growth(r, id))
    }
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView {
        each_kind!(self, r => Rules::view(r, limit, now, to_unix))
    }
}
