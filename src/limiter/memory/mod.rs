//! In-process store: exact within one process, sharded (no global lock on the hot path), and
//! bounded twice: buckets whose every log has slid out of its window are swept away, and the
//! store's own accounting of buckets and entries never exceeds `max_memory`, divided into one
//! arena per route so that one route's clients cannot take another route's arena.
//!
//! It has exactly the semantics of the Redis script, so the conformance suite runs against
//! both; it is the default store for single-instance deployments and tests.
//!
//! **Layout.** Each route has an arena (`arena.rs`) of its own. A bucket key (route + client,
//! up to ~100 bytes) is hashed to a `u64` with xxh3 under a per-process random seed, and never
//! stored: the top bits pick one of the arena's [`SHARDS`] shards, each a mutex over a
//! list of buckets in fixed-size chunks (so a random bucket can be sampled for eviction in O(1),
//! and growth never copies nor leaves freed buffers behind: `chunks.rs`) and an index of their
//! positions keyed by the bucket's own key (4 bytes an entry). A bucket is the hash, its newest
//! activity and one log per limit (found by its `LimitId`) held inline (`SmallVec`), each its kind's record (`record.rs`, holding a
//! [`KindRecord`](crate::limiter::algo::KindRecord): a `VecDeque` of microsecond timestamps for a log,
//! slot counters for a slotted limit), decided by that kind's rules on the store's
//! [`Clock`]. Two
//! different keys with the same 64-bit hash would share one bucket, which is stricter for both,
//! never looser; with a secret seed a client cannot aim for that.
//!
//! **Arenas.** `max_memory` is divided equally among the arenas: the routes given to
//! [`MemoryStore::with_routes`] (the limited routes of the config) and any other route the
//! first time it decides (a reload that adds one; then every share shrinks, and an arena that
//! holds more than its new share evicts into its summaries as new clients come, while its
//! summaries shrink with the share at once, by folding).
//! The store learns a decision's route from [`Store::check`], never from the bucket text.
//! Arenas of routes a reload removed stay until the process restarts.
//!
//! **Bound.** Each shard of an arena has its share / [`SHARDS`] bytes: at most half of it
//! (a power of two of 8-byte cells, at most 128 KiB; sized with the share, and once in use
//! only ever shrunk) for its *summary*
//! (`summary.rs`), the rest for [`BUCKET_COST`] per bucket plus the capacity of its logs. A
//! request that needs more than is left first evicts other buckets of the same arena: sample
//! up to [`EVICTION_SAMPLES`] buckets, drop their expired entries, and evict one that counts
//! nothing any more, else one that counts a single request, else the one idle longest
//! (`shard::Trace`).
//!
//! **Summary.** Eviction never under-counts (issue 32): what an evicted bucket still counts
//! goes into its shard's summary, a count-min style sketch that keeps, per hashed cell (four
//! rows, keyed by the bucket's hash and the limit), the largest count still inside its window
//! and when it frees. A bucket made fresh starts from the summary's figure (the minimum over
//! its cells), materialised as entries (or a slot's count) that leave when that figure frees,
//! so the exact log and slot rules decide from there: a client evicted mid-window comes back
//! to at least its count, never to a fresh quota, and stays at it until at most its newest
//! evicted entry leaves. A colliding client can only be over-counted (measured in
//! `docs/hardening.md`). So any client may be evicted, those at their limit too: a
//! key-rotation flood evicts its own made-up keys into the summary, and a new honest client
//! of the flooded route gets its own bucket, held back only where all four of its cells were
//! hit by larger counts.
//!
//! *The trade-off.* nginx's `limit_req_zone` answers 503 to every new client once its zone is
//! full; forgetting an evicted client (what this store did before) hands it a fresh quota; a
//! shared overflow bucket for new clients (what it did next) refused new honest clients for as
//! long as a flood lasted. The summary does none of these, at the price of over-counting a
//! client whose cells all collide with heavier ones, which grows with the number of buckets a
//! flood pushes through the summary within one window (the sketch saturates when that is many
//! times its width: new clients are then held back much as the overflow bucket held them).
//!
//! **Summary decisions.** Only when a shard's share cannot hold even the client's own bucket
//! (a tiny share: many routes in a small `max_memory`) is a request decided in the summary
//! alone: admitted if every limit's figure is below its `requests`, and then recorded there as
//! one more entry. These decisions are counted in `slidegate_memory_overflow_total{route}` and
//! logged (one WARN line per change of state, at most one per route per 10 s).
//!
//! *Not kept across eviction:* a refund of an admission whose bucket was evicted since (the
//! entry stays counted), and an admin reset of a client evicted earlier in its window (the
//! reset clears its held bucket; what the summary holds frees on its own).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;

use super::algo::clock::{Clock, MonotonicClock};
use super::buckets::time_of;
use super::{
    Admission, Buckets, Checked, Limit, LimitView, Store, StoreError, Unit, Verdict, WindowView,
};
use arena::{shard_of, Arena};
use shard::{Admit, Bucket};
use smallvec::SmallVec;

mod arena;
mod chunks;
pub mod persist;
mod record;
mod seen;
mod shard;
mod stacked;
mod summary;

/// Number of shards of an arena (a power of two); the top bits of a key's hash pick its shard.
pub const SHARDS: usize = 64;

/// Buckets sampled per eviction attempt.
pub const EVICTION_SAMPLES: usize = 16;

/// Accounted bytes per bucket besides its entries: the bucket itself and its index entry (a
/// 4-byte position and hashbrown's 1-byte tag) at hashbrown's lowest load factor, 7/16.
pub const BUCKET_COST: usize = std::mem::size_of::<Bucket>() + 12;

/// Default `max_memory`: 256 MiB.
pub const DEFAULT_MAX_MEMORY: u64 = 256 << 20;

/// The arena of decisions asked without a route ([`MemoryStore::check_now`]).
const UNROUTED: &str = "";

type Arenas = HashMap<Box<str>, Arc<Arena>>;

/// The in-process sliding-window-log store.
pub struct MemoryStore {
    /// Read on every decision without a lock; replaced whole (under `adding`) for a new route.
    arenas: ArcSwap<Arenas>,
    adding: Mutex<()>,
    max_memory: u64,
    /// The key hash's seed: random, or the one of the state file a restart read
    /// ([`persist`]); set before any decision.
    seed: AtomicU64,
    /// Every decision's `now` (read once, under the bucket's shard lock).
    clock: Arc<dyn Clock>,
    /// Wall-clock time of the clock's 0, µs since the Unix epoch: the inspector shows
    /// timestamps on a clock people can read, while decisions stay on the monotonic one.
    epoch_unix_us: u64,
    evictions: AtomicU64,
    eviction_counter: Option<prometheus::IntCounter>,
    /// `slidegate_memory_overflow_total`, handed to every arena made after it is set.
    overflow_counters: Option<prometheus::IntCounterVec>,
}

/// The wall-clock time (µs since the Unix epoch) of `clock`'s 0, as it reads now: the
/// inspector's timestamps (a [`MonotonicClock`] reads the wall clock from its start, a fake one
/// wherever a test put it).
fn unix_at_zero(clock: &dyn Clock) -> u64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    wall.saturating_sub(clock.now_us())
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
            arenas: ArcSwap::default(),
            adding: Mutex::new(()),
            max_memory,
            seed: AtomicU64::new(fastrand::u64(..)),
            clock: Arc::new(MonotonicClock::new()),
            epoch_unix_us: unix_at_zero(&MonotonicClock::new()),
            evictions: AtomicU64::new(0),
            eviction_counter: None,
            overflow_counters: None,
        }
    }

    /// Give each of `routes` its arena (an equal share of `max_memory`) from the start, so that a
    /// flood on one route before another's first request cannot take that route's arena.
    pub fn with_routes<'a>(self, routes: impl IntoIterator<Item = &'a str>) -> Self {
        for route in routes {
            self.arena(route);
        }
        self
    }

    /// Count the decisions each arena makes in a summary alone in `counters{route}`
    /// (`slidegate_memory_overflow_total`). Before [`MemoryStore::with_routes`]: only arenas
    /// made after this count.
    pub fn with_overflow_counter(mut self, counters: prometheus::IntCounterVec) -> Self {
        self.overflow_counters = Some(counters);
        self
    }

    /// Decide on `clock` instead of the process's monotonic clock (tests: a
    /// [`FakeClock`](crate::limiter::algo::clock::FakeClock), so windows pass without sleeps).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.epoch_unix_us = unix_at_zero(&clock);
        self.clock = Arc::new(clock);
        self
    }

    /// Also count evictions in `counter` (`slidegate_store_evictions_total`).
    pub fn with_eviction_counter(mut self, counter: prometheus::IntCounter) -> Self {
        self.eviction_counter = Some(counter);
        self
    }

    /// Microseconds on the store's clock (never 0).
    fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    fn hash(&self, bucket: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(bucket.as_bytes(), self.seed.load(Ordering::Relaxed))
    }

    /// The arena of `route`, made (and every share resized) the first time it is seen.
    fn arena(&self, route: &str) -> Arc<Arena> {
        if let Some(arena) = self.arenas.load().get(route) {
            return arena.clone();
        }
        let _adding = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        let mut arenas = Arenas::clone(&self.arenas.load());
        let n = arenas.len() + usize::from(!arenas.contains_key(route));
        let share = share(self.max_memory, n);
        let arena = arenas
            .entry(route.into())
            .or_insert_with(|| {
                let counters = self.overflow_counters.clone();
                Arc::new(Arena::new(route, share, counters))
            })
            .clone();
        for r in arenas.values() {
            r.set_budget(share);
        }
        self.arenas.store(Arc::new(arenas));
        arena
    }

    /// Every arena, one at a time.
    fn each_arena(&self, mut f: impl FnMut(&Arena)) {
        for arena in self.arenas.load().values() {
            f(arena);
        }
    }

    /// Every shard of every arena, one at a time.
    fn each_shard(&self, mut f: impl FnMut(&mut shard::Shard)) {
        self.each_arena(|arena| arena.each_shard(&mut f));
    }

    /// Number of buckets currently held.
    pub fn len(&self) -> usize {
        let mut n = 0;
        self.each_shard(|s| n += s.buckets.len());
        n
    }

    /// True when no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total recorded entries over all held buckets and limits (not what the summaries hold).
    pub fn entries(&self) -> usize {
        let mut n = 0;
        self.each_shard(|s| {
            n += s
                .buckets
                .iter()
                .map(|b| b.logs.iter().map(|l| l.count() as usize).sum::<usize>())
                .sum::<usize>()
        });
        n
    }

    /// The store's own accounting of its arenas' buckets, in bytes; with
    /// [`MemoryStore::summary_bytes`] it stays within `max_memory`.
    pub fn accounted_bytes(&self) -> usize {
        let mut n = 0;
        self.each_shard(|s| n += s.bytes);
        n
    }

    /// Bytes reserved by the arenas' summaries of evicted buckets (part of `max_memory`).
    pub fn summary_bytes(&self) -> usize {
        let mut n = 0;
        self.each_arena(|r| n += r.summary_bytes());
        n
    }

    /// Buckets evicted so far to stay within `max_memory`.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Decisions of `route` made in a summary alone so far, because not even the client's own
    /// bucket fitted (0 for a route never seen).
    pub fn overflows(&self, route: &str) -> u64 {
        self.arenas.load().get(route).map_or(0, |r| r.overflows())
    }

    /// Evict expired entries everywhere and drop buckets with nothing left, so a million
    /// one-off clients do not stay in memory. Each shard is locked only while it is swept.
    pub fn sweep(&self) {
        self.each_shard(|shard| shard.sweep(self.now_us()));
    }

    /// Decide synchronously (the memory store never waits), for a caller that knows no route:
    /// every such decision shares one arena.
    pub fn check_now(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError> {
        Ok(self.check_now_in(UNROUTED, bucket, limits))
    }

    /// Decide synchronously for `bucket` of `route`, in the route's arena (see the module doc).
    pub fn check_now_in(&self, route: &str, bucket: &str, limits: &[Limit]) -> Verdict {
        self.enter(route, bucket, limits, Admit::IfRoom)
    }

    /// Charge each of `limits` its weight now, with no room check (a cost settled higher than
    /// charged): in the slot of now, not the admission's, which a response longer than the
    /// window has seen leave; a bucket evicted meanwhile comes back for it.
    /// Only cost limits take a charge; the others count requests.
    pub(super) fn charge_now(&self, route: &str, bucket: &str, limits: &[Limit]) {
        let cost = |l: &&Limit| l.unit() == Unit::Cost;
        let limits: SmallVec<[Limit; 2]> = limits.iter().filter(cost).copied().collect();
        if !limits.is_empty() {
            self.enter(route, bucket, &limits, Admit::Always);
        }
    }

    /// Decide (or charge) in the route's arena, counting what that evicted.
    fn enter(&self, route: &str, bucket: &str, limits: &[Limit], admit: Admit) -> Verdict {
        let key = self.hash(bucket);
        let now = || self.now_us();
        // The arena is looked up without taking a reference count when it exists.
        let (verdict, _placed, evicted) = match self.arenas.load().get(route) {
            Some(arena) => arena.decide(key, limits, now, admit),
            None => self.arena(route).decide(key, limits, now, admit),
        };
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
            if let Some(c) = &self.eviction_counter {
                c.inc_by(evicted);
            }
        }
        verdict
    }
}

/// An arena's share of `max_memory` when there are `arenas` of them.
fn share(max_memory: u64, arenas: usize) -> usize {
    (max_memory / arenas.max(1) as u64) as usize
}

#[async_trait]
impl Store for MemoryStore {
    async fn check(&self, route: &str, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked {
        if buckets.is_one() {
            return Ok(self.check_now_in(route, buckets.first(), limits));
        }
        Ok(self.check_stacked(route, buckets, limits))
    }

    /// One process: no system outside it writes here.
    async fn read_shared(&self, _: &str, _: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        let key = self.hash(bucket);
        let now = self.now_us();
        let to_unix = |t: u64| t + self.epoch_unix_us;
        // The inspector names no route: look in every arena (a bucket key names its route, so
        // one arena at most holds it). Reads only: nothing is evicted or recorded (eviction is
        // the next check's job).
        let mut found: Option<Vec<LimitView>> = None;
        self.each_arena(|arena| {
            let shard = arena.lock(shard_of(key));
            let Some(b) = shard.get(key) else {
                return;
            };
            let views =
                limits
                    .iter()
                    .map(|limit| match b.logs.iter().find(|l| l.id == limit.id()) {
                        Some(log) => log.view(limit, now, to_unix),
                        None => LimitView::from_entries(limit, &[], to_unix(now)),
                    });
            found.get_or_insert_with(|| views.collect());
        });
        let limits = found.unwrap_or_else(|| {
            let empty = |limit| LimitView::from_entries(limit, &[], to_unix(now));
            limits.iter().map(empty).collect()
        });
        Ok(WindowView {
            now_us: to_unix(now),
            limits,
        })
    }

    async fn refund(&self, admission: Admission<'_>) -> Result<(), StoreError> {
        let change = admission.change;
        let (route, buckets, limits, recorded_at) = admission.parts();
        if buckets.is_one() && recorded_at.len() <= 1 {
            let at = time_of(recorded_at, 0);
            self.refund_now((route, buckets.first()), limits, at, change);
            return Ok(());
        }
        for (bucket, members) in buckets.groups(limits.len()) {
            for &i in &members {
                let at = time_of(recorded_at, i);
                let limit = std::slice::from_ref(&limits[i]);
                self.refund_now((route, bucket), limit, at, change);
            }
        }
        Ok(())
    }

    async fn renew(&self, admission: Admission<'_>) -> Result<Vec<u64>, StoreError> {
        let (route, buckets, limits, recorded_at) = admission.parts();
        Ok(self.renew_now(route, buckets, limits, recorded_at))
    }

    async fn reset(&self, bucket: &str, _limits: &[Limit]) -> Result<(), StoreError> {
        let key = self.hash(bucket);
        self.each_arena(|arena| {
            let mut shard = arena.lock(shard_of(key));
            if let Some(i) = shard.position(key) {
                shard.remove_at(i);
            }
        });
        Ok(())
    }

    fn sweep_expired(&self) {
        self.sweep();
    }
}

#[cfg(test)]
mod tests;
