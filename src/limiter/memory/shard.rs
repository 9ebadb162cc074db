//! The memory store's data and its pure decision: one shard (its buckets and an index that
//! finds one by key hash, with its byte accounting, its eviction and the summary of what evicted
//! buckets still count), a bucket (one log per window), a log.

use std::time::Duration;

use hashbrown::HashTable;
use smallvec::SmallVec;

use super::chunks::Chunks;
use super::record::LimitRecord;
use super::summary::{Summary, MAX_COUNT};
use super::{BUCKET_COST, EVICTION_SAMPLES};
use crate::limiter::algo::Kind;
use crate::limiter::{Limit, LimitId, LimitState, Verdict};

/// True when one more admission of `limit.weight` keeps `counted` within `requests` (for a
/// weight of 1: `counted < requests`).
pub(super) fn fits(limit: &Limit, counted: u64) -> bool {
    counted + u64::from(limit.weight) <= u64::from(limit.requests)
}

/// What a limit reports left after a decision: `requests - counted`, but 0 where a denied
/// request's weight did not fit (its Retry-After and violated policy are that limit's).
pub(super) fn remaining(limit: &Limit, counted: u64, admitted: bool) -> u32 {
    if !admitted && !fits(limit, counted) {
        return 0;
    }
    u64::from(limit.requests).saturating_sub(counted) as u32
}

/// The `requests` under which a kind's `reset` is the time until this decision's weight fits
/// (a weight of 1, or 0: `requests` itself), as the script's SLOTS computes it.
pub(super) fn room_for(limit: &Limit) -> u32 {
    (u64::from(limit.requests) + 1)
        .saturating_sub(u64::from(limit.weight.max(1)))
        .min(u64::from(u32::MAX)) as u32
}

/// Whether an entry needs room: a request's does; a charge (a cost settled higher than it was
/// charged, `settle`) is recorded whatever the limits hold, so the bucket may go into debt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// Recorded only if every limit has room: a request.
    IfRoom,
    /// Recorded with no room check: a charge.
    Always,
}

/// What evicting a bucket leaves in its shard's summary: the first key of the eviction order,
/// then the bucket idle longest. A bucket that counts nothing leaves no trace. One counted
/// request is summarised exactly and raises its cells to 1, which holds back no colliding
/// client with quota left, so the made-up keys of a one-request rotation flood go before a
/// client that came back (docs/hardening.md, eviction round 5: 17-31 of 800 new clients short
/// of their quota before, 2-9 after). A larger count raises its cells further (a client whose
/// four cells all hold its quota is refused); among such buckets the one idle longest goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Trace {
    /// Counts nothing any more.
    Nothing,
    /// Counts one request of weight 1 (its largest limit's count is 1).
    One,
    /// Counts more.
    More,
}

/// All logs of one bucket (route + client), keyed by [`LimitId`] (which leaves `requests` out)
/// so that a reload that only changes `requests` keeps the recorded entries.
#[derive(Debug)]
pub struct Bucket {
    pub(super) key: u64,
    /// Newest activity (µs): the eviction tie-breaker.
    pub(super) last_us: u64,
    pub(super) logs: SmallVec<[LimitRecord; 1]>,
}

impl Bucket {
    /// An empty bucket for the key hash `key`, last active at `now`.
    pub(super) fn new(key: u64, now: u64) -> Bucket {
        Bucket {
            key,
            last_us: now,
            logs: SmallVec::new(),
        }
    }

    /// The sliding-window decision (the Lua script's): evict, count, admit only if every limit
    /// has room (or `admit` is [`Admit::Always`]), and record in all logs or in none.
    pub(super) fn decide(&mut self, limits: &[Limit], now: u64, admit: Admit) -> Verdict {
        self.last_us = now;
        let admitted = self.admits(limits, now) || admit == Admit::Always;
        let states = limits
            .iter()
            .map(|limit| {
                let i = self.log_index(limit.id());
                let log = &mut self.logs[i];
                if admitted {
                    log.push(now, limit.weight);
                }
                let reset_us = log.reset_us(room_for(limit), now);
                LimitState {
                    remaining: remaining(limit, log.count(), admitted),
                    reset: Duration::from_micros(reset_us),
                }
            })
            .collect();
        Verdict {
            admitted,
            states,
            recorded_at: admitted.then_some(now),
            recorded_each: Vec::new(),
        }
    }

    /// The decision's look without recording: would every limit admit one request at `now`,
    /// and each limit's state as it stands (as a denial reports it).
    pub(super) fn peek(&mut self, limits: &[Limit], now: u64) -> (bool, Vec<LimitState>) {
        let admits = self.admits(limits, now);
        let states = limits
            .iter()
            .map(|limit| {
                let i = self.log_index(limit.id());
                let log = &self.logs[i];
                LimitState {
                    remaining: remaining(limit, log.count(), false),
                    reset: Duration::from_micros(log.reset_us(room_for(limit), now)),
                }
            })
            .collect();
        (admits, states)
    }

    /// Remove the entry recorded at `at` from the log of every limit in `limits` (the counted
    /// one of its slot for a slotted limit). Memory stays accounted as it was: capacity is
    /// kept, so the next push needs no room.
    pub(super) fn refund(&mut self, limits: &[Limit], at: u64) {
        for limit in limits {
            if let Some(log) = self.logs.iter_mut().find(|l| l.id == limit.id()) {
                log.refund(at, limit.weight);
            }
        }
    }

    /// Move the lease of `limit` recorded at `at` to `now` (see
    /// [`Store::renew`](crate::limiter::Store::renew)): `now`, or 0 when it has lapsed. Its log
    /// keeps its length, so its memory is as accounted.
    pub(super) fn renew(&mut self, limit: &Limit, at: u64, now: u64) -> u64 {
        let Some(log) = self.logs.iter_mut().find(|l| l.id == limit.id()) else {
            return 0;
        };
        log.evict(now);
        let held = log.count();
        log.refund(at, 1);
        if log.count() == held {
            return 0;
        }
        log.push(now, 1);
        self.last_us = now;
        now
    }

    /// Evict expired entries of every limit and tell whether all of them have room (recording
    /// nothing): pass 1 of [`Bucket::decide`].
    pub(super) fn admits(&mut self, limits: &[Limit], now: u64) -> bool {
        let mut admitted = true;
        for limit in limits {
            let i = self.log_index(limit.id());
            let log = &mut self.logs[i];
            log.requests = limit.requests;
            log.evict(now);
            admitted &= fits(limit, log.count());
        }
        admitted
    }

    pub(super) fn log_index(&mut self, id: LimitId) -> usize {
        match self.logs.iter().position(|l| l.id == id) {
            Some(i) => i,
            None => {
                self.logs.push(LimitRecord::new(id));
                self.logs.len() - 1
            }
        }
    }

    /// Bytes its logs grow by if `limits` record one more entry (see [`LimitRecord::growth`]).
    pub(super) fn growth(&self, limits: &[Limit]) -> usize {
        limits
            .iter()
            .map(|l| match self.logs.iter().find(|g| g.id == l.id()) {
                Some(g) => g.growth(),
                None => LimitRecord::new(l.id()).growth(),
            })
            .sum()
    }

    pub(super) fn cost(&self) -> usize {
        BUCKET_COST + self.logs.iter().map(LimitRecord::heap_bytes).sum::<usize>()
    }

    /// The newest recorded timestamp, so a decision's `now` never goes back in time.
    pub(super) fn newest(&self) -> u64 {
        self.logs
            .iter()
            .filter_map(LimitRecord::newest)
            .max()
            .unwrap_or(0)
    }

    /// Start a new bucket's logs of `limits` from what `summary` still counts for it (a
    /// client evicted earlier in its window comes back to its count, never a fresh quota).
    pub(super) fn seed(&mut self, summary: &Summary, limits: &[Limit], now: u64) {
        for limit in limits {
            let held = summary.held(self.key, limit.id(), now);
            if held.count > 0 {
                let i = self.log_index(limit.id());
                self.logs[i].seed(held, now);
            }
        }
    }

    /// After dropping expired entries: `None` if the bucket may not be evicted (a count too
    /// large for the summary's cells, or leases held: the summary keeps counts, not the leases
    /// a request's end gives back, so an evicted lease would lapse while its request is still
    /// at the upstream), else its rank: its [`Trace`], then its newest activity.
    pub(super) fn eviction_rank(&mut self, now: u64) -> Option<(Trace, u64)> {
        let mut largest = 0;
        for log in &mut self.logs {
            log.evict(now);
            let n = log.count();
            if n > MAX_COUNT || (n > 0 && log.id.kind().is_lease()) {
                return None;
            }
            largest = largest.max(n);
        }
        let trace = match largest {
            0 => Trace::Nothing,
            1 => Trace::One,
            _ => Trace::More,
        };
        Some((trace, self.last_us))
    }

    /// Record what every log still counts in `summary`: the bucket can then go.
    pub(super) fn summarise(&self, summary: &mut Summary, now: u64) {
        for log in &self.logs {
            summary.record(self.key, log.id, log.held(), now);
        }
    }
}

/// A shard: its buckets, the index that finds one by key, its bytes and its summary.
pub(super) struct Shard {
    /// Each bucket's position in `buckets`, found by the bucket's key: 4 bytes an entry
    /// (the key is the bucket's own), where a map of key to position took 16.
    index: HashTable<u32>,
    /// The buckets, in no order (a random one is sampled for eviction in O(1)).
    pub(super) buckets: Chunks<Bucket>,
    /// Accounted bytes: [`Bucket::cost`] summed (the summary's fixed bytes apart).
    pub(super) bytes: usize,
    /// What evicted buckets of this shard still count.
    pub(super) summary: Summary,
}

/// The hash the index files a bucket key under. A key is a seeded hash already, but its top
/// bits pick the shard (`arena::shard_of`), so they are the same for every key of one, and
/// hashbrown tags each entry with the top 7 bits of its hash: rotated, those bits vary.
fn index_hash(key: u64) -> u64 {
    key.rotate_left(32)
}

impl Shard {
    /// An empty shard whose buckets and summary share `shard_bytes`.
    pub(super) fn new(shard_bytes: usize) -> Shard {
        Shard {
            index: HashTable::new(),
            buckets: Chunks::default(),
            bytes: 0,
            summary: Summary::sized_for(shard_bytes),
        }
    }

    /// The position in `buckets` of the bucket with key `key`, if held.
    pub(super) fn position(&self, key: u64) -> Option<usize> {
        let buckets = &self.buckets;
        self.index
            .find(index_hash(key), |&i| buckets[i as usize].key == key)
            .map(|&i| i as usize)
    }

    /// The bucket with key `key`, if held.
    pub(super) fn get(&self, key: u64) -> Option<&Bucket> {
        self.position(key).map(|i| &self.buckets[i])
    }

    /// Hold a new bucket (its key must not be held yet); its position.
    pub(super) fn push(&mut self, bucket: Bucket) -> usize {
        self.bytes += bucket.cost();
        let (hash, at) = (index_hash(bucket.key), self.buckets.len());
        self.buckets.push(bucket);
        let buckets = &self.buckets;
        self.index
            .insert_unique(hash, at as u32, |&i| index_hash(buckets[i as usize].key));
        at
    }

    /// Drop the bucket at position `i`; the last bucket takes its place.
    pub(super) fn remove_at(&mut self, i: usize) {
        let at = i as u32;
        if let Ok(entry) = self
            .index
            .find_entry(index_hash(self.buckets[i].key), |&j| j == at)
        {
            entry.remove();
        }
        let b = self.buckets.swap_remove(i);
        self.bytes -= b.cost();
        if let Some(moved) = self.buckets.get(i) {
            let from = self.buckets.len() as u32;
            if let Some(j) = self.index.find_mut(index_hash(moved.key), |&j| j == from) {
                *j = at;
            }
        }
    }

    /// Drop expired entries of every bucket and the buckets with nothing left; give memory
    /// back after a wave of one-off clients.
    pub(super) fn sweep(&mut self, now: u64) {
        let mut j = 0;
        while j < self.buckets.len() {
            let b = &mut self.buckets[j];
            let before = b.cost();
            b.logs.retain_mut(|log| {
                log.evict(now);
                !log.is_empty()
            });
            let after = b.cost();
            self.bytes = self.bytes - before + after;
            if self.buckets[j].logs.is_empty() {
                self.remove_at(j);
            } else {
                j += 1;
            }
        }
        self.buckets.shrink();
        // Don't reallocate the index every second: only when three quarters are unused.
        let len = self.buckets.len();
        if len < self.index.capacity() / 4 {
            let buckets = &self.buckets;
            self.index
                .shrink_to(len * 2, |&i| index_hash(buckets[i as usize].key));
        }
    }

    /// Evict sampled buckets until `need` more bytes fit in `budget`, never `keep`. What an
    /// evicted bucket still counts goes into the summary, so any client may go: of the
    /// sampled ones, the one that leaves the least ([`Trace`]: nothing, then one request), of
    /// those the one idle longest (a made-up key of a flood never comes back; a client that
    /// does is held to its count by the summary, and the longer it was idle the sooner that
    /// frees). Returns how
    /// many were evicted, or `Err` when no sampled bucket may go.
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
            let n = self.buckets.len();
            let mut best: Option<(usize, (Trace, u64))> = None;
            for _ in 0..EVICTION_SAMPLES.min(n) {
                let i = rng.usize(..n);
                let b = &mut self.buckets[i];
                if b.key == keep {
                    continue;
                }
                let Some(rank) = b.eviction_rank(now) else {
                    continue;
                };
                if best.is_none_or(|(_, r)| rank < r) {
                    best = Some((i, rank));
                }
            }
            let Some((i, _)) = best else {
                return Err(());
            };
            self.buckets[i].summarise(&mut self.summary, now);
            self.remove_at(i);
            evicted += 1;
        }
        Ok(evicted)
    }
}
