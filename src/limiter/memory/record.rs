//! What one limit of one bucket keeps: its kind's record ([`KindRecord`]) with the limit's
//! identity and latest `requests`, and the two rules that tie a record to the summary of
//! evicted buckets (what it holds, and starting from what the summary holds). Every window
//! rule is its kind's (`crate::limiter::algo`).

use super::summary::Held;
use crate::limiter::algo::{Kind, KindRecord, RecordRules};
use crate::limiter::{Limit, LimitId, LimitView};

/// The record of one limit of one bucket, µs on the store's clock.
#[derive(Debug)]
pub(super) struct LimitRecord {
    /// Which limit this is the record of (its window and kind).
    pub(super) id: LimitId,
    /// `requests` of the limit at its latest decision (eviction must know who is at its limit).
    pub(super) requests: u32,
    record: KindRecord,
}

impl LimitRecord {
    /// An empty record of the limit `id`.
    pub(super) fn new(id: LimitId) -> LimitRecord {
        LimitRecord {
            id,
            requests: u32::MAX,
            record: id.kind().new_record(),
        }
    }

    /// Drop what left the window at `now` (the same rule as the Lua script).
    pub(super) fn evict(&mut self, now: u64) {
        self.record.evict(self.id, now);
    }

    /// Requests counted against the limit (after [`LimitRecord::evict`]).
    pub(super) fn count(&self) -> u64 {
        self.record.count()
    }

    /// True when nothing is recorded.
    pub(super) fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// Record one admitted request of `weight` at `now` (after [`LimitRecord::evict`] at the
    /// same `now`).
    pub(super) fn push(&mut self, now: u64, weight: u32) {
        self.record.push(self.id, now, weight);
    }

    /// When this limit admits again if full, else frees room; the window when empty.
    pub(super) fn reset_us(&self, requests: u32, now: u64) -> u64 {
        self.record.reset_us(self.id, requests, now)
    }

    /// Take back `amount` recorded at `at`, as far as it is still counted.
    pub(super) fn refund(&mut self, at: u64, amount: u32) {
        self.record.refund(self.id, at, amount);
    }

    /// The newest recorded time, so a decision's `now` never goes back.
    pub(super) fn newest(&self) -> Option<u64> {
        self.record.newest(self.id)
    }

    /// What this record still counts, as one step for the summary (after
    /// [`LimitRecord::evict`]): its count, held until its newest entry (or slot) leaves.
    pub(super) fn held(&self) -> Held {
        Held {
            count: self.count(),
            frees_us: self.record.frees_us(self.id),
        }
    }

    /// When a request of limit `id` recorded at `now` leaves its window.
    pub(super) fn frees_if_recorded(id: LimitId, now: u64) -> u64 {
        id.kind().frees_if_recorded(id.window_us(), now)
    }

    /// Start an empty record from what the summary holds for it at `now`: `held.count`
    /// requests that all leave at `held.frees_us`, so the kind's rules decide from there. A
    /// time later than this limit's own requests could free (a colliding limit with a longer
    /// window) is brought back to that, which still counts every request this client has.
    pub(super) fn seed(&mut self, held: Held, now: u64) {
        debug_assert!(self.is_empty());
        let frees_us = held.frees_us.min(Self::frees_if_recorded(self.id, now));
        if held.count == 0 || frees_us <= now {
            return;
        }
        self.record.seed(self.id, held.count, frees_us);
    }

    /// The record as (time, amount) steps for the state file (see [`RecordRules::persisted`]).
    pub(super) fn persisted(&self) -> Vec<(u64, u32)> {
        self.record.persisted(self.id)
    }

    /// Heap bytes of the record (allocator size classes are multiples of 16 here).
    pub(super) fn heap_bytes(&self) -> usize {
        self.record.heap_bytes()
    }

    /// Bytes one more push allocates.
    pub(super) fn growth(&self) -> usize {
        self.record.growth(self.id)
    }

    /// For the inspector, read only: what a decision at `now` would report.
    pub(super) fn view(&self, limit: &Limit, now: u64, to_unix: impl Fn(u64) -> u64) -> LimitView {
        self.record.view(limit, now, &to_unix)
    }
}
