//! The limiter side of the proxy: the route's policy read into the limiter's layers
//! ([`Smoothing`] around [`Fallback`] around the store, see [`crate::limiter::layer`]), the
//! answer timed and counted in the route's metrics, and the client a waiting request watches.

use std::sync::Arc;

use pingora::prelude::*;
use pingora::proxy::Session;

use super::outcome::{Findings, Policy};
use crate::config::OnError;
use crate::limiter::fallback::Fallback;
use crate::limiter::lease::{self, Lease};
use crate::limiter::settle::{scope_of, Recorded, Scope};
use crate::limiter::smoothing::{Budget, Client, QueueMetrics, Smoothed, Smoothing};
use crate::limiter::{Ask, Buckets, DecidedBy, Limit, Store};
use crate::metrics::{LimiterMetrics, METRICS};
use crate::routes::Route;

/// The limiter's layers a request's decision goes through.
pub(super) struct Limiter {
    /// Waiting for room, around the shared store and this proxy's own log.
    pub(super) layers: Smoothing<Fallback<LimiterMetrics>>,
}

impl Limiter {
    /// Decide with `store`, which owns the decision deadline (see [`Store`]): no second timer
    /// runs here.
    pub(super) fn new(store: Arc<dyn Store>) -> Limiter {
        let metrics = LimiterMetrics::new(store.backend());
        let queues = QueueMetrics {
            waiting: METRICS.waiting.clone(),
            refused: METRICS.delay_refused.clone(),
        };
        Limiter {
            layers: Smoothing::new(Fallback::new(store, metrics), queues),
        }
    }

    /// The shared store and this proxy's own log.
    pub(super) fn fallback(&self) -> &Fallback<LimiterMetrics> {
        self.layers.inner()
    }

    /// Decide with `local` while the shared store cannot, on routes with `on_error = "local"`.
    pub(super) fn set_local(&mut self, local: Option<Arc<dyn Store>>, learned_buckets: usize) {
        let fallback = self.layers.inner_mut();
        fallback.set_local(local);
        fallback.set_learned_capacity(learned_buckets);
    }

    /// The store decisions go to (for tests that build a second proxy on the same one).
    #[cfg(test)]
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        self.fallback().shared()
    }

    /// What the limits say of a request counted in `buckets` on `route`, weighing `cost` in
    /// its cost limits; a denial may wait for room (`max_delay`, at most `max_delayed` waiters
    /// over the process), and a client that leaves meanwhile ends it with
    /// [`Findings::ClientGone`].
    pub(super) async fn decide(
        &self,
        session: &mut Session,
        buckets: &Buckets<'_>,
        route: &Route,
        max_delayed: u32,
        cost: u32,
    ) -> Findings {
        let policy = Policy::of(route);
        let weighted = weighted(route, cost);
        let limits = weighted.as_deref().unwrap_or(&route.spec.limits);
        let ask = Ask {
            route: &route.spec.name,
            buckets,
            limits,
            local: policy.on_error == OnError::Local,
        };
        // A shadow route never delays.
        let budget = (policy.smoothing.filter(|_| !policy.shadow)).map(|s| Budget {
            max_delay: s.max_delay,
            max_queue: s.max_queue,
            max_delayed,
        });
        match self.layers.decide(ask, budget, &mut Waiting(session)).await {
            Smoothed::Decided { decided, waited } => {
                if let Some(waited) = waited {
                    route.metrics.delay.observe(waited.as_secs_f64());
                }
                Findings::Decided {
                    policy,
                    result: decided.result,
                    by: decided.by,
                    delayed: waited.is_some(),
                }
            }
            Smoothed::ClientGone { why, waited } => {
                log::debug!("route {}: {}: {why}", route.spec.name, buckets.first());
                route.metrics.delay.observe(waited.as_secs_f64());
                Findings::ClientGone
            }
        }
    }
}

impl Limiter {
    /// Hold the leases of an admission of `route` recorded at `recorded_at` by `by`, in the
    /// buckets `bucket` and `own` (see [`crate::limiter::lease`]); `None` when the route has
    /// no concurrency limit.
    pub(super) fn hold_leases(
        &self,
        route: &Route,
        (bucket, own): (&str, &[String]),
        recorded_at: &[u64],
        by: DecidedBy,
    ) -> Option<Lease> {
        let store = self.fallback().store_of(by)?.clone();
        let of_limit = &route.spec.limit_keys.of_limit;
        let (limits, of_limit, at) =
            scope_of(Scope::Leases, &route.spec.limits, of_limit, recorded_at)?;
        let at = (0..limits.len()).map(|i| at[i.min(at.len() - 1)]).collect();
        let recorded = Recorded::new(&route.spec.name, (bucket, own), (limits, of_limit, at));
        Some(lease::hold(
            store,
            recorded,
            route.metrics.leases_held.clone(),
        ))
    }
}

/// The route's limits as a request of `cost` counts in them (its cost limits weigh `cost`);
/// `None` for a route without cost limits, whose limits are used as configured.
pub(super) fn weighted(route: &Route, cost: u32) -> Option<Vec<Limit>> {
    (route.spec.cost.is_weighted())
        .then(|| route.spec.limits.iter().map(|l| l.weighted(cost)).collect())
}

/// The client of a request waiting for room.
struct Waiting<'a>(&'a mut Session);

impl Client for Waiting<'_> {
    type Gone = Box<Error>;

    /// Resolves when the client is gone, with the error to end it with: an HTTP/2 stream the
    /// client reset (or whose connection closed), an HTTP/1 connection the client closed. An
    /// HTTP/1 request whose body is not read yet is not watched (reading it here would take the
    /// body from the upstream): it keeps its place until its wait ends, `max_delay` at most.
    async fn gone(&mut self) -> Box<Error> {
        let session = &mut *self.0;
        if let Some(closed) = session.downstream_session.watch_h2_stream_close() {
            let why = match closed.await {
                Ok(reason) => format!("client closed the stream ({reason}) while it waited"),
                Err(e) => format!("client stream failed while it waited: {e}"),
            };
            return Error::explain(ErrorType::H2Error, why).into_down();
        }
        if session.downstream_session.is_body_done() {
            // Body done: this only probes the connection. A FIN is an error; bytes of a
            // pipelined next request are kept for it by Pingora and the probe stays pending.
            if let Err(e) = session.downstream_session.read_body_or_idle(true).await {
                return e.into_down();
            }
        }
        std::future::pending().await
    }
}
