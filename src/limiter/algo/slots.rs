//! Slotted limits ([`Slots`], [`LimitKind::Slotted`](super::LimitKind::Slotted)), and the
//! counters of one ([`SlotCounts`]): the pure decision both the memory store and the bounds proofs in the tests use. The Lua script
//! implements the same rules on a packed string (`lua/kinds/slots/`, SLOTS in its
//! header).
//!
//! Time is cut into slots of `resolution`; slot `s` holds the requests admitted in
//! `[s r, (s+1) r)`. With `n = window / resolution`, the slots that overlap `(now - window, now]`
//! are `cur - n ..= cur` (`cur = now / r`): n + 1 counters at most. A request is admitted only if
//! their sum is below `requests`. Every admission inside any window `(a, a + window]` is counted
//! by the last one of them, so no window ever holds more than `requests`. The oldest slot may
//! hold requests that already left the window: a refusal at `now` means at least `requests`
//! admissions in `(now - window - resolution, now]`, i.e. the exact log of a window one slot
//! longer would refuse too (the "one slot early" bound).

use std::collections::VecDeque;
use std::time::Duration;

use super::log::ceil_secs;
use super::{
    policy_text, state_of, Kind, KindOptions, Limit, LimitId, OptionError, QuotaUnit, RecordRules,
    Unit,
};
use crate::limiter::{LimitState, LimitView};

/// A slotted limit's parameters: its slot length and what it counts (a cost limit is always
/// slotted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slots {
    /// Slot length in ms (≥ 1, dividing the window).
    resolution_ms: u32,
    /// Requests, or cost units.
    unit: Unit,
}

impl Slots {
    /// Slots of `resolution` (whole milliseconds) counting `unit`.
    pub const fn new(resolution: Duration, unit: Unit) -> Slots {
        Slots {
            resolution_ms: resolution.as_millis() as u32,
            unit,
        }
    }

    /// The slot length.
    pub fn resolution(self) -> Duration {
        Duration::from_millis(u64::from(self.resolution_ms))
    }
}

impl Kind for Slots {
    type Record = SlotCounts;

    fn new_record(self) -> SlotCounts {
        SlotCounts::default()
    }

    /// `resolution` (and `unit`): the config's own keys.
    fn from_options(_: &KindOptions<'_>) -> Option<Result<(Self, Duration), OptionError>> {
        None
    }

    /// `<window ms>@<resolution ms>`, and `c` for a cost limit (its own key beside a request
    /// limit of the same window and resolution).
    fn push_key_suffix(self, window_ms: u32, out: &mut Vec<u8>) {
        let mut buf = itoa::Buffer::new();
        out.extend_from_slice(buf.format(window_ms).as_bytes());
        out.push(b'@');
        out.extend_from_slice(buf.format(self.resolution_ms).as_bytes());
        match self.unit {
            Unit::Cost => out.push(b'c'),
            Unit::Requests => {}
        }
    }

    /// `1s@100ms`, and `-cost` for a cost limit.
    fn policy_suffix(self, window_ms: u32) -> String {
        let unit = match self.unit {
            Unit::Cost => "-cost",
            Unit::Requests => "",
        };
        format!(
            "{}@{}{unit}",
            policy_text(window_ms),
            policy_text(self.resolution_ms)
        )
    }

    /// The window, and the resolution in µs (≥ 1000: never the log's 0 nor the values 1 to
    /// 999 other kinds own).
    fn script_args(self, window_us: u64) -> [i64; 2] {
        [window_us as i64, i64::from(self.resolution_ms) * 1000]
    }

    fn state_from_reply(self, reply: &[i64]) -> LimitState {
        state_of(reply, u64::MAX)
    }

    fn view_from_inspect(self, limit: &Limit, head: [i64; 3], values: &[i64]) -> Option<LimitView> {
        view_from_inspect(limit, head, values)
    }

    fn unit(self) -> Unit {
        self.unit
    }

    fn quota_unit(self) -> QuotaUnit {
        match self.unit {
            Unit::Cost => QuotaUnit::Cost,
            Unit::Requests => QuotaUnit::Requests,
        }
    }

    fn policy_window_s(self, window: Duration) -> Option<u64> {
        Some(ceil_secs(window))
    }

    /// The resolution in ms (a lease's `u32::MAX` is none: a slot divides a month at most).
    fn summary_tag(self) -> u32 {
        self.resolution_ms
    }

    /// When `now`'s slot leaves.
    fn frees_if_recorded(self, window_us: u64, now: u64) -> u64 {
        let shape = SlotShape {
            window_us,
            resolution_us: u64::from(self.resolution_ms) * 1000,
        };
        shape.leaves_at(shape.slot_of(now))
    }

    fn is_lease(self) -> bool {
        false
    }

    fn resolution_us(self) -> Option<u64> {
        Some(u64::from(self.resolution_ms) * 1000)
    }

    /// Its entries say it all.
    fn about(self, _now_unix_us: u64) -> Option<String> {
        None
    }
}

/// The inspector script's view of a slotted limit: its `reset` (count and remaining follow
/// from the counters), then (slot start in µs since the Unix epoch, counter) pairs; `None`
/// for an odd number of values.
pub fn view_from_inspect(limit: &Limit, head: [i64; 3], pairs: &[i64]) -> Option<LimitView> {
    if !pairs.len().is_multiple_of(2) {
        return None;
    }
    let reset = Duration::from_micros(head[2].max(0) as u64);
    let counted = pairs.chunks_exact(2).map(|p| {
        (
            p[0].max(0) as u64,
            p[1].clamp(0, i64::from(u32::MAX)) as u32,
        )
    });
    Some(LimitView::from_slots(limit, counted.collect(), reset))
}

/// The counters of slots `first ..`, contiguous, the first one non-zero (or none at all).
#[derive(Debug, Default, Clone)]
pub struct SlotCounts {
    first: u64,
    counts: VecDeque<u32>,
}

/// The shape of a slotted limit, in µs.
#[derive(Debug, Clone, Copy)]
pub struct SlotShape {
    /// Window length (a multiple of `resolution`).
    pub window_us: u64,
    /// Slot length (≥ 1000).
    pub resolution_us: u64,
}

impl SlotShape {
    /// The shape of the slotted limit `id` (a log's id gives slots of 1 ms: never asked).
    pub fn of(id: LimitId) -> SlotShape {
        SlotShape {
            window_us: id.window_us(),
            resolution_us: id.resolution_us().unwrap_or(1000),
        }
    }

    fn slots(self) -> u64 {
        self.window_us / self.resolution_us
    }

    /// The slot `now` falls in.
    pub fn slot_of(self, now: u64) -> u64 {
        now / self.resolution_us
    }

    /// When slot `s` stops overlapping the window: `(s + 1) r + window`.
    pub fn leaves_at(self, s: u64) -> u64 {
        (s + 1) * self.resolution_us + self.window_us
    }
}

impl SlotCounts {
    /// Drop the slots that no longer overlap `(now - window, now]`, and leading empty ones.
    pub fn evict(&mut self, shape: SlotShape, now: u64) {
        let oldest = shape.slot_of(now).saturating_sub(shape.slots());
        while self
            .counts
            .front()
            .is_some_and(|&c| self.first < oldest || c == 0)
        {
            self.counts.pop_front();
            self.first += 1;
        }
    }

    /// Requests counted (after [`SlotCounts::evict`]: in every slot overlapping the window).
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// True when no slot holds anything.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Record one request at `now` (after [`SlotCounts::evict`] at the same `now`, which must
    /// not be before [`SlotCounts::newest`]). Reserves every counter the window can need at the
    /// first push, so the counters never reallocate.
    pub fn push(&mut self, shape: SlotShape, now: u64, weight: u32) {
        if weight == 0 {
            // Admitted without consuming: no counter of 0 is kept.
            return;
        }
        let cur = shape.slot_of(now);
        if self.counts.is_empty() {
            self.first = cur;
            self.counts.reserve_exact(shape.slots() as usize + 1);
            self.counts.push_back(weight);
            return;
        }
        let last = self.first + self.counts.len() as u64 - 1;
        if cur > last {
            self.counts
                .extend(std::iter::repeat_n(0, (cur - last - 1) as usize));
            self.counts.push_back(weight);
        } else if let Some(c) = self.counts.back_mut() {
            *c = c.saturating_add(weight);
        }
    }

    /// Take back `amount` recorded at `at` from its slot, as far as that slot is still kept
    /// and counts it (a refund). Leading empty slots are dropped, as [`SlotCounts::evict`]
    /// does.
    pub fn refund(&mut self, shape: SlotShape, at: u64, amount: u32) {
        let s = shape.slot_of(at);
        let Some(i) = s.checked_sub(self.first) else {
            return;
        };
        if let Some(c) = self.counts.get_mut(i as usize) {
            *c = c.saturating_sub(amount);
        }
        while self.counts.front() == Some(&0) {
            self.counts.pop_front();
            self.first += 1;
        }
    }

    /// Time until this limit admits again when full, else until its oldest slot leaves; the
    /// window when nothing is counted. Between `1` and `window + resolution` µs.
    pub fn reset_us(&self, shape: SlotShape, requests: u32, now: u64) -> u64 {
        let count = self.count();
        if count == 0 {
            return shape.window_us;
        }
        // The slots that must leave before the count is below `requests` (at least one).
        let must_drop = (count + 1).saturating_sub(u64::from(requests)).max(1);
        let mut dropped = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            dropped += u64::from(c);
            if dropped >= must_drop {
                return shape
                    .leaves_at(self.first + i as u64)
                    .saturating_sub(now)
                    .max(1);
            }
        }
        shape.window_us
    }

    /// The start of the newest non-empty slot (0 when none): a `now` never goes before it.
    pub fn newest(&self, shape: SlotShape) -> u64 {
        match self.counts.len() {
            0 => 0,
            n => (self.first + n as u64 - 1) * shape.resolution_us,
        }
    }

    /// Heap bytes of the counters (allocator size classes are multiples of 16 here).
    pub fn heap_bytes(&self) -> usize {
        match self.counts.capacity() {
            0 => 0,
            cap => (cap * 4).next_multiple_of(16),
        }
    }

    /// Heap bytes one more push may allocate: every counter at the first push, none after.
    pub fn growth(&self, shape: SlotShape) -> usize {
        match self.counts.capacity() {
            0 => ((shape.slots() as usize + 1) * 4).next_multiple_of(16),
            _ => 0,
        }
    }

    /// Every non-empty slot: (its start in µs, its count), oldest first.
    pub fn slots(&self, shape: SlotShape) -> impl Iterator<Item = (u64, u32)> + '_ {
        let first = self.first;
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(move |(i, &c)| ((first + i as u64) * shape.resolution_us, c))
    }
}

impl RecordRules for SlotCounts {
    fn evict(&mut self, id: LimitId, now: u64) {
        SlotCounts::evict(self, SlotShape::of(id), now);
    }

    fn count(&self) -> u64 {
        SlotCounts::count(self)
    }

    fn push(&mut self, id: LimitId, now: u64, weight: u32) {
        SlotCounts::push(self, SlotShape::of(id), now, weight);
    }

    fn reset_us(&self, id: LimitId, requests: u32, now: u64) -> u64 {
        SlotCounts::reset_us(self, SlotShape::of(id), requests, now)
    }

    fn refund(&mut self, id: LimitId, at: u64, amount: u32) {
        SlotCounts::refund(self, SlotShape::of(id), at, amount);
    }

    /// The start of the newest non-empty slot.
    fn newest(&self, id: LimitId) -> Option<u64> {
        (!self.is_empty()).then(|| SlotCounts::newest(self, SlotShape::of(id)))
    }

    /// When the newest non-empty slot leaves.
    fn frees_us(&self, id: LimitId) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let shape = SlotShape::of(id);
        shape.leaves_at(shape.slot_of(SlotCounts::newest(self, shape)))
    }

    /// `count` requests in the slot that leaves at or after `frees_us`:
    /// `(s + 1) r + window >= frees_us`.
    fn seed(&mut self, id: LimitId, count: u64, frees_us: u64) {
        let shape = SlotShape::of(id);
        let r = shape.resolution_us;
        let at = frees_us.saturating_sub(shape.window_us);
        let slot_start = (at.div_ceil(r)).saturating_sub(1) * r;
        let count = count.min(u64::from(u32::MAX)) as u32;
        SlotCounts::push(self, shape, slot_start, count);
    }

    fn heap_bytes(&self) -> usize {
        SlotCounts::heap_bytes(self)
    }

    /// Every counter is reserved at the first push, none after.
    fn growth(&self, id: LimitId) -> usize {
        SlotCounts::growth(self, SlotShape::of(id))
    }

    /// Each counted slot's count at the slot's last µs.
    fn persisted(&self, id: LimitId) -> Vec<(u64, u32)> {
        let shape = SlotShape::of(id);
        let last = shape.resolution_us - 1;
        self.slots(shape).map(|(t, c)| (t + last, c)).collect()
    }

    /// Each counted slot's start with its count, oldest first.
    fn view(&self, limit: &Limit, now: u64, to_unix: &dyn Fn(u64) -> u64) -> LimitView {
        let shape = SlotShape::of(limit.id());
        let mut counts = self.clone();
        counts.evict(shape, now);
        let reset = Duration::from_micros(counts.reset_us(shape, limit.requests, now));
        let counted = counts.slots(shape).map(|(t, c)| (to_unix(t), c));
        LimitView::from_slots(limit, counted.collect(), reset)
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
