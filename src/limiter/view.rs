//! What the admin inspector reads of a bucket: its limits as they stand, recording nothing.

use std::time::Duration;

use super::Limit;

/// Most entries one [`LimitView`] carries: the newest ones, enough to draw a window, bounded
/// so that inspecting a limit of a million requests cannot build a huge reply.
pub const MAX_VIEW_ENTRIES: usize = 1000;

/// One limit of a bucket as it stands right now, read without recording anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitView {
    /// Entries in the window (all of them, even when `entries_us` is truncated).
    pub count: u64,
    /// Requests the limit would still admit right now (0 when full).
    pub remaining: u32,
    /// Time until there is room for one more request, the same rule as
    /// [`LimitState::reset`](super::LimitState::reset) (the full window when the log is empty).
    pub reset: Duration,
    /// The newest in-window entries (at most [`MAX_VIEW_ENTRIES`]), oldest first, in µs since the
    /// Unix epoch on the store's clock.
    pub entries_us: Vec<u64>,
    /// A slotted limit's non-empty slots overlapping the window, oldest first: (start in µs
    /// since the Unix epoch, requests counted in it). Empty for a log.
    pub slots: Vec<(u64, u32)>,
}

impl LimitView {
    /// The view of `limit` given its in-window entries (oldest first, µs on the store clock) and
    /// the store's `now_us`: exactly what the deciding step would report for them.
    pub fn from_entries(limit: &Limit, in_window: &[u64], now_us: u64) -> LimitView {
        let window_us = limit.window_us();
        let count = in_window.len();
        let r = limit.requests as usize;
        // The same pivot as the script: a full limit admits again when entry[c - r] leaves.
        let reset_us = match in_window.get(count.saturating_sub(r)) {
            Some(&t) => (t + window_us).saturating_sub(now_us).max(1),
            None => window_us,
        };
        LimitView {
            count: count as u64,
            remaining: r.saturating_sub(count) as u32,
            reset: Duration::from_micros(reset_us),
            entries_us: in_window[count.saturating_sub(MAX_VIEW_ENTRIES)..].to_vec(),
            slots: Vec::new(),
        }
    }

    /// The view of a slotted `limit` given its non-empty slots overlapping the window (oldest
    /// first) and the store's `reset`. `entries_us` repeats each slot's start by its counter
    /// (the newest [`MAX_VIEW_ENTRIES`]), so a page that draws entries draws slots as stacks.
    pub fn from_slots(limit: &Limit, slots: Vec<(u64, u32)>, reset: Duration) -> LimitView {
        let count: u64 = slots.iter().map(|&(_, c)| u64::from(c)).sum();
        let mut entries_us = Vec::new();
        for &(start, c) in slots.iter().rev() {
            let room = MAX_VIEW_ENTRIES - entries_us.len();
            entries_us.extend(std::iter::repeat_n(start, room.min(c as usize)));
        }
        entries_us.reverse();
        LimitView {
            count,
            remaining: u64::from(limit.requests).saturating_sub(count) as u32,
            reset,
            entries_us,
            slots,
        }
    }
}

/// One bucket as it stands right now: the store's clock and one view per limit, in the order the
/// limits were given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowView {
    /// The store's clock (Redis `TIME` for Redis), µs since the Unix epoch.
    pub now_us: u64,
    /// One view per limit.
    pub limits: Vec<LimitView>,
}
