//! The one memory of provable denials ([`KnownDenials`]): every lane answers arriving and
//! queued decisions from it, and the local deny cache (`local_deny_cache`) is this memory read
//! beyond a lane's busy period. Pure bookkeeping: what a denial proves, for how long, under
//! which [`LearnedUnder`]; it imports nothing of the lanes or the sender.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::limiter::{Limit, Verdict};

/// Upper bound on remembered buckets; past it new denials are simply not remembered (correct,
/// only slower), so a flood of distinct clients cannot grow memory without bound.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// Which state of the store, and which busy period of a lane, a denial was learned in: it only
/// answers decisions made under the same state and busy period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedUnder {
    /// The store's [`Store::generation`](crate::limiter::Store::generation) before the call that found the denial.
    pub generation: u64,
    /// The learning lane's busy period while no deny cache reads the memory; else 0.
    pub epoch: u64,
}

/// A bucket found full.
struct Denial {
    /// Before this instant no request for the bucket can be admitted.
    until: Instant,
    /// When the call that found it was sent (the proof's time base), to age the verdict.
    sent: Instant,
    under: LearnedUnder,
    /// The limits it was decided under: a request that started before a reload can finish
    /// after the memory was cleared, and its old-limit denial must not bind the new limits.
    limits: Box<[Limit]>,
    verdict: Verdict,
}

/// The one memory of provable denials, which answers decisions locally while a bucket is
/// known to be full, so a flood that is already being denied costs no round trips.
///
/// Why a denial is exact: when a decision says a bucket is denied, each full limit stays full
/// until its oldest entry leaves the window (`reset`). Denied requests are never recorded and no
/// proxy can admit into a full log, so nothing can make room earlier, and admission needs every
/// limit to have room: no request for this bucket can be admitted before the largest `reset` of
/// the full limits, i.e. [`Verdict::retry_after`].
///
/// The instant is computed as a duration from the store's reply (Redis's clock), added to the
/// moment the call was *sent* on this proxy's monotonic clock. The store decided after that
/// moment, so the remembered deadline is never later than the true one: the memory never denies
/// a request the store would have admitted, and proxy clocks never matter.
///
/// All of this assumes the store kept its state. A denial is therefore tied to the store's
/// [`Store::generation`](crate::limiter::Store::generation), which changes when a shared
/// store's connection is lost or rebuilt (Redis may have restarted empty); entries of an older
/// generation are ignored. And since a `FLUSHALL`, an eviction or a failover on a kept
/// connection is not seen, a denial is trusted for at most the memory's `max_age`.
///
/// The coalescing store learns every denial its calls bring back. With the local deny cache
/// on (`local_deny_cache`, [`KnownDenials::serve_cache`]) a denial answers until its deadline
/// or `deny_cache_max_age`; without it a lane trusts a denial only while the lane that learned
/// it stays busy (its [`LearnedUnder::epoch`]), so `local_deny_cache = false` still asks the store for
/// every request that finds its lane idle.
pub struct KnownDenials {
    /// Keyed by bucket, so by client: ahash, seeded per process, keeps the hashing cheap
    /// without letting clients choose colliding buckets.
    denied: DashMap<Box<str>, Denial, ahash::RandomState>,
    /// How many denials `denied` holds, read before a bucket is hashed: most decisions find
    /// the memory empty. Kept beside the map, so a race (a `clear` as a denial is learned) may
    /// leave it off until the next `sweep` recounts. It only decides whether to look, and not
    /// looking is safe: the store decides instead (and while the store cannot be reached, the
    /// route's `on_error`, as for a denial the memory never learned or had no room for).
    held: AtomicUsize,
    /// A denial is trusted for at most this long, in µs, whatever its deadline.
    max_age_us: AtomicU64,
    /// A deny cache reads this memory: denials outlive the busy period of their lane.
    cached: AtomicBool,
}

impl KnownDenials {
    /// An empty memory trusting a denial for at most `max_age`.
    pub fn new(max_age: Duration) -> KnownDenials {
        KnownDenials {
            denied: DashMap::default(),
            held: AtomicUsize::new(0),
            max_age_us: AtomicU64::new(micros(max_age)),
            cached: AtomicBool::new(false),
        }
    }

    /// A deny cache reads this memory from now on, trusting a denial for `max_age`.
    pub(crate) fn serve_cache(&self, max_age: Duration) {
        self.max_age_us.store(micros(max_age), Ordering::Relaxed);
        self.cached.store(true, Ordering::Relaxed);
    }

    /// True when a deny cache reads this memory: lanes then learn their denials under epoch 0,
    /// the cache's, instead of their busy period.
    pub(crate) fn outlives_lanes(&self) -> bool {
        self.cached.load(Ordering::Relaxed)
    }

    /// The remembered denial of `bucket` under `limits` and `under`, aged to `now`, if it is
    /// still certain.
    pub fn verdict(
        &self,
        bucket: &str,
        limits: &[Limit],
        under: LearnedUnder,
        now: Instant,
    ) -> Option<Verdict> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let d = self.denied.get(bucket)?;
        let certain = now < d.until && d.under == under && *d.limits == *limits;
        certain.then(|| d.verdict.aged(now - d.sent))
    }

    /// `verdict` came back for `bucket` from a call sent at `sent` under `under`: a denial is
    /// remembered, an admission teaches nothing.
    pub fn learn(
        &self,
        bucket: &str,
        limits: &[Limit],
        verdict: &Verdict,
        sent: Instant,
        under: LearnedUnder,
    ) {
        let Some(wait) = verdict.retry_after() else {
            return;
        };
        // A lease is given back whenever its request ends, on any proxy: a full concurrency
        // limit proves nothing about the next moment.
        if limits.iter().any(Limit::is_lease) {
            return;
        }
        if self.denied.len() >= MAX_ENTRIES && !self.denied.contains_key(bucket) {
            return;
        }
        let max_age = Duration::from_micros(self.max_age_us.load(Ordering::Relaxed));
        let denial = Denial {
            // Never later than the proof allows, never longer than max_age.
            until: sent + wait.min(max_age),
            sent,
            under,
            limits: limits.into(),
            verdict: verdict.clone(),
        };
        if self.denied.insert(bucket.into(), denial).is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forget `bucket` (an operator reset it, or an admission was refunded).
    pub fn forget(&self, bucket: &str) {
        if self.denied.remove(bucket).is_some() {
            // Saturating: after a race left the count low, 0 means "look after the next sweep".
            let _ = self
                .held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Forget everything (new limits may admit what the old ones denied).
    pub fn clear(&self) {
        self.denied.clear();
        self.held.store(0, Ordering::Relaxed);
    }

    /// Drop what can no longer answer: past its deadline, or of another generation.
    pub fn sweep(&self, now: Instant, generation: u64) {
        self.denied
            .retain(|_, d| d.until > now && d.under.generation == generation);
        self.held.store(self.denied.len(), Ordering::Relaxed);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
