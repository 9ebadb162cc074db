//! The background service that runs each pool's active checks and name look-ups, for the
//! pools of the rules in force: a reload's new pools are picked up within
//! [`PICK_UP`]; a replaced pool's tasks end once its last request is done with it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::PoolHealth;

/// How soon the pools of new rules (a reload) get their checks.
pub const PICK_UP: Duration = Duration::from_secs(1);

/// Runs the checks and look-ups of the pools `pools` returns (those of the current rules).
pub struct HealthService<F> {
    pools: F,
}

impl<F: Fn() -> Vec<Arc<PoolHealth>> + Send + Sync> HealthService<F> {
    /// The service for the pools `pools` returns each time it looks.
    pub fn new(pools: F) -> HealthService<F> {
        HealthService { pools }
    }
}

#[async_trait]
impl<F: Fn() -> Vec<Arc<PoolHealth>> + Send + Sync> BackgroundService for HealthService<F> {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(PICK_UP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => (self.pools)().iter().for_each(watch),
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Start `pool`'s checks and look-ups, once.
pub(super) fn watch(pool: &Arc<PoolHealth>) {
    if !pool.start() {
        return;
    }
    let (check, resolve) = pool.every();
    if let Some(every) = check {
        tokio::spawn(checks(Arc::downgrade(pool), every));
    }
    if let Some(every) = resolve {
        tokio::spawn(resolves(Arc::downgrade(pool), every));
    }
}

/// Check every server of `pool` now, then every `every`, while the pool is in use.
async fn checks(pool: Weak<PoolHealth>, every: Duration) {
    loop {
        let Some(lb) = pool.upgrade().map(|p| p.lb.clone()) else {
            return;
        };
        lb.backends().run_health_check(true).await;
        drop(lb);
        tokio::time::sleep(every).await;
    }
}

/// Look `pool`'s names up every `every`, while the pool is in use.
pub(super) async fn resolves(pool: Weak<PoolHealth>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        pool.rediscover().await;
    }
}
