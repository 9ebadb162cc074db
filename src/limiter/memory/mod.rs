//! In-process store: exact within one process, sharded (no global lock on the hot path), and
//! bounded twice: buckets whose every log has slid out of its window are swept away, and the
//! store's own accounting of buckets and entries never exceeds `max_memory`.
//!
//! It has exactly the semantics of the Redis script, so the conformance suite runs against
//! both; it is the default store for single-instance deployments and tests.
//!
//! **Layout.** A bucket key (route + client, up to ~100 bytes) is hashed to a `u64` with xxh3
//! under a per-process random seed, and never stored: the top bits pick one of [`SHARDS`]
//! shards, each a mutex over a `HashMap<u64, u32>` index into a `Vec` of buckets (so a random
//! bucket can be sampled for eviction in O(1)). A bucket is the hash, its newest activity and
//! one log per limit (found by its `LimitId`) held inline (`SmallVec`), each log a `VecDeque` of
//! microsecond timestamps. Two different keys with the same 64-bit hash would share one bucket, which is
//! stricter for both, never looser; with a secret seed a client cannot aim for that.
//!
//! **Bound.** Each shard has `max_memory / SHARDS` bytes: [`BUCKET_COST`] per bucket plus the
//! capacity of its logs. A request that needs more than is left first evicts other buckets,
//! chosen like this so that rotating made-up keys never helps an attacker: sample up to
//! [`EVICTION_SAMPLES`] buckets, drop their expired entries, skip every bucket that is at its
//! limit in any window (evicting it would hand that client a fresh quota), and evict the one
//! with the most spare quota, the oldest activity breaking ties. If no sampled bucket may go,
//! the request gets [`StoreError::Full`] and the route's `on_error` decides it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use smallvec::SmallVec;

use super::{Limit, LimitState, LimitView, Store, StoreError, Verdict, WindowView};
use shard::{Bucket, Shard};

mod shard;

/// Number of shards (a power of two); the top bits of a key's hash pick its shard.
pub const SHARDS: usize = 64;

/// Buckets sampled per eviction attempt.
pub const EVICTION_SAMPLES: usize = 16;

/// Accounted bytes per bucket besides its entries: the bucket itself in the slot vector (plus
/// growth slack) and its index slot at hashbrown's lowest load factor.
pub const BUCKET_COST: usize = std::mem::size_of::<Bucket>() + 40;

/// Default `max_memory`: 256 MiB.
pub const DEFAULT_MAX_MEMORY: u64 = 256 << 20;

/// The in-process sliding-window-log store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    seed: u64,
    epoch: Instant,
    /// Wall-clock time of `epoch`, µs since the Unix epoch: the inspector shows timestamps on a
    /// clock people can read, while decisions stay on the monotonic one.
    epoch_unix_us: u64,
    shard_budget: usize,
    evictions: AtomicU64,
    eviction_counter: Option<prometheus::IntCounter>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store bounded by [`DEFAULT_MAX_MEMORY`].
    pub fn new() -> Self {
        Self::with_max_memory(DEFAULT_MAX_MEMORY)
    }

    /// An empty store whose accounting of buckets and entries stays within `max_memory` bytes.
    pub fn with_max_memory(max_memory: u64) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            seed: fastrand::u64(..),
            epoch: Instant::now(),
            epoch_unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            shard_budget: (max_memory / SHARDS as u64) as usize,
            evictions: AtomicU64::new(0),
            eviction_counter: None,
        }
    }

    /// Also count evictions in `counter` (`slidegate_store_evictions_total`).
    pub fn with_eviction_counter(mut self, counter: prometheus::IntCounter) -> Self {
        self.eviction_counter = Some(counter);
        self
    }

    /// Microseconds on a monotonic clock; offset by one so that 0 never is a valid timestamp.
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    fn lock(&self, i: usize) -> std::sync::MutexGuard<'_, Shard> {
        // A panic while holding a shard cannot leave it inconsistent in a way that matters
        // more than losing the whole store: keep serving.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hash(&self, bucket: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(bucket.as_bytes(), self.seed)
    }

    /// The shard of a key hash: its top bits.
    fn shard_of(key: u64) -> usize {
        (key >> (64 - SHARDS.trailing_zeros())) as usize
    }

    /// Number of buckets currently held.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).slots.len()).sum()
    }

    /// True when no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total recorded entries over all buckets and limits.
    pub fn entries(&self) -> usize {
        (0..SHARDS)
            .map(|i| {
                let shard = self.lock(i);
                shard
                    .slots
                    .iter()
                    .map(|b| b.logs.iter().map(|l| l.entries.len()).sum::<usize>())
                    .sum::<usize>()
            })
            .sum()
    }

    /// The store's own accounting of its memory, in bytes (bounded by `max_memory`).
    pub fn accounted_bytes(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).bytes).sum()
    }

    /// Buckets evicted so far to stay within `max_memory`.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Evict expired entries everywhere and drop buckets with nothing left, so a million
    /// one-off clients do not stay in memory. Each shard is locked only while it is swept.
    pub fn sweep(&self) {
        for i in 0..SHARDS {
            let mut shard = self.lock(i);
            let now = self.now_us();
            let mut j = 0;
            while j < shard.slots.len() {
                let b = &mut shard.slots[j];
                let before = b.cost();
                b.logs.retain_mut(|log| {
                    log.evict(now);
                    !log.entries.is_empty()
                });
                let after = b.cost();
                shard.bytes = shard.bytes - before + after;
                if shard.slots[j].logs.is_empty() {
                    shard.remove_at(j);
                } else {
                    j += 1;
                }
            }
            // Give memory back after a wave of one-off clients, but don't reallocate every
            // second.
            let len = shard.slots.len();
            if len < shard.slots.capacity() / 4 {
                shard.slots.shrink_to(len * 2);
                shard.index.shrink_to(len * 2);
            }
        }
    }

    fn decide(bucket: &mut Bucket, limits: &[Limit], now: u64) -> Verdict {
        bucket.last_us = now;
        // Pass 1: evict and count every limit; admitted only if all have room.
        let mut admitted = true;
        for limit in limits {
            let i = bucket.log_index(limit.id());
            let log = &mut bucket.logs[i];
            log.requests = limit.requests;
            log.evict(now);
            admitted &= log.entries.len() < limit.requests as usize;
        }
        // Pass 2: record in all or none, and report each limit's state.
        let states = limits
            .iter()
            .map(|limit| {
                let i = bucket.log_index(limit.id());
                let log = &mut bucket.logs[i];
                if admitted {
                    if log.entries.capacity() == 0 {
                        // Most clients never have more than one entry: start exact.
                        log.entries.reserve_exact(1);
                    }
                    log.entries.push_back(now);
                }
                // A full limit admits again when entry[len - requests] leaves: the oldest,
                // unless a reload lowered `requests` below what the log already holds. `now` is
                // never older than an entry (taken under the lock, clamped to the newest), so
                // this cannot underflow; saturate anyway.
                let pivot = log.entries.len().saturating_sub(limit.requests as usize);
                let reset_us = match log.entries.get(pivot) {
                    Some(&t) => (t + log.window_us()).saturating_sub(now),
                    None => log.window_us(),
                };
                LimitState {
                    remaining: u64::from(limit.requests).saturating_sub(log.entries.len() as u64)
                        as u32,
                    reset: Duration::from_micros(reset_us),
                }
            })
            .collect();
        Verdict { admitted, states }
    }

    fn count_evictions(&self, n: u64) {
        if n > 0 {
            self.evictions.fetch_add(n, Ordering::Relaxed);
            if let Some(c) = &self.eviction_counter {
                c.inc_by(n);
            }
        }
    }

    /// Decide synchronously (the memory store never waits).
    pub fn check_now(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError> {
        let key = self.hash(bucket);
        let mut guard = self.lock(Self::shard_of(key));
        let shard = &mut *guard;
        // The clock is read under the shard lock, so decisions on one bucket see increasing
        // times; clamped to the newest entry like the Lua script's max(TIME, newest).
        let mut now = self.now_us();
        let mut rng = fastrand::Rng::with_seed(key ^ now);
        let slot = match shard.index.get(&key) {
            Some(&i) => i as usize,
            None => {
                let need = BUCKET_COST + 16 * limits.len();
                let evicted = shard
                    .make_room(need, self.shard_budget, key, now, &mut rng)
                    .map_err(|()| StoreError::Full)?;
                self.count_evictions(evicted);
                shard.slots.push(Bucket {
                    key,
                    last_us: now,
                    logs: SmallVec::new(),
                });
                shard.bytes += BUCKET_COST;
                let i = shard.slots.len() - 1;
                shard.index.insert(key, i as u32);
                i
            }
        };
        now = now.max(shard.slots[slot].newest());
        // Growing a full log doubles its capacity: make room for that first.
        let grow: usize = {
            let b = &shard.slots[slot];
            limits
                .iter()
                .map(|l| match b.logs.iter().find(|g| g.id == l.id()) {
                    Some(g) if g.entries.len() == g.entries.capacity() => {
                        (g.entries.capacity().max(1) * 8).next_multiple_of(16)
                    }
                    Some(_) => 0,
                    None => 16,
                })
                .sum()
        };
        if grow > 0 && shard.bytes + grow > self.shard_budget {
            let evicted = shard
                .make_room(grow, self.shard_budget, key, now, &mut rng)
                .map_err(|()| StoreError::Full)?;
            self.count_evictions(evicted);
        }
        // Eviction may have moved this bucket (swap_remove): look it up again.
        let slot = shard.index[&key] as usize;
        let b = &mut shard.slots[slot];
        let before = b.cost();
        let verdict = Self::decide(b, limits, now);
        let after = b.cost();
        shard.bytes = shard.bytes - before + after;
        Ok(verdict)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn check(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError> {
        self.check_now(bucket, limits)
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        let key = self.hash(bucket);
        let shard = self.lock(Self::shard_of(key));
        let now = self.now_us();
        let to_unix = |t: u64| t + self.epoch_unix_us;
        // Reads only: nothing is evicted or recorded (eviction is the next check's job).
        let b = shard.index.get(&key).map(|&i| &shard.slots[i as usize]);
        let limits = limits
            .iter()
            .map(|limit| {
                let cutoff = now.saturating_sub(limit.window_us());
                let entries: Vec<u64> = b
                    .and_then(|b| b.logs.iter().find(|l| l.id == limit.id()))
                    .map(|log| {
                        log.entries
                            .iter()
                            .filter(|&&t| t > cutoff)
                            .map(|&t| to_unix(t))
                            .collect()
                    })
                    .unwrap_or_default();
                LimitView::from_entries(limit, &entries, to_unix(now))
            })
            .collect();
        Ok(WindowView {
            now_us: to_unix(now),
            limits,
        })
    }

    async fn reset(&self, bucket: &str, _limits: &[Limit]) -> Result<(), StoreError> {
        let key = self.hash(bucket);
        let mut shard = self.lock(Self::shard_of(key));
        if let Some(&i) = shard.index.get(&key) {
            shard.remove_at(i as usize);
        }
        Ok(())
    }

    fn sweep_expired(&self) {
        self.sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(requests: u32, ms: u64) -> [Limit; 1] {
        [Limit {
            requests,
            window: Duration::from_millis(ms),
        }]
    }

    #[test]
    fn full_store_evicts_spare_quota_never_clients_at_their_limit() {
        // 1 MiB: 16 KiB per shard, about 100 buckets each.
        let store = MemoryStore::with_max_memory(1 << 20);
        let limits = one(2, 60_000);
        // 500 clients at their limit (2 of 2).
        for i in 0..500 {
            let k = format!("full-{i}");
            assert!(store.check_now(&k, &limits).unwrap().admitted);
            assert!(store.check_now(&k, &limits).unwrap().admitted);
        }
        // A flood of made-up keys, one request each (spare quota): they evict each other.
        let mut full = 0;
        for i in 0..100_000 {
            match store.check_now(&format!("junk-{i}"), &limits) {
                Ok(v) => assert!(v.admitted),
                Err(StoreError::Full) => full += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(store.accounted_bytes() <= 1 << 20);
        assert!(store.evictions() > 90_000, "{}", store.evictions());
        // Every client at its limit is still there and still denied.
        for i in 0..500 {
            let v = store.check_now(&format!("full-{i}"), &limits).unwrap();
            assert!(!v.admitted, "full-{i} was evicted and got a fresh quota");
        }
        println!("full errors: {full}");
    }
}
