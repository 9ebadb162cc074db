//! The memory store's data: one shard (an index from key hash to a slot vector of buckets,
//! with its byte accounting and eviction), a bucket (one log per window), a log.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use smallvec::SmallVec;

use super::{BUCKET_COST, EVICTION_SAMPLES};
use crate::limiter::LimitId;

/// The log of one limit of one bucket: admitted timestamps (µs on the store's monotonic clock),
/// oldest first.
#[derive(Debug)]
pub(super) struct WindowLog {
    /// Which limit this is the log of (its window, today).
    pub(super) id: LimitId,
    /// `requests` of the limit at its latest decision (eviction must know who is at its limit).
    pub(super) requests: u32,
    pub(super) entries: VecDeque<u64>,
}

impl WindowLog {
    pub(super) fn window_us(&self) -> u64 {
        self.id.window_us()
    }

    /// Drop entries that are `window` or more old: an entry recorded at `t` frees its slot at
    /// exactly `t + window` (the same rule as the Lua script).
    pub(super) fn evict(&mut self, now: u64) {
        let cutoff = now.saturating_sub(self.window_us());
        while self.entries.front().is_some_and(|&t| t <= cutoff) {
            self.entries.pop_front();
        }
    }

    /// Heap bytes of the entries (allocator size classes are multiples of 16 here).
    pub(super) fn heap_bytes(&self) -> usize {
        match self.entries.capacity() {
            0 => 0,
            cap => (cap * 8).next_multiple_of(16),
        }
    }
}

/// All logs of one bucket (route + client), keyed by [`LimitId`] (which leaves `requests` out)
/// so that a reload that only changes `requests` keeps the recorded entries.
#[derive(Debug)]
pub struct Bucket {
    pub(super) key: u64,
    /// Newest activity (µs): the eviction tie-breaker.
    pub(super) last_us: u64,
    pub(super) logs: SmallVec<[WindowLog; 1]>,
}

impl Bucket {
    pub(super) fn log_index(&mut self, id: LimitId) -> usize {
        match self.logs.iter().position(|l| l.id == id) {
            Some(i) => i,
            None => {
                self.logs.push(WindowLog {
                    id,
                    requests: u32::MAX,
                    entries: VecDeque::new(),
                });
                self.logs.len() - 1
            }
        }
    }

    pub(super) fn cost(&self) -> usize {
        BUCKET_COST + self.logs.iter().map(WindowLog::heap_bytes).sum::<usize>()
    }

    /// The newest recorded timestamp, so a decision's `now` never goes back in time.
    pub(super) fn newest(&self) -> u64 {
        self.logs
            .iter()
            .filter_map(|l| l.entries.back().copied())
            .max()
            .unwrap_or(0)
    }

    /// After dropping expired entries: is any limit full (the bucket is then never evicted),
    /// and how full is the fullest one, in millionths.
    pub(super) fn fill(&mut self, now: u64) -> (bool, u64) {
        let mut at_limit = false;
        let mut fill = 0;
        for log in &mut self.logs {
            log.evict(now);
            let used = log.entries.len() as u64;
            let quota = u64::from(log.requests.max(1));
            at_limit |= used >= quota;
            fill = fill.max(used * 1_000_000 / quota);
        }
        (at_limit, fill)
    }
}

/// A hasher for keys that already are hashes.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Default)]
pub(super) struct Shard {
    pub(super) index: HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
    pub(super) slots: Vec<Bucket>,
    /// Accounted bytes: [`Bucket::cost`] summed.
    pub(super) bytes: usize,
}

impl Shard {
    pub(super) fn remove_at(&mut self, i: usize) {
        let b = self.slots.swap_remove(i);
        self.bytes -= b.cost();
        self.index.remove(&b.key);
        if let Some(moved) = self.slots.get(i) {
            self.index.insert(moved.key, i as u32);
        }
    }

    /// Evict sampled buckets until `need` more bytes fit in `budget`; never `keep`, never a
    /// bucket at its limit. Returns how many were evicted, or `Err` when no sampled bucket may
    /// go (the caller answers [`StoreError::Full`](crate::limiter::StoreError::Full)).
    pub(super) fn make_room(
        &mut self,
        need: usize,
        budget: usize,
        keep: u64,
        now: u64,
        rng: &mut fastrand::Rng,
    ) -> Result<u64, ()> {
        let mut evicted = 0;
        while self.bytes + need > budget {
            let n = self.slots.len();
            let mut best: Option<(usize, u64, u64)> = None;
            for _ in 0..EVICTION_SAMPLES.min(n) {
                let i = rng.usize(..n);
                let b = &mut self.slots[i];
                if b.key == keep {
                    continue;
                }
                let (at_limit, fill) = b.fill(now);
                if at_limit {
                    continue;
                }
                let better = best.is_none_or(|(_, f, last)| (fill, b.last_us) < (f, last));
                if better {
                    best = Some((i, fill, b.last_us));
                }
            }
            let Some((i, _, _)) = best else {
                return Err(());
            };
            self.remove_at(i);
            evicted += 1;
        }
        Ok(evicted)
    }
}
