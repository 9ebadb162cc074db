//! What one limit of one bucket records: the exact log (one timestamp per admitted request) or
//! a slotted limit's counters ([`SlotCounts`]), behind one interface so the bucket's decision,
//! its byte accounting and the sweep treat both alike.

use std::collections::VecDeque;
use std::time::Duration;

use super::summary::Held;
use crate::limiter::algo::slots::{SlotCounts, SlotShape};
use crate::limiter::{Limit, LimitId, LimitView};

/// The record of one limit of one bucket, µs on the store's monotonic clock.
#[derive(Debug)]
pub(super) struct WindowLog {
    /// Which limit this is the record of (its window and resolution).
    pub(super) id: LimitId,
    /// `requests` of the limit at its latest decision (eviction must know who is at its limit).
    pub(super) requests: u32,
    record: Record,
}

#[derive(Debug)]
enum Record {
    /// Admitted timestamps, oldest first.
    Log(VecDeque<u64>),
    /// One counter per slot (its shape comes from the id: kept out of every bucket's bytes).
    Slots(SlotCounts),
}

impl WindowLog {
    /// An empty record of the limit `id`.
    pub(super) fn new(id: LimitId) -> WindowLog {
        let record = match id.resolution_us() {
            None => Record::Log(VecDeque::new()),
            Some(_) => Record::Slots(SlotCounts::default()),
        };
        WindowLog {
            id,
            requests: u32::MAX,
            record,
        }
    }

    fn window_us(&self) -> u64 {
        self.id.window_us()
    }

    fn shape(&self) -> SlotShape {
        SlotShape {
            window_us: self.id.window_us(),
            resolution_us: self.id.resolution_us().unwrap_or(1000),
        }
    }

    /// Drop what left the window: an entry recorded at `t` frees its slot at exactly
    /// `t + window` (the same rule as the Lua script); a slot `s` at `(s + 1) r + window`.
    pub(super) fn evict(&mut self, now: u64) {
        let (cutoff, shape) = (now.saturating_sub(self.window_us()), self.shape());
        match &mut self.record {
            Record::Log(entries) => {
                while entries.front().is_some_and(|&t| t <= cutoff) {
                    entries.pop_front();
                }
            }
            Record::Slots(slots) => slots.evict(shape, now),
        }
    }

    /// Requests counted against the limit (after [`WindowLog::evict`]).
    pub(super) fn count(&self) -> u64 {
        match &self.record {
            Record::Log(entries) => entries.len() as u64,
            Record::Slots(slots) => slots.count(),
        }
    }

    /// True when nothing is recorded.
    pub(super) fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// Record one admitted request at `now` (after [`WindowLog::evict`] at the same `now`).
    pub(super) fn push(&mut self, now: u64) {
        let shape = self.shape();
        match &mut self.record {
            Record::Log(entries) => {
                if entries.capacity() == 0 {
                    // Most clients never have more than one entry: start exact.
                    entries.reserve_exact(1);
                }
                entries.push_back(now);
            }
            Record::Slots(slots) => slots.push(shape, now),
        }
    }

    /// A full limit admits again when entry[len - requests] leaves: the oldest, unless a
    /// reload lowered `requests` below what the log already holds; a non-full one frees a slot
    /// when its oldest entry leaves; an empty one reports the window. `now` is never older
    /// than an entry (taken under the lock, clamped to the newest); saturate anyway.
    pub(super) fn reset_us(&self, requests: u32, now: u64) -> u64 {
        match &self.record {
            Record::Log(entries) => {
                let pivot = entries.len().saturating_sub(requests as usize);
                match entries.get(pivot) {
                    Some(&t) => (t + self.window_us()).saturating_sub(now),
                    None => self.window_us(),
                }
            }
            Record::Slots(slots) => slots.reset_us(self.shape(), requests, now),
        }
    }

    /// Remove one entry recorded at `at` (a log: the newest such entry, searched from the
    /// newest end, where a refund's entry is; slots: one count from `at`'s slot), if any.
    pub(super) fn refund(&mut self, at: u64) {
        let shape = self.shape();
        match &mut self.record {
            Record::Log(entries) => {
                if let Some(i) = entries.iter().rposition(|&t| t == at) {
                    entries.remove(i);
                }
            }
            Record::Slots(slots) => slots.refund(shape, at),
        }
    }

    /// The newest recorded time (a slot's start), so a decision's `now` never goes back.
    pub(super) fn newest(&self) -> Option<u64> {
        match &self.record {
            Record::Log(entries) => entries.back().copied(),
            Record::Slots(slots) => (!slots.is_empty()).then(|| slots.newest(self.shape())),
        }
    }

    /// What this record still counts, as one step for the summary (after
    /// [`WindowLog::evict`]): its count, held until its newest entry (or slot) leaves.
    pub(super) fn held(&self) -> Held {
        let frees_us = match &self.record {
            Record::Log(entries) => entries.back().map_or(0, |&t| t + self.window_us()),
            Record::Slots(slots) if !slots.is_empty() => {
                let shape = self.shape();
                shape.leaves_at(shape.slot_of(slots.newest(shape)))
            }
            Record::Slots(_) => 0,
        };
        Held {
            count: self.count(),
            frees_us,
        }
    }

    /// When an entry of limit `id` recorded at `now` leaves its window: a log's at
    /// `now + window`, a slotted limit's when `now`'s slot leaves.
    pub(super) fn frees_if_recorded(id: LimitId, now: u64) -> u64 {
        match id.resolution_us() {
            None => now + id.window_us(),
            Some(r) => (now / r + 1) * r + id.window_us(),
        }
    }

    /// Start an empty record from what the summary holds for it at `now`: `held.count`
    /// entries that all leave at `held.frees_us` (a log: timestamps one window before; slots:
    /// the count in the slot that leaves then), so the log and slot rules decide from there.
    /// A time later than this limit's own entries could free (a colliding limit with a longer
    /// window) is brought back to that, which still counts every entry this client has.
    pub(super) fn seed(&mut self, held: Held, now: u64) {
        debug_assert!(self.is_empty());
        let frees_us = held.frees_us.min(Self::frees_if_recorded(self.id, now));
        if held.count == 0 || frees_us <= now {
            return;
        }
        let window = self.window_us();
        let at = frees_us.saturating_sub(window);
        let shape = self.shape();
        match &mut self.record {
            Record::Log(entries) => {
                entries.reserve_exact(held.count as usize);
                entries.extend(std::iter::repeat_n(at, held.count as usize));
            }
            Record::Slots(slots) => {
                // The slot `s` leaving at or after `frees_us`: (s + 1) r + window >= frees_us.
                let r = shape.resolution_us;
                let slot_start = (at.div_ceil(r)).saturating_sub(1) * r;
                for _ in 0..held.count {
                    slots.push(shape, slot_start);
                }
            }
        }
    }

    /// Heap bytes of the record (allocator size classes are multiples of 16 here).
    pub(super) fn heap_bytes(&self) -> usize {
        match &self.record {
            Record::Log(entries) => match entries.capacity() {
                0 => 0,
                cap => (cap * 8).next_multiple_of(16),
            },
            Record::Slots(slots) => slots.heap_bytes(),
        }
    }

    /// Bytes one more push allocates: a full log doubles its capacity (a new one starts at one
    /// entry); slot counters are all reserved at their first push.
    pub(super) fn growth(&self) -> usize {
        match &self.record {
            Record::Log(entries) if entries.len() == entries.capacity() => {
                (entries.capacity().max(1) * 8).next_multiple_of(16)
            }
            Record::Log(_) => 0,
            Record::Slots(slots) => slots.growth(self.shape()),
        }
    }

    /// For the inspector, read only: what a decision at `now` would report, with the
    /// in-window entries of a log (or, for slotted limits, each counted slot's start repeated
    /// by its count), oldest first, the newest [`MAX_VIEW_ENTRIES`](crate::limiter::MAX_VIEW_ENTRIES) of them; `to_unix` maps the
    /// store's clock to the Unix one.
    pub(super) fn view(&self, limit: &Limit, now: u64, to_unix: impl Fn(u64) -> u64) -> LimitView {
        let cutoff = now.saturating_sub(self.window_us());
        match &self.record {
            Record::Log(entries) => {
                let live: Vec<u64> = entries
                    .iter()
                    .filter(|&&t| t > cutoff)
                    .map(|&t| to_unix(t))
                    .collect();
                LimitView::from_entries(limit, &live, to_unix(now))
            }
            Record::Slots(slots) => {
                let mut slots = slots.clone();
                slots.evict(self.shape(), now);
                let reset =
                    Duration::from_micros(slots.reset_us(self.shape(), limit.requests, now));
                let counted = slots.slots(self.shape()).map(|(s, c)| (to_unix(s), c));
                LimitView::from_slots(limit, counted.collect(), reset)
            }
        }
    }
}
