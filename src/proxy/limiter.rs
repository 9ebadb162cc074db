//! The limiter side of the proxy: ask the route's store, time and count the answer, fall
//! back to this proxy's own log when the shared store cannot decide (`on_error = "local"`), and
//! let a denial wait for its slot when the route smooths bursts (`max_delay`, see [`super::delay`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::proxy::Session;
use prometheus::Histogram;

use super::delay::{self, Queues};
use super::outcome::{Checked, DecidedBy, Policy};
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
    /// Requests waiting for a slot, per bucket (`max_queue`).
    queues: Queues,
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
            queues: Queues::default(),
        }
    }

    /// The store decisions go to (for tests that build a second proxy on the same one).
    #[cfg(test)]
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// What the limits say of a request for `bucket` on `route`. A denial whose slot frees
    /// within the route's `max_delay` waits for it, with a place in the bucket's queue (none
    /// left: answered at once), and is decided again until admitted or out of budget (see
    /// [`delay::wait_for`]); a client that leaves meanwhile ends it with [`Checked::ClientGone`].
    pub(super) async fn check(
        &self,
        session: &mut Session,
        bucket: &str,
        route: &Route,
    ) -> Checked {
        let policy = Policy::of(route);
        let (mut result, mut by) = self.decide(bucket, route, policy).await;
        let first = delay::wait_for(policy, &result, Duration::ZERO, 1);
        let (Some(mut wait), Some(smoothing)) = (first, policy.smoothing) else {
            return Checked::Decided {
                policy,
                result,
                by,
                delayed: false,
            };
        };
        let Some(_place) = self.queues.join(bucket, smoothing.max_queue) else {
            return Checked::Decided {
                policy,
                result,
                by,
                delayed: false,
            };
        };
        let started = Instant::now();
        let mut decisions = 1;
        loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                gone = delay::client_gone(session) => {
                    log::debug!("route {}: {bucket}: {gone}", route.spec.name);
                    route.metrics.delay.observe(started.elapsed().as_secs_f64());
                    return Checked::ClientGone;
                }
            }
            (result, by) = self.decide(bucket, route, policy).await;
            decisions += 1;
            match delay::wait_for(policy, &result, started.elapsed(), decisions) {
                Some(next) => wait = next,
                None => break,
            }
        }
        route.metrics.delay.observe(started.elapsed().as_secs_f64());
        Checked::Decided {
            policy,
            result,
            by,
            delayed: true,
        }
    }

    /// The verdict for `bucket` on `route`, and who gave it.
    async fn decide(
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
