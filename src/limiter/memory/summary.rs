//! What evicted buckets had admitted, kept in fixed memory so that eviction never under-counts
//! (issue 32 row 3): a count-min style sketch per shard, taking the maximum instead of the sum.
//!
//! A cell holds a *step*: "at most `count` entries are counted until `frees`". Each (bucket
//! hash, limit) maps to one cell in each of [`ROWS`] rows; recording raises every one of them
//! to dominate the bucket's step (the larger count, the later time), so each row alone is an
//! upper bound on what any bucket hashed there still counts. Reading takes the minimum over
//! the rows (the smaller count and the earlier time: once any row frees, that row says 0),
//! which is still an upper bound. A cell whose time has passed is empty.
//!
//! A bucket's own step is its count held until its *newest* entry leaves: exact for a client
//! with one entry (most evicted buckets), later than exact (never earlier) for one with more.
//! A colliding client can only be over-counted, never under-counted; with the store's secret
//! hash seed a client cannot aim for a collision. Only a client the filter of evicted keys
//! (`seen.rs`) may hold reads the cells at all: a client never evicted starts from nothing,
//! however many made-up keys a flood pushed through the cells.

use super::seen::{mix, Seen};
use crate::limiter::LimitId;

/// Rows of the sketch: a reading is wrong only when all of them collide.
pub(super) const ROWS: usize = 4;

/// Bytes of one cell: count and time packed into a `u64`.
pub(super) const CELL_BYTES: usize = 8;

/// The largest count a cell holds (24 bits); a bucket counting more is never evicted.
pub(super) const MAX_COUNT: u64 = (1 << COUNT_BITS) - 1;

const COUNT_BITS: u32 = 24;

/// Widest row: 4 rows × 2048 cells × 8 B = 64 KiB per shard, and as much again for the filter
/// of evicted keys: 128 KiB per shard, 8 MiB per arena.
const MAX_WIDTH: usize = 2048;

/// The share of a shard's bytes its summary takes (the rest holds buckets).
const SHARE_DIVISOR: usize = 2;

/// What the summary holds for one bucket and limit: at most `count` entries, counted until
/// `frees_us` (µs on the store's clock; a time in the past means nothing is counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Held {
    /// Entries still counted against the limit.
    pub(super) count: u64,
    /// When all of them have left the window.
    pub(super) frees_us: u64,
}

/// One shard's sketch of evicted buckets.
#[derive(Debug)]
pub(super) struct Summary {
    /// Cells per row, a power of two.
    width: usize,
    /// `ROWS * width` cells, allocated at the first eviction (a store that never fills never
    /// pays for it, though its bytes are reserved from the start).
    cells: Vec<u64>,
    /// Which keys were evicted while counting something: only those read the cells.
    seen: Seen,
}

impl Summary {
    /// The summary of a shard whose share of `max_memory` is `shard_bytes`: half of it, the
    /// cells in half of that (rounded down to a power-of-two width, at least one cell per row)
    /// and the filter of evicted keys in the other half.
    pub(super) fn sized_for(shard_bytes: usize) -> Summary {
        let half = shard_bytes / SHARE_DIVISOR / 2;
        let cells = half / (ROWS * CELL_BYTES);
        let width = match cells {
            0 => 1,
            n => 1 << n.ilog2(),
        };
        let width = width.min(MAX_WIDTH);
        Summary {
            width,
            cells: Vec::new(),
            seen: Seen::sized_for(half.min(ROWS * MAX_WIDTH * CELL_BYTES)),
        }
    }

    /// Resize for a new share of `shard_bytes`: a summary with no cells yet takes the new
    /// size; one in use can only shrink, by folding each row's halves together (a cell's index
    /// is the hash's low bits, so the folded cell is where both halves' keys now read, and
    /// taking the larger count and later time of the two still bounds every key from above).
    pub(super) fn resize_for(&mut self, shard_bytes: usize) {
        let sized = Summary::sized_for(shard_bytes);
        self.seen.resize_for(sized.seen.bytes());
        let width = sized.width;
        if self.cells.is_empty() {
            self.width = width;
            return;
        }
        while self.width > width {
            let half = self.width / 2;
            let mut folded = vec![0; ROWS * half];
            for row in 0..ROWS {
                for j in 0..half {
                    let (a, b) = (
                        self.cells[row * self.width + j],
                        self.cells[row * self.width + j + half],
                    );
                    let count = (a & MAX_COUNT).max(b & MAX_COUNT);
                    folded[row * half + j] =
                        (a >> COUNT_BITS).max(b >> COUNT_BITS) << COUNT_BITS | count;
                }
            }
            self.cells = folded;
            self.width = half;
        }
    }

    /// Bytes reserved for the cells and the filter (counted against the shard's share whether
    /// allocated or not).
    pub(super) fn bytes(&self) -> usize {
        ROWS * self.width * CELL_BYTES + self.seen.bytes()
    }

    /// Raise the cells of (`key`, `id`) to hold `held` too, at `now`.
    pub(super) fn record(&mut self, key: u64, id: LimitId, held: Held, now: u64) {
        debug_assert!(held.count <= MAX_COUNT);
        if held.count == 0 || held.frees_us <= now {
            return;
        }
        if self.cells.is_empty() {
            self.cells = vec![0; ROWS * self.width];
        }
        // Kept as long as the cells keep it: its time rounded up to the ms, as packed.
        self.seen
            .insert(key, held.frees_us.div_ceil(1000) * 1000, now);
        for row in 0..ROWS {
            let i = self.index(key, id, row);
            let old = unpack(self.cells[i], now);
            let new = Held {
                count: old.count.max(held.count),
                frees_us: old.frees_us.max(held.frees_us),
            };
            self.cells[i] = pack(new);
        }
    }

    /// What the summary still counts for (`key`, `id`) at `now`: the minimum over the rows.
    pub(super) fn held(&self, key: u64, id: LimitId, now: u64) -> Held {
        if self.cells.is_empty() || !self.seen.contains(key, now) {
            return Held::default();
        }
        let mut min = Held {
            count: u64::MAX,
            frees_us: u64::MAX,
        };
        for row in 0..ROWS {
            let cell = unpack(self.cells[self.index(key, id, row)], now);
            if cell.count == 0 {
                return Held::default();
            }
            min.count = min.count.min(cell.count);
            min.frees_us = min.frees_us.min(cell.frees_us);
        }
        min
    }

    /// The cell of (`key`, `id`) in `row`. The key is already a keyed hash; mixing in the
    /// limit and the row gives each row its own, independent-looking, index.
    fn index(&self, key: u64, id: LimitId, row: usize) -> usize {
        // The window, and in the upper half the kind's own tag.
        let limit = id.summary_tag();
        let h = mix(key ^ mix(limit ^ (row as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        row * self.width + (h as usize & (self.width - 1))
    }
}

/// Count in the low 24 bits, the time it frees in whole ms (rounded up, so never earlier) in
/// the high 40 (34 years of uptime).
fn pack(held: Held) -> u64 {
    held.frees_us.div_ceil(1000) << COUNT_BITS | held.count.min(MAX_COUNT)
}

/// The cell's step, empty once its time has come.
fn unpack(cell: u64, now: u64) -> Held {
    let frees_us = (cell >> COUNT_BITS) * 1000;
    if frees_us <= now {
        return Held::default();
    }
    Held {
        count: cell & MAX_COUNT,
        frees_us,
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
