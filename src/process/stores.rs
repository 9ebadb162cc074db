//! The limit stores the server runs: the configured one (memory or Redis), the local fallback
//! of a shared store, and the background tasks that keep them (Redis connection upkeep, the
//! sweep of expired buckets).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::Config;
use crate::limiter::memory::MemoryStore;
use crate::limiter::redis::RedisStore;
use crate::limiter::Store;

/// Build the configured store (no I/O: Redis connects later, in the store's `maintain`, on its
/// own I/O thread). Shared stores answer a bucket known to be full locally (the exact deny
/// cache) unless it is disabled.
pub fn build_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let settings = &config.store;
    let Some(target) = settings.redis_target() else {
        return Ok(Arc::new(memory_store(config)));
    };
    let store = RedisStore::new(&target).context("cannot set up the Redis store")?;
    Ok(Arc::new(if settings.local_deny_cache {
        store.with_deny_cache(settings.deny_cache_max_age)
    } else {
        store
    }))
}

/// This proxy's own sliding-window log for `on_error = "local"`: present with a shared store,
/// bounded by `store.max_memory` like the memory store. Its entries are never merged into the
/// shared store when it answers again.
pub fn build_local_fallback(config: &Config) -> Option<Arc<dyn Store>> {
    config.store.redis_target()?;
    Some(Arc::new(memory_store(config)))
}

/// A memory store bounded by `max_memory`, with an arena for every limited route from the start
/// (so a flood before another route's first request cannot take its share).
pub(super) fn memory_store(config: &Config) -> MemoryStore {
    let limited = config.routing.routes.iter().filter(|r| r.is_limited());
    let metrics = &crate::metrics::METRICS;
    MemoryStore::with_max_memory(config.store.max_memory)
        .with_overflow_counter(metrics.memory_overflow.clone())
        .with_routes(limited.map(|r| r.name.as_str()))
        .with_eviction_counter(metrics.store_evictions.clone())
}

/// Calls [`Store::maintain`] once a second until shutdown: connects to Redis, reconnects.
pub(super) async fn maintain_store(store: Arc<dyn Store>, mut shutdown: ShutdownWatch) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                store.maintain().await;
                crate::metrics::METRICS.store_ready.set(i64::from(store.is_ready()));
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Calls [`Store::sweep_expired`] once a second on a background runtime of its own, so that
/// sweeping a million idle buckets never stalls the proxy's workers.
pub(super) struct StoreSweeper {
    pub(super) stores: Vec<Arc<dyn Store>>,
}

#[async_trait]
impl BackgroundService for StoreSweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.stores.iter().for_each(|s| s.sweep_expired()),
                _ = shutdown.changed() => return,
            }
        }
    }
}
