//! The limiter side of the proxy: ask the route's store, time and count the answer, fall
//! back to this proxy's own log when the shared store cannot decide (`on_error = "local"`), and
//! let a denial wait for room when the route smooths bursts (`max_delay`, see [`super::delay`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::proxy::Session;

use super::delay::{self, Queues};
use super::outcome::{Checked, Policy};
use crate::config::OnError;
use crate::limiter::fallback::Fallback;
use crate::limiter::{Ask, Buckets, Decide, Decided, Limit, Store};
use crate::metrics::LimiterMetrics;
use crate::routes::Route;

/// The stores a request's decision may come from, and their metric handles.
pub(super) struct Limiter {
    /// The shared store, and this proxy's own log in front of its failures.
    pub(super) fallback: Fallback<LimiterMetrics>,
    /// Requests waiting for room, per bucket (`max_queue`).
    queues: Queues,
}

impl Limiter {
    /// Decide with `store`, which owns the decision deadline (see [`Store`]): no second timer
    /// runs here.
    pub(super) fn new(store: Arc<dyn Store>) -> Limiter {
        let metrics = LimiterMetrics::new(store.backend());
        Limiter {
            fallback: Fallback::new(store, metrics),
            queues: Queues::default(),
        }
    }

    /// The store decisions go to (for tests that build a second proxy on the same one).
    #[cfg(test)]
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        self.fallback.shared()
    }

    /// What the limits say of a request counted in `buckets` on `route`. A denial whose slot
    /// frees within the route's `max_delay` waits for it, with a place in the queue of the
    /// client's own bucket (the route's key, also when a limit of its own denied) and
    /// one of the process's `max_delayed` (none left: answered at once), and is decided again
    /// until admitted or out of budget (see [`delay::wait_for`]); a client that leaves
    /// meanwhile ends it with [`Checked::ClientGone`].
    pub(super) async fn check(
        &self,
        session: &mut Session,
        buckets: &Buckets<'_>,
        route: &Route,
        max_delayed: u32,
        cost: u32,
    ) -> Checked {
        let policy = Policy::of(route);
        let bucket = buckets.first();
        let weighted = weighted(route, cost);
        let limits = weighted.as_deref().unwrap_or(&route.spec.limits);
        let ask = Ask {
            route: &route.spec.name,
            buckets,
            limits,
            local: policy.on_error == OnError::Local,
        };
        let Decided { mut result, mut by } = self.fallback.decide(ask).await;
        let first = delay::wait_for(policy, &result, Duration::ZERO, 1);
        let (Some(mut wait), Some(smoothing)) = (first, policy.smoothing) else {
            return Checked::Decided {
                policy,
                result,
                by,
                delayed: false,
            };
        };
        let Some(_place) = self.queues.join(bucket, smoothing.max_queue, max_delayed) else {
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
            // The store measures `reset` from when it decides, which is after this instant and
            // before its answer arrives: timed from here, how long an answer took on its way
            // back never counts against the budget (see `delay::wait_for`).
            let asked = started.elapsed();
            Decided { result, by } = self.fallback.decide(ask).await;
            decisions += 1;
            match delay::wait_for(policy, &result, asked, decisions) {
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
}

/// The route's limits as a request of `cost` counts in them (its cost limits weigh `cost`);
/// `None` for a route without cost limits, whose limits are used as configured.
pub(super) fn weighted(route: &Route, cost: u32) -> Option<Vec<Limit>> {
    (route.spec.cost.is_weighted())
        .then(|| route.spec.limits.iter().map(|l| l.weighted(cost)).collect())
}
