//! The fold task: every [`FOLD_EVERY`], each route's period summary is taken whole, filed in
//! this proxy's minutes and, on a shared store, added to the store's counts in one bounded call
//! ([`FOLD_TIMEOUT`]). Nothing waits on it: a slow or dead store costs the fleet-wide counts of
//! the folds that failed (each counted in `slidegate_top_folds_total{result="failed"}`, and
//! logged at most once per 10 s), never a request, never memory (the next period starts afresh
//! whatever became of the last).

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{register_int_counter_vec, IntCounterVec};

use super::{minute_now, Board, FOLD_EVERY};
use crate::limiter::top::{TopFold, FOLD_TIMEOUT};
use crate::limiter::Store;
use crate::logs::limit::{Throttled, EVENT_INTERVAL};

/// `slidegate_top_folds_total{result}`: folds of the top limited clients into the shared
/// store, `ok` or `failed` (dropped, never sent again).
pub static FOLDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "slidegate_top_folds_total",
        "Folds of this proxy's top limited clients into the shared store, by result",
        &["result"]
    )
    .expect("register slidegate_top_folds_total")
});

/// Register the fold metric's series at start.
pub fn register_metrics() {
    for result in ["ok", "failed"] {
        FOLDS.with_label_values(&[result]);
    }
}

/// See the module documentation.
pub struct FoldService {
    board: &'static Board,
    store: Arc<dyn Store>,
    failures: Throttled,
}

impl FoldService {
    /// Fold `board`'s routes into `store` (only into this proxy's minutes unless the store
    /// shares them: [`Store::shares_top`]).
    pub fn new(board: &'static Board, store: Arc<dyn Store>) -> FoldService {
        FoldService {
            board,
            store,
            failures: Throttled::default(),
        }
    }

    /// One fold of every route.
    pub async fn fold(&self) {
        let minute = minute_now();
        let shared = self.store.shares_top();
        let mut folds = Vec::new();
        for (route, top) in self.board.current() {
            let counts = top.take_period();
            if counts.is_empty() {
                continue;
            }
            if shared {
                folds.push(TopFold {
                    route,
                    minute,
                    limits: top.limits(),
                    counts: counts.clone(),
                });
            }
            let mut minutes = top.minutes.lock().unwrap_or_else(|e| e.into_inner());
            minutes.add(minute, counts);
        }
        if folds.is_empty() {
            return;
        }
        // The store bounds its calls; this bounds the whole fold however many routes it holds.
        let bound = FOLD_TIMEOUT * 2;
        let error = match tokio::time::timeout(bound, self.store.fold_top(folds)).await {
            Ok(Ok(())) => {
                FOLDS.with_label_values(&["ok"]).inc();
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}", humantime::format_duration(bound)),
        };
        FOLDS.with_label_values(&["failed"]).inc();
        if let Some(n) = self.failures.note(EVENT_INTERVAL) {
            log::warn!(
                "top limited clients: {n} fold(s) into the store failed and were dropped (the \
                 fleet-wide counts miss them): {error}"
            );
        }
    }
}

#[async_trait]
impl BackgroundService for FoldService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(FOLD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.fold().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}
