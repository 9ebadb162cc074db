//! One route's arena in the memory store: its own shards of buckets (so eviction only ever
//! samples this route's clients), each with the summary of what its evicted buckets still
//! count, and its share of `max_memory`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::record::LimitRecord;
use super::shard::{Admit, Bucket, Shard};
use super::summary::{Held, Summary, MAX_COUNT};
use super::SHARDS;
use crate::limiter::{Limit, LimitState, Verdict};
use crate::logs::state::{LimiterState, StateLog};

/// Where a decision was made: see [`Arena::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placed {
    /// In the client's own bucket.
    Own,
    /// In the shard's summary alone: not even one bucket fits in the shard's share.
    Summary,
}

/// One route's buckets and bounds.
pub(super) struct Arena {
    /// The route name (for the WARN lines and the overflow counter's label).
    name: Box<str>,
    shards: Box<[Mutex<Shard>]>,
    /// Bytes the largest shard summary reserves (each shard's budget leaves that much out).
    summary_bytes: AtomicUsize,
    /// This arena's share of `max_memory`, per shard, less the summary; the store sets it
    /// whenever the number of arenas changes.
    shard_budget: AtomicUsize,
    /// Decisions made in the summary alone.
    overflows: AtomicU64,
    /// `slidegate_memory_overflow_total` (passed in by the store, `None` in tests).
    overflow_counters: Option<prometheus::IntCounterVec>,
    /// This arena's series of it, resolved at the first such decision (an arena that never has
    /// one creates no series).
    overflow_counter: OnceLock<Option<prometheus::IntCounter>>,
    log: StateLog,
}

/// The shard of a key hash: its top bits.
pub(super) fn shard_of(key: u64) -> usize {
    (key >> (64 - SHARDS.trailing_zeros())) as usize
}

impl Arena {
    /// An empty arena named `name` holding at most `budget` bytes of buckets and summaries,
    /// counting its decisions made in a summary alone in `overflow_counters{route=name}`.
    pub(super) fn new(
        name: &str,
        budget: usize,
        overflow_counters: Option<prometheus::IntCounterVec>,
    ) -> Arena {
        let arena = Arena {
            name: name.into(),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::new(budget / SHARDS)))
                .collect(),
            summary_bytes: AtomicUsize::new(0),
            shard_budget: AtomicUsize::new(0),
            overflows: AtomicU64::new(0),
            overflow_counters,
            overflow_counter: OnceLock::new(),
            log: StateLog::default(),
        };
        arena.set_budget(budget);
        arena
    }

    /// Set this arena's share of `max_memory`, resizing its summaries to half of it (one
    /// already in use only shrinks). An arena holding more than its new share evicts into its
    /// summaries as new clients come.
    pub(super) fn set_budget(&self, budget: usize) {
        let mut summary = 0;
        self.each_shard(|s| {
            s.summary.resize_for(budget / SHARDS);
            summary = summary.max(s.summary.bytes());
        });
        self.summary_bytes.store(summary, Ordering::Relaxed);
        let per_shard = (budget / SHARDS).saturating_sub(summary);
        self.shard_budget.store(per_shard, Ordering::Relaxed);
    }

    /// Bytes held by the summaries of this arena (counted in its share).
    pub(super) fn summary_bytes(&self) -> usize {
        self.summary_bytes.load(Ordering::Relaxed) * SHARDS
    }

    /// This arena's share of `max_memory` for buckets (rounded down to whole shards).
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

    /// Hold `bucket` (read from the state file) if its key is not held yet and it fits in its
    /// shard's budget; false when it was left out.
    pub(super) fn restore(&self, bucket: Bucket) -> bool {
        let budget = self.shard_budget.load(Ordering::Relaxed);
        let mut shard = self.lock(shard_of(bucket.key));
        if shard.position(bucket.key).is_some() || shard.bytes + bucket.cost() > budget {
            return false;
        }
        shard.push(bucket);
        true
    }

    /// Decisions made in the summary alone so far.
    pub(super) fn overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }

    /// Decide one request of the client whose key hash is `key`, at `now()` (read under the
    /// shard lock), in its own bucket: a new bucket starts from what the summary still counts
    /// for it, and room is made by evicting other clients of this route into the summary.
    /// Only when the shard's share cannot hold even this one bucket is the request decided in
    /// the summary alone. A charge ([`Admit::Always`]) is recorded the same way, with no room
    /// check. Returns how many buckets were evicted too.
    pub(super) fn decide(
        &self,
        key: u64,
        limits: &[Limit],
        now: impl Fn() -> u64,
        admit: Admit,
    ) -> (Verdict, Placed, u64) {
        let budget = self.shard_budget.load(Ordering::Relaxed);
        let mut guard = self.lock(shard_of(key));
        let shard = &mut *guard;
        // The clock is read under the shard lock, so decisions on one bucket see increasing
        // times; clamped to the newest entry like the Lua script's max(TIME, newest).
        let mut now = now();
        let mut rng = fastrand::Rng::with_seed(key ^ now);
        let mut evicted = 0;
        let at = match shard.position(key) {
            Some(at) => at,
            None => {
                let mut b = Bucket::new(key, now);
                b.seed(&shard.summary, limits, now);
                match shard.make_room(b.cost() + 16 * limits.len(), budget, key, now, &mut rng) {
                    Ok(n) => evicted += n,
                    Err(()) => return self.in_summary(guard, (key, limits, admit), now, evicted),
                }
                shard.push(b)
            }
        };
        now = now.max(shard.buckets[at].newest());
        // Growing a full log doubles its capacity: make room for that first.
        let grow = shard.buckets[at].growth(limits);
        if grow > 0 && shard.bytes + grow > budget {
            match shard.make_room(grow, budget, key, now, &mut rng) {
                Ok(n) => evicted += n,
                // No one else to evict: a client at its limit is denied by its own log (which
                // records nothing and needs no room); any other goes into the summary itself.
                Err(()) if admit == Admit::Always || shard.buckets[at].admits(limits, now) => {
                    shard.buckets[at].summarise(&mut shard.summary, now);
                    shard.remove_at(at);
                    return self.in_summary(guard, (key, limits, admit), now, evicted + 1);
                }
                Err(()) => {}
            }
        }
        // Eviction may have moved this bucket (swap_remove): look it up again.
        let at = shard.position(key).expect("make_room never evicts `key`");
        let b = &mut shard.buckets[at];
        let before = b.cost();
        let verdict = b.decide(limits, now, admit);
        shard.bytes = shard.bytes - before + b.cost();
        drop(guard);
        self.log.note(&self.name, LimiterState::Normal);
        (verdict, Placed::Own, evicted)
    }

    /// Would one request of bucket `key` under `limits` be admitted at `now()`, and each
    /// limit's state as it stands? Records nothing and evicts no other client: a look before a
    /// stacked decision reserves anything (see `MemoryStore::check_stacked`).
    pub(super) fn peek(
        &self,
        key: u64,
        limits: &[Limit],
        now: impl Fn() -> u64,
    ) -> (bool, Vec<LimitState>) {
        let mut guard = self.lock(shard_of(key));
        let shard = &mut *guard;
        let now = now();
        let Some(at) = shard.position(key) else {
            let mut b = Bucket::new(key, now);
            b.seed(&shard.summary, limits, now);
            return b.peek(limits, now);
        };
        let b = &mut shard.buckets[at];
        let now = now.max(b.newest());
        let before = b.cost();
        let peeked = b.peek(limits, now);
        shard.bytes = shard.bytes - before + b.cost();
        peeked
    }

    /// Give back the admission of bucket `key` recorded at `at` (see [`Bucket::refund`]).
    pub(super) fn refund(&self, key: u64, limits: &[Limit], at: u64) {
        let mut shard = self.lock(shard_of(key));
        if let Some(i) = shard.position(key) {
            shard.buckets[i].refund(limits, at);
        }
    }

    /// Renew the lease of bucket `key` in `limit` recorded at `at` (see [`Bucket::renew`]), at
    /// `now()` read under the shard lock and never before the bucket's newest entry.
    pub(super) fn renew(&self, key: u64, limit: &Limit, at: u64, now: impl Fn() -> u64) -> u64 {
        let mut shard = self.lock(shard_of(key));
        let Some(i) = shard.position(key) else {
            return 0;
        };
        let bucket = &mut shard.buckets[i];
        let now = now().max(bucket.newest());
        bucket.renew(limit, at, now)
    }

    /// Decide in the shard's summary alone, counted and logged.
    fn in_summary(
        &self,
        mut shard: MutexGuard<'_, Shard>,
        (key, limits, admit): (u64, &[Limit], Admit),
        now: u64,
        evicted: u64,
    ) -> (Verdict, Placed, u64) {
        let verdict = decide_in_summary(&mut shard.summary, (key, limits), now, admit);
        drop(shard);
        self.overflows.fetch_add(1, Ordering::Relaxed);
        let counter = self.overflow_counter.get_or_init(|| {
            let counters = self.overflow_counters.as_ref()?;
            Some(counters.with_label_values(&[&self.name]))
        });
        if let Some(c) = counter {
            c.inc();
        }
        self.log.note(&self.name, LimiterState::Overflow);
        (verdict, Placed::Summary, evicted)
    }
}

/// The sliding-window decision on the summary's figures alone: admitted only if every limit
/// counts fewer than its `requests` (a charge, [`Admit::Always`]: whatever they count), and
/// then recorded as one more entry held until it leaves (so the summary still bounds the
/// client from above). No admission there can be given back.
pub(super) fn decide_in_summary(
    summary: &mut Summary,
    (key, limits): (u64, &[Limit]),
    now: u64,
    admit: Admit,
) -> Verdict {
    let held: Vec<Held> = limits
        .iter()
        .map(|l| summary.held(key, l.id(), now))
        .collect();
    let admitted = admit == Admit::Always
        || (limits.iter().zip(&held))
            .all(|(l, h)| super::shard::fits(l, h.count) && h.count < MAX_COUNT);
    let states = limits
        .iter()
        .zip(held)
        .map(|(limit, mut h)| {
            if admitted {
                h = Held {
                    count: (h.count + u64::from(limit.weight)).min(MAX_COUNT),
                    frees_us: h
                        .frees_us
                        .max(LimitRecord::frees_if_recorded(limit.id(), now)),
                };
                summary.record(key, limit.id(), h, now);
            }
            let reset_us = match h.count {
                0 => limit.id().window_us(),
                _ => h.frees_us.saturating_sub(now).max(1),
            };
            LimitState {
                remaining: super::shard::remaining(limit, h.count, admitted),
                reset: Duration::from_micros(reset_us),
            }
        })
        .collect();
    Verdict {
        admitted,
        states,
        recorded_at: None,
        recorded_each: Vec::new(),
    }
}

#[cfg(test)]
#[path = "arena_tests.rs"]
mod tests;
