//! From the store's buckets to a [`Snapshot`] and back.
//!
//! **Time.** The store's clock is the wall clock at the process's start, running at the
//! monotonic pace since (`algo::clock`), so an entry's time already means the same moment to
//! the next process, but for the writer's drift (a wall clock stepped while it ran) and the
//! time the proxy was down. The file records the writer's clock and the wall clock at the
//! write; the reader keeps every step's *age*: age at the write plus the wall-clock time since
//! (never negative: a wall clock set back counts as no time down). A step whose window has
//! passed by then is dropped. A slot lands in the reader's slot of its last µs, so it frees at
//! most one slot later than it would have, never earlier.

use std::time::{SystemTime, UNIX_EPOCH};

use super::format::{self, ArenaState, BucketState, LimitState, Snapshot};
use super::{Loaded, Saved};
use crate::limiter::algo::Kind;
use crate::limiter::memory::record::LimitRecord;
use crate::limiter::memory::shard::Bucket;
use crate::limiter::memory::MemoryStore;
use crate::limiter::LimitId;

/// µs since the Unix epoch now.
pub(super) fn wall_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How full a bucket is: its fullest limit's count per million of `requests`.
fn fullness(count: u64, requests: u32) -> u64 {
    count.saturating_mul(1_000_000) / u64::from(requests.max(1))
}

/// The store's windows as they stand, at most `max_bytes` encoded: the fullest buckets first
/// (a client at its limit is what a restart must not forget), the rest left out and counted.
pub(super) fn take_snapshot(store: &MemoryStore, max_bytes: usize) -> (Snapshot, Saved) {
    let now = store.now_us();
    let arenas = store.arenas.load();
    let mut names: Vec<&str> = arenas.keys().map(|k| &**k).collect();
    names.sort_unstable();
    // (arena, fullness, bucket) of every bucket that still counts something.
    let mut all: Vec<(usize, u64, BucketState)> = Vec::new();
    for (r, name) in names.iter().enumerate() {
        arenas[*name].each_shard(|shard| {
            for i in 0..shard.buckets.len() {
                let b = &mut shard.buckets[i];
                let mut full = 0;
                let mut limits = Vec::new();
                for log in &mut b.logs {
                    log.evict(now);
                    let steps = log.persisted();
                    if steps.is_empty() {
                        continue;
                    }
                    full = full.max(fullness(log.count(), log.requests));
                    let id = log.id.to_string();
                    limits.push(LimitState { id, steps });
                }
                if !limits.is_empty() {
                    all.push((r, full, BucketState { key: b.key, limits }));
                }
            }
        });
    }
    all.sort_by_key(|b| std::cmp::Reverse(b.1));
    let mut size = format::EMPTY_LEN
        + names
            .iter()
            .map(|n| format::arena_overhead(n))
            .sum::<usize>();
    let mut out: Vec<ArenaState> = (names.iter())
        .map(|n| ArenaState {
            route: n.to_string(),
            buckets: Vec::new(),
        })
        .collect();
    let mut saved = Saved::default();
    for (r, _, b) in all {
        let steps: usize = b.limits.iter().map(|l| l.steps.len()).sum();
        let len = b.encoded_len();
        if size + len > max_bytes {
            saved.dropped_buckets += 1;
            continue;
        }
        size += len;
        saved.buckets += 1;
        saved.steps += steps;
        out[r].buckets.push(b);
    }
    out.retain(|r| !r.buckets.is_empty());
    let snapshot = Snapshot {
        wall_us: wall_now_us(),
        clock_us: now,
        seed: store.seed.load(std::sync::atomic::Ordering::Relaxed),
        arenas: out,
    };
    (snapshot, saved)
}

/// Put `snapshot`'s windows into `store` (which has made no decision yet), under its seed,
/// each limit found by its route and id through `ids`; what is gone from the config, has
/// passed, or does not fit in `max_memory` is left out and counted. `wall_now_us` is the
/// wall clock now (µs since the Unix epoch).
pub(super) fn restore(
    store: &MemoryStore,
    snapshot: Snapshot,
    ids: &dyn Fn(&str, &str) -> Option<LimitId>,
    wall_now_us: u64,
) -> Loaded {
    store
        .seed
        .store(snapshot.seed, std::sync::atomic::Ordering::Relaxed);
    let now = store.now_us();
    let down = wall_now_us.saturating_sub(snapshot.wall_us);
    // Reader's clock minus writer's, for the same moment, less the time down.
    let delta = i128::from(now) - i128::from(snapshot.clock_us) - i128::from(down);
    let moved = |t: u64| i128::from(t) + delta;
    let arenas = store.arenas.load();
    let mut loaded = Loaded::default();
    for arena_state in snapshot.arenas {
        let Some(arena) = arenas.get(arena_state.route.as_str()) else {
            loaded.gone += arena_state.buckets.len();
            continue;
        };
        for b in arena_state.buckets {
            let mut bucket = Bucket::new(b.key, now);
            let mut newest = 0;
            let mut gone = false;
            for l in b.limits {
                let Some(id) = ids(&arena_state.route, &l.id) else {
                    gone = true;
                    continue;
                };
                if let Some(record) = replay(id, &l.steps, moved, now, &mut newest) {
                    bucket.logs.push(record);
                }
            }
            if bucket.logs.is_empty() {
                match gone {
                    true => loaded.gone += 1,
                    false => loaded.expired += 1,
                }
                continue;
            }
            bucket.last_us = newest.max(1);
            let steps: usize = bucket.logs.iter().map(|l| l.count() as usize).sum();
            if arena.restore(bucket) {
                loaded.buckets += 1;
                loaded.counted += steps;
            } else {
                loaded.full += 1;
            }
        }
    }
    loaded
}

/// The record of `id` from its steps on the writer's clock (`moved` to the reader's), or
/// `None` when nothing of it is still counted at `now`. Leases are never kept: see
/// [`RecordRules::persisted`](crate::limiter::algo::RecordRules::persisted).
fn replay(
    id: LimitId,
    steps: &[(u64, u32)],
    moved: impl Fn(u64) -> i128,
    now: u64,
    newest: &mut u64,
) -> Option<LimitRecord> {
    if id.kind().is_lease() {
        return None;
    }
    let mut record = LimitRecord::new(id);
    for &(t, amount) in steps {
        let frees = moved(id.kind().frees_if_recorded(id.window_us(), t));
        if frees <= i128::from(now) {
            continue;
        }
        let at = moved(t).clamp(1, i128::from(now)) as u64;
        record.push(at, amount);
        *newest = (*newest).max(at);
    }
    record.evict(now);
    (!record.is_empty()).then_some(record)
}
