//! The rules every kind's record in the memory store follows ([`RecordRules`]); the memory store's
//! [`KindRecord`](super::KindRecord) holds one kind's record and follows them by delegation (the
//! `kinds!` registry in `algo/mod.rs`).

use super::{Limit, LimitId};
use crate::limiter::LimitView;

/// The pure rules of one kind's record of one limit, times in µs on one clock (the memory
/// store's [`Clock`](super::clock::Clock)). `id` gives the limit's shape, kept out of every
/// record's bytes.
pub trait RecordRules {
    /// Drop what left the window at `now`.
    fn evict(&mut self, id: LimitId, now: u64);
    /// Requests counted against the limit (after [`RecordRules::evict`]).
    fn count(&self) -> u64;
    /// Record one admitted request of `weight` at `now` (after [`RecordRules::evict`] at the same
    /// `now`, which is never before [`RecordRules::newest`]): 1 but in a cost limit, which is slotted.
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
    /// Count `count` requests (into an empty record) that all leave at `frees_us`, which is at
    /// most [`Kind::frees_if_recorded`](super::Kind::frees_if_recorded) at the current time.
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64);
    /// Heap bytes of the record (allocator size classes are multiples of 16 here).
    fn heap_bytes(&self) -> usize;
    /// Heap bytes one more [`RecordRules::push`] may allocate.
    fn growth(&self, id: LimitId) -> usize;
    /// What to write to the state file (`store.state_file`): the record as (time, amount)
    /// steps, oldest first, such that pushing each amount at its time into an empty record
    /// counts the same and frees nothing earlier (a slot's step is its last µs, so a slot
    /// moved onto another clock's slot grid is held at most one slot longer). Empty for what
    /// does not outlive the process (leases of requests in flight).
    fn persisted(&self, id: LimitId) -> Vec<(u64, u32)>;
    /// For the inspector: what a decision at `now` would report for `limit`, recording
    /// nothing; `to_unix` maps the store's clock to the Unix one.
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView;
}
