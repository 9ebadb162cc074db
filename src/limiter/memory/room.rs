//! One route's room in the memory store: its own shards of buckets (so eviction only ever
//! samples this route's clients), its share of `max_memory`, and its overflow bucket, where new
//! clients are decided while the room is full of clients at their limit.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::shard::{Bucket, Shard};
use super::{BUCKET_COST, SHARDS};
use crate::limiter::{Limit, Verdict};
use crate::state_log::{LimiterState, StateLog};

/// Where a decision was made: see [`Room::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placed {
    /// In the client's own bucket.
    Own,
    /// In the route's overflow bucket: no room for the client's own bucket.
    Overflow,
}

/// One route's buckets and bounds.
pub(super) struct Room {
    /// The route name (for the WARN lines and the overflow counter's label).
    name: Box<str>,
    shards: Box<[Mutex<Shard>]>,
    /// This room's share of `max_memory`, per shard; the store sets it whenever the number of
    /// rooms changes.
    shard_budget: AtomicUsize,
    /// Shared by every client that finds no room: never evicted, never refused, so a decision
    /// can always be recorded. Its logs hold at most the route's `requests` per limit (a denied
    /// request records nothing), which bounds it outside the share.
    overflow: Mutex<Bucket>,
    overflows: AtomicU64,
    /// `slidegate_memory_overflow_total{route}`, resolved at the first overflow (a room that
    /// never overflows creates no series).
    overflow_counter: OnceLock<prometheus::IntCounter>,
    log: StateLog,
}

/// The shard of a key hash: its top bits.
pub(super) fn shard_of(key: u64) -> usize {
    (key >> (64 - SHARDS.trailing_zeros())) as usize
}

impl Room {
    /// An empty room named `name` holding at most `budget` bytes of buckets.
    pub(super) fn new(name: &str, budget: usize) -> Room {
        Room {
            name: name.into(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_budget: AtomicUsize::new(budget / SHARDS),
            overflow: Mutex::new(Bucket::new(0, 0)),
            overflows: AtomicU64::new(0),
            overflow_counter: OnceLock::new(),
            log: StateLog::default(),
        }
    }

    /// Set this room's share of `max_memory`. A room already holding more keeps it (clients at
    /// their limit are never evicted) but takes no new client until it is back under.
    pub(super) fn set_budget(&self, budget: usize) {
        self.shard_budget.store(budget / SHARDS, Ordering::Relaxed);
    }

    /// This room's share of `max_memory` (rounded down to whole shards).
    #[cfg(test)]
    pub(super) fn budget(&self) -> usize {
        self.shard_budget.load(Ordering::Relaxed) * SHARDS
    }

    pub(super) fn lock(&self, i: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding a shard cannot leave it inconsistent in a way that matters
        // more than losing the whole store: keep serving.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every shard, one at a time.
    pub(super) fn each_shard(&self, mut f: impl FnMut(&mut Shard)) {
        for i in 0..SHARDS {
            f(&mut self.lock(i));
        }
    }

    /// Decisions made in the overflow bucket so far.
    pub(super) fn overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }

    /// Decide one request of the client whose key hash is `key`, at `now()` (read under the
    /// shard lock). In its own bucket when there is room for it (evicting this route's
    /// clients with spare quota if needed), else in the overflow bucket: a client that is
    /// already at its limit in its own bucket is denied by it, any other shares the overflow
    /// bucket with the route's limits. Returns how many buckets were evicted too.
    pub(super) fn decide(
        &self,
        key: u64,
        limits: &[Limit],
        now: impl Fn() -> u64,
    ) -> (Verdict, Placed, u64) {
        let budget = self.shard_budget.load(Ordering::Relaxed);
        let mut guard = self.lock(shard_of(key));
        let shard = &mut *guard;
        // The clock is read under the shard lock, so decisions on one bucket see increasing
        // times; clamped to the newest entry like the Lua script's max(TIME, newest).
        let mut now = now();
        let mut rng = fastrand::Rng::with_seed(key ^ now);
        let mut evicted = 0;
        if !shard.index.contains_key(&key) {
            let need = BUCKET_COST + 16 * limits.len();
            match shard.make_room(need, budget, key, now, &mut rng) {
                Ok(n) => evicted += n,
                Err(()) => {
                    drop(guard);
                    return (self.overflow(limits, now), Placed::Overflow, 0);
                }
            }
            shard.push(Bucket::new(key, now));
        }
        let slot = shard.index[&key] as usize;
        now = now.max(shard.slots[slot].newest());
        // Growing a full log doubles its capacity: make room for that first.
        let grow = shard.slots[slot].growth(limits);
        if grow > 0 && shard.bytes + grow > budget {
            match shard.make_room(grow, budget, key, now, &mut rng) {
                Ok(n) => evicted += n,
                // No room to record: a client at its limit is denied by its own log (which
                // records nothing and needs no room); any other is decided in the overflow.
                Err(()) if shard.slots[slot].admits(limits, now) => {
                    drop(guard);
                    return (self.overflow(limits, now), Placed::Overflow, evicted);
                }
                Err(()) => {}
            }
        }
        // Eviction may have moved this bucket (swap_remove): look it up again.
        let slot = shard.index[&key] as usize;
        let b = &mut shard.slots[slot];
        let before = b.cost();
        let verdict = b.decide(limits, now);
        shard.bytes = shard.bytes - before + b.cost();
        drop(guard);
        self.log.note(&self.name, LimiterState::Normal);
        (verdict, Placed::Own, evicted)
    }

    /// Give back the admission of bucket `key` recorded at `at` (see [`Bucket::refund`]).
    pub(super) fn refund(&self, key: u64, limits: &[Limit], at: u64) {
        let mut shard = self.lock(shard_of(key));
        if let Some(&slot) = shard.index.get(&key) {
            shard.slots[slot as usize].refund(limits, at);
        }
    }

    /// Decide in the overflow bucket, counted and logged.
    fn overflow(&self, limits: &[Limit], now: u64) -> Verdict {
        let verdict = {
            let mut b = self.overflow.lock().unwrap_or_else(|e| e.into_inner());
            let now = now.max(b.newest());
            let mut verdict = b.decide(limits, now);
            // Shared by every overflowing client: no admission there is any one's to give back.
            verdict.recorded_at = None;
            verdict
        };
        self.overflows.fetch_add(1, Ordering::Relaxed);
        self.overflow_counter
            .get_or_init(|| {
                crate::metrics::METRICS
                    .memory_overflow
                    .with_label_values(&[&self.name])
            })
            .inc();
        self.log.note(&self.name, LimiterState::Overflow);
        verdict
    }

    /// Entries recorded in the overflow bucket (expired ones included until its next decision).
    pub(super) fn overflow_entries(&self) -> usize {
        let b = self.overflow.lock().unwrap_or_else(|e| e.into_inner());
        b.logs.iter().map(|l| l.count() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    const HOUR: [Limit; 1] = [Limit::log(2, Duration::from_secs(3600))];

    /// Bytes of a bucket holding two entries (a `VecDeque` of capacity 4).
    const TWO: usize = BUCKET_COST + 32;

    /// A room of `shard` bytes per shard; small keys all land in shard 0. The clock ticks a
    /// microsecond per decision.
    fn room(shard: usize) -> (Room, impl Fn() -> u64) {
        let room = Room::new("r", shard * SHARDS);
        let t = Cell::new(1);
        (room, move || {
            t.set(t.get() + 1);
            t.get()
        })
    }

    #[test]
    fn new_clients_share_one_overflow_bucket_once_the_room_is_full_at_the_limit() {
        let (room, now) = room(3 * TWO);
        for key in 1..=3 {
            for _ in 0..2 {
                let (v, placed, _) = room.decide(key, &HOUR, &now);
                assert_eq!((v.admitted, placed), (true, Placed::Own), "key {key}");
            }
        }
        // Full of clients at their limit: nobody to evict. New clients share one quota.
        let got: Vec<_> = (4..=7)
            .map(|key| {
                let (v, placed, evicted) = room.decide(key, &HOUR, &now);
                assert_eq!((placed, evicted), (Placed::Overflow, 0));
                v.admitted
            })
            .collect();
        assert_eq!(got, [true, true, false, false]);
        assert_eq!(room.overflows(), 4);
        assert_eq!(room.overflow_entries(), 2);
        // A held client at its limit is still denied by its own log.
        let (v, placed, _) = room.decide(1, &HOUR, &now);
        assert_eq!((v.admitted, placed), (false, Placed::Own));
    }

    #[test]
    fn spare_quota_is_evicted_before_anyone_overflows() {
        let (room, now) = room(3 * TWO);
        for key in 1..=3 {
            room.decide(key, &HOUR, &now);
        }
        let (v, placed, evicted) = room.decide(4, &HOUR, &now);
        assert_eq!((v.admitted, placed, evicted), (true, Placed::Own, 1));
        assert_eq!(room.overflows(), 0);
    }

    #[test]
    fn a_held_client_that_cannot_grow_is_decided_in_the_overflow_with_its_own_limit() {
        // Room for two full buckets and one with a single entry, not for its growth.
        let (room, now) = room(3 * TWO - 16);
        for key in 1..=2 {
            room.decide(key, &HOUR, &now);
            room.decide(key, &HOUR, &now);
        }
        // Key 3 holds one entry; the room cannot grow its log and has no one to evict.
        let (v, placed, _) = room.decide(3, &HOUR, &now);
        assert_eq!((v.admitted, placed), (true, Placed::Own));
        let room_full = room.decide(3, &HOUR, &now);
        assert_eq!(
            (room_full.0.admitted, room_full.1),
            (true, Placed::Overflow)
        );
        // Recorded in the overflow bucket, which now decides for it too.
        assert_eq!(room.overflow_entries(), 1);
        assert!(room.decide(3, &HOUR, &now).0.admitted);
        let (v, placed, _) = room.decide(3, &HOUR, &now);
        assert_eq!((v.admitted, placed), (false, Placed::Overflow));
    }
}
