//! The limiter side of the proxy: ask the route's store, time and count the answer, and fall
//! back to this proxy's own log when the shared store cannot decide (`on_error = "local"`).

use std::sync::Arc;
use std::time::Instant;

use prometheus::Histogram;

use super::outcome::{DecidedBy, Policy};
use crate::config::OnError;
use crate::limiter::{Store, StoreError, Verdict};
use crate::metrics::{StoreErrorMetrics, METRICS};
use crate::routes::Route;

/// The stores a request's decision may come from, and their metric handles.
pub(super) struct Limiter {
    pub(super) store: Arc<dyn Store>,
    /// This proxy's own log for `on_error = "local"` (present with a shared store).
    pub(super) local: Option<Arc<dyn Store>>,
    duration: Histogram,
    errors: StoreErrorMetrics,
}

impl Limiter {
    /// Decide with `store`, which owns the decision deadline (see [`Store`]): no second timer
    /// runs here.
    pub(super) fn new(store: Arc<dyn Store>) -> Limiter {
        let duration = METRICS
            .limiter_duration
            .with_label_values(&[store.backend()]);
        Limiter {
            store,
            local: None,
            duration,
            errors: StoreErrorMetrics::default(),
        }
    }

    /// The store decisions go to (for tests that build a second proxy on the same one).
    #[cfg(test)]
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The verdict for `bucket` on `route`, and who gave it.
    pub(super) async fn decide(
        &self,
        bucket: &str,
        route: &Route,
        policy: Policy,
    ) -> (Result<Verdict, StoreError>, DecidedBy) {
        let (name, limits) = (&route.spec.name, &route.spec.limits);
        let started = Instant::now();
        let result = self.store.check_in(name, bucket, limits).await;
        self.duration.observe(started.elapsed().as_secs_f64());
        let Err(e) = &result else {
            return (result, DecidedBy::Store);
        };
        self.errors.count(e);
        // Per request at debug level only: an outage would otherwise write a log line per
        // request; the route's state log and the metrics say it.
        log::debug!("route {name}: limiter error: {e}");
        match &self.local {
            // The shared store cannot decide: this proxy's own log does, for the same limits.
            Some(local) if policy.on_error == OnError::Local => {
                (local.check_in(name, bucket, limits).await, DecidedBy::Local)
            }
            _ => (result, DecidedBy::Store),
        }
    }
}
