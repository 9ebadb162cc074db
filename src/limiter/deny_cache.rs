//! An exact local deny cache in front of a shared store, so a flood that is already being
//! denied costs no Redis round trips.
//!
//! Why it is exact: when a decision says a bucket is denied, each full limit stays full until
//! its oldest entry leaves the window (`reset`). Denied requests are never recorded and no proxy
//! can admit into a full log, so nothing can free a slot earlier, and admission needs every
//! limit to have room: no request for this bucket can be admitted before the largest `reset`
//! of the full limits, i.e. [`Verdict::retry_after`].
//!
//! The instant is computed as a duration from the script's reply (Redis's clock), added to the
//! moment the call was *sent* on this proxy's monotonic clock. The script ran after that moment,
//! so the cached deadline is never later than the true one: the cache never denies a request
//! the script would have admitted, and proxy clocks never matter.
//!
//! All of this assumes the store kept its state. A denial is therefore tied to the store's
//! [`Store::generation`], which changes when a shared store's connection is lost or rebuilt
//! (Redis may have restarted empty); entries of an older generation are ignored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;

use super::{Checked, Limit, Store, StoreError, Verdict, WindowView};

/// Upper bound on cached buckets; past it new denials are simply not cached (correct, only
/// slower), so a flood of distinct clients cannot grow memory without bound.
pub const MAX_ENTRIES: usize = 100_000;

/// Default [`DenyCache::with_max_age`]: a cached denial is trusted for at most 10 s.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(10);

struct Denied {
    /// Before this instant no request for the bucket can be admitted.
    until: Instant,
    /// When the decision was requested, to age the states in the headers we send.
    sent: Instant,
    /// The store's generation when the decision was made; a different one means the store may
    /// have restarted empty, and the denial proves nothing any more.
    generation: u64,
    /// The limits it was decided under: a request that started before a reload can finish
    /// after the cache was cleared, and its old-limit denial must not bind the new limits.
    limits: Box<[Limit]>,
    verdict: Verdict,
}

/// A [`Store`] wrapper that answers locally while a bucket is known to be full.
pub struct DenyCache {
    inner: Arc<dyn Store>,
    denied: DashMap<Box<str>, Denied>,
    hits: AtomicU64,
    /// A cached denial is dropped after this even if its deadline is later: a `FLUSHALL`, a
    /// `maxmemory` eviction or a failover on a kept connection may have freed the bucket.
    max_age: Duration,
}

impl DenyCache {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        DenyCache {
            inner,
            denied: DashMap::new(),
            hits: AtomicU64::new(0),
            max_age: DEFAULT_MAX_AGE,
        }
    }

    /// Trust a cached denial for at most `max_age` (then ask the store again).
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// Number of buckets currently cached as denied.
    pub fn len(&self) -> usize {
        self.denied.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.denied.is_empty()
    }

    /// Decisions answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The cached verdict for `bucket`, aged to `now`, if it is still certain.
    fn lookup(&self, bucket: &str, limits: &[Limit], now: Instant) -> Option<Verdict> {
        let entry = self.denied.get(bucket)?;
        if now >= entry.until
            || *entry.limits != *limits
            || entry.generation != self.inner.generation()
        {
            return None;
        }
        Some(entry.verdict.aged(now - entry.sent))
    }

    /// Answer from the cache, or ask the store with `ask` and cache its denial.
    async fn cached<'a, F>(
        &'a self,
        bucket: &str,
        limits: &[Limit],
        ask: impl FnOnce(&'a dyn Store) -> F,
    ) -> Result<Verdict, StoreError>
    where
        F: std::future::Future<Output = Result<Verdict, StoreError>>,
    {
        let sent = Instant::now();
        if let Some(v) = self.lookup(bucket, limits, sent) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(v);
        }
        let generation = self.inner.generation();
        let verdict = ask(&*self.inner).await?;
        match verdict.retry_after() {
            Some(wait) if self.denied.len() < MAX_ENTRIES || self.denied.contains_key(bucket) => {
                self.denied.insert(
                    bucket.into(),
                    Denied {
                        // Never later than the proof allows, never longer than max_age.
                        until: sent + wait.min(self.max_age),
                        sent,
                        generation,
                        limits: limits.into(),
                        verdict: verdict.clone(),
                    },
                );
            }
            _ => {}
        }
        Ok(verdict)
    }
}

#[async_trait]
impl Store for DenyCache {
    async fn check(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError> {
        self.cached(bucket, limits, |s| s.check(bucket, limits))
            .await
    }

    async fn check_in(&self, route: &str, bucket: &str, limits: &[Limit]) -> Checked {
        self.cached(bucket, limits, |s| s.check_in(route, bucket, limits))
            .await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn maintain(&self) {
        self.inner.maintain().await;
    }

    fn sweep_expired(&self) {
        let now = Instant::now();
        let generation = self.inner.generation();
        self.denied
            .retain(|_, d| d.until > now && d.generation == generation);
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
        // After the store forgot the bucket: a denial cached from now on was decided after the
        // reset. (A check already in flight when the reset ran may still cache its older denial;
        // it lapses at its deadline. Other proxies' caches are not reached from here.)
        self.denied.remove(bucket);
        Ok(())
    }

    async fn refund(
        &self,
        route: &str,
        bucket: &str,
        limits: &[Limit],
        recorded_at: u64,
    ) -> Result<(), StoreError> {
        self.inner
            .refund(route, bucket, limits, recorded_at)
            .await?;
        // A slot came back: a denial cached before it is too pessimistic now.
        self.denied.remove(bucket);
        Ok(())
    }

    fn rules_changed(&self) {
        // New limits may admit what the old ones denied.
        self.denied.clear();
        self.inner.rules_changed();
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::memory::MemoryStore;

    fn limit(requests: u32, window: Duration) -> Limit {
        Limit::log(requests, window)
    }

    /// Fill a one-request limit of bucket `b`: admitted, then denied.
    async fn fill(cache: &DenyCache, limits: &[Limit]) {
        assert!(cache.check("b", limits).await.unwrap().admitted);
        assert!(!cache.check("b", limits).await.unwrap().admitted);
    }

    #[tokio::test]
    async fn denies_locally_until_the_slot_frees_then_asks_again() {
        let cache = DenyCache::new(Arc::new(MemoryStore::new()));
        let limits = [limit(2, Duration::from_millis(300))];
        assert!(cache.check("b", &limits).await.unwrap().admitted);
        assert!(cache.check("b", &limits).await.unwrap().admitted);
        let denied = cache.check("b", &limits).await.unwrap();
        assert!(!denied.admitted);
        assert_eq!(cache.hits(), 0, "the first denial comes from the store");
        let cached = cache.check("b", &limits).await.unwrap();
        assert!(!cached.admitted);
        assert_eq!(cache.hits(), 1);
        assert!(cached.states[0].reset <= denied.states[0].reset);
        tokio::time::sleep(denied.retry_after().unwrap() + Duration::from_millis(5)).await;
        assert!(
            cache.check("b", &limits).await.unwrap().admitted,
            "slot freed: the store decides again"
        );
        assert_eq!(cache.hits(), 1);
    }

    #[tokio::test]
    async fn reload_clears_the_cache() {
        let cache = DenyCache::new(Arc::new(MemoryStore::new()));
        fill(&cache, &[limit(1, Duration::from_secs(60))]).await;
        assert_eq!(cache.len(), 1);
        cache.rules_changed();
        assert!(cache.is_empty());
        let raised = [limit(3, Duration::from_secs(60))];
        assert!(
            cache.check("b", &raised).await.unwrap().admitted,
            "raised limit admits at once"
        );
    }

    #[tokio::test]
    async fn a_denial_only_binds_the_limits_it_was_decided_under() {
        // A request that began before a reload may insert its old-limit denial after the
        // reload cleared the cache: requests under the new limits must not see it.
        let cache = DenyCache::new(Arc::new(MemoryStore::new()));
        fill(&cache, &[limit(1, Duration::from_secs(60))]).await;
        let new = [limit(2, Duration::from_secs(60))];
        assert!(cache.check("b", &new).await.unwrap().admitted);
        assert_eq!(cache.hits(), 0);
    }
}
