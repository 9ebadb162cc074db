//! The one memory of provable denials, and the local deny cache that answers from it in front
//! of a shared store, so a flood that is already being denied costs no round trips.
//!
//! Why a denial is exact: when a decision says a bucket is denied, each full limit stays full
//! until its oldest entry leaves the window (`reset`). Denied requests are never recorded and no
//! proxy can admit into a full log, so nothing can make room earlier, and admission needs every
//! limit to have room: no request for this bucket can be admitted before the largest `reset` of
//! the full limits, i.e. [`Verdict::retry_after`].
//!
//! The instant is computed as a duration from the store's reply (Redis's clock), added to the
//! moment the call was *sent* on this proxy's monotonic clock. The store decided after that
//! moment, so the remembered deadline is never later than the true one: the memory never denies
//! a request the store would have admitted, and proxy clocks never matter.
//!
//! All of this assumes the store kept its state. A denial is therefore tied to the store's
//! [`Store::generation`], which changes when a shared store's connection is lost or rebuilt
//! (Redis may have restarted empty); entries of an older generation are ignored. And since a
//! `FLUSHALL`, an eviction or a failover on a kept connection is not seen, a denial is trusted
//! for at most the memory's `max_age`.
//!
//! One memory, two readers: a coalescing store ([`crate::limiter::redis::RedisStore`]) learns
//! every denial its calls bring back and answers queued and arriving decisions from it; a
//! [`DenyCache`] in front of that store reads the same memory ([`DenyCache::reading`]) rather
//! than keep a second one that would have to agree with it. Without a deny cache the
//! lanes trust a denial only while the lane that learned it stays busy (its [`Stamp::epoch`]),
//! so `local_deny_cache = false` still asks the store for every request that finds its lane idle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;

use crate::limiter::{
    Admission, Buckets, Change, Checked, Limit, Store, StoreError, Verdict, WindowView,
};

/// Upper bound on remembered buckets; past it new denials are simply not remembered (correct,
/// only slower), so a flood of distinct clients cannot grow memory without bound.
pub const MAX_ENTRIES: usize = 100_000;

/// Default [`DenyCache::with_max_age`]: a cached denial is trusted for at most 10 s.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(10);

/// Which state of the store, and which busy period of a lane, a denial was learned in: it only
/// answers decisions made under the same stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The store's [`Store::generation`] before the call that found the denial.
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
    stamp: Stamp,
    /// The limits it was decided under: a request that started before a reload can finish
    /// after the memory was cleared, and its old-limit denial must not bind the new limits.
    limits: Box<[Limit]>,
    verdict: Verdict,
}

/// See the module documentation.
pub struct KnownDenials {
    denied: DashMap<Box<str>, Denial>,
    /// A denial is trusted for at most this long, in µs, whatever its deadline.
    max_age_us: AtomicU64,
    /// A deny cache reads this memory: denials outlive the busy period of their lane.
    cached: AtomicBool,
}

impl KnownDenials {
    /// An empty memory trusting a denial for at most `max_age`.
    pub fn new(max_age: Duration) -> KnownDenials {
        KnownDenials {
            denied: DashMap::new(),
            max_age_us: AtomicU64::new(micros(max_age)),
            cached: AtomicBool::new(false),
        }
    }

    /// A deny cache reads this memory from now on, trusting a denial for `max_age`.
    pub(crate) fn serve_cache(&self, max_age: Duration) {
        self.max_age_us.store(micros(max_age), Ordering::Relaxed);
        self.cached.store(true, Ordering::Relaxed);
    }

    /// True when a deny cache reads this memory: lanes then stamp their denials with epoch 0,
    /// the cache's, instead of their busy period.
    pub(crate) fn outlives_lanes(&self) -> bool {
        self.cached.load(Ordering::Relaxed)
    }

    /// The remembered denial of `bucket` under `limits` and `stamp`, aged to `now`, if it is
    /// still certain.
    pub fn verdict(
        &self,
        bucket: &str,
        limits: &[Limit],
        stamp: Stamp,
        now: Instant,
    ) -> Option<Verdict> {
        let d = self.denied.get(bucket)?;
        let certain = now < d.until && d.stamp == stamp && *d.limits == *limits;
        certain.then(|| d.verdict.aged(now - d.sent))
    }

    /// `verdict` came back for `bucket` from a call sent at `sent` under `stamp`: a denial is
    /// remembered, an admission teaches nothing.
    pub fn learn(
        &self,
        bucket: &str,
        limits: &[Limit],
        verdict: &Verdict,
        sent: Instant,
        stamp: Stamp,
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
            stamp,
            limits: limits.into(),
            verdict: verdict.clone(),
        };
        self.denied.insert(bucket.into(), denial);
    }

    /// Forget `bucket` (an operator reset it, or an admission was refunded).
    pub fn forget(&self, bucket: &str) {
        self.denied.remove(bucket);
    }

    /// Forget everything (new limits may admit what the old ones denied).
    pub fn clear(&self) {
        self.denied.clear();
    }

    /// Drop what can no longer answer: past its deadline, or of another generation.
    pub fn sweep(&self, now: Instant, generation: u64) {
        self.denied
            .retain(|_, d| d.until > now && d.stamp.generation == generation);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A [`Store`] wrapper that answers locally while a bucket is known to be full.
pub struct DenyCache {
    inner: Arc<dyn Store>,
    known: Arc<KnownDenials>,
    /// The inner store learns the denials itself (its memory is `known`).
    learned_inside: bool,
}

impl DenyCache {
    /// Wrap `inner`, with a memory of its own.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        DenyCache::with_memory(inner, Arc::new(KnownDenials::new(DEFAULT_MAX_AGE)), false)
    }

    /// Wrap `inner`, which learns its denials into `known` itself (a coalescing store): the
    /// cache reads that memory rather than keep a second one that would have to agree.
    pub fn reading(inner: Arc<dyn Store>, known: Arc<KnownDenials>) -> Self {
        DenyCache::with_memory(inner, known, true)
    }

    fn with_memory(inner: Arc<dyn Store>, known: Arc<KnownDenials>, learned_inside: bool) -> Self {
        known.serve_cache(DEFAULT_MAX_AGE);
        DenyCache {
            inner,
            known,
            learned_inside,
        }
    }

    /// Trust a cached denial for at most `max_age` (then ask the store again): a `FLUSHALL`, a
    /// `maxmemory` eviction or a failover on a kept connection may have freed the bucket.
    pub fn with_max_age(self, max_age: Duration) -> Self {
        self.known.serve_cache(max_age);
        self
    }

    /// Answer from the memory, or ask the store with `ask` and remember its denial.
    async fn cached<'a, F>(
        &'a self,
        bucket: &str,
        limits: &[Limit],
        ask: impl FnOnce(&'a dyn Store) -> F,
    ) -> Checked
    where
        F: std::future::Future<Output = Checked>,
    {
        let sent = Instant::now();
        let stamp = Stamp {
            generation: self.inner.generation(),
            epoch: 0,
        };
        if let Some(v) = self.known.verdict(bucket, limits, stamp, sent) {
            return Ok(v);
        }
        let verdict = ask(&*self.inner).await?;
        if !self.learned_inside {
            self.known.learn(bucket, limits, &verdict, sent, stamp);
        }
        Ok(verdict)
    }
}

#[async_trait]
impl Store for DenyCache {
    /// A decision over several buckets (`limits[].key`) is passed through: where the store
    /// reserves them in parts, a full limit may be another request's reservation given back a
    /// moment later, so its denial proves nothing about the time ahead.
    async fn check(&self, route: &str, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked {
        if !buckets.is_one() {
            return self.inner.check(route, buckets, limits).await;
        }
        let bucket = buckets.first();
        self.cached(bucket, limits, |s| s.check(route, buckets, limits))
            .await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn maintain(&self) {
        self.inner.maintain().await;
    }

    fn sweep_expired(&self) {
        // A store that keeps the memory sweeps it itself.
        if !self.learned_inside {
            self.known.sweep(Instant::now(), self.inner.generation());
        }
        self.inner.sweep_expired();
    }

    fn is_ready(&self) -> bool {
        self.inner.is_ready()
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        self.inner.inspect(bucket, limits).await
    }

    async fn reset(&self, bucket: &str, limits: &[Limit]) -> Result<(), StoreError> {
        self.inner.reset(bucket, limits).await?;
        // After the store forgot the bucket: a denial remembered from now on was decided after
        // the reset. (A check already in flight when the reset ran may still bring back its
        // older denial; it lapses at its deadline. Other proxies' memories are not reached.)
        self.known.forget(bucket);
        Ok(())
    }

    async fn refund(&self, admission: Admission<'_>) -> Result<(), StoreError> {
        let (_, buckets, limits, _) = admission.parts();
        self.inner.refund(admission).await?;
        if admission.change == Change::Charge {
            // A charge only adds: every denial remembered still stands.
            return Ok(());
        }
        // An entry came back: a denial remembered before it is too pessimistic now.
        for (bucket, _) in buckets.groups(limits.len()) {
            self.known.forget(bucket);
        }
        Ok(())
    }

    async fn renew(&self, admission: Admission<'_>) -> Result<Vec<u64>, StoreError> {
        // A renewal frees nothing: no known denial changes.
        self.inner.renew(admission).await
    }

    fn rules_changed(&self) {
        // New limits may admit what the old ones denied.
        self.known.clear();
        self.inner.rules_changed();
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }
}

#[cfg(test)]
mod tests;
