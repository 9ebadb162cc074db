//! A request's leases (concurrency limits): a task tied to the request renews them every
//! `lease_ttl / 3` while it runs, so a long stream keeps its leases, and gives them back when
//! the request ends ([`Lease`] dropped or ended in `logging`). A client that leaves does not end
//! it: the patched Pingora (`vendor/README.md`, patch three) reads the upstream's response to its
//! end first, at most `read_timeout`, so an app that goes on working is still counted. The same
//! task renews and releases, so a release never races a renewal in flight: it always names the
//! lease's newest time. A proxy that dies takes its tasks with it; its leases then leave at their
//! deadline.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::oneshot;

use super::limiter::Limiter;
use super::outcome::DecidedBy;
use super::refund::{part_of, Part};
use crate::limiter::{Admission, Buckets, Limit, Store};
use crate::routes::Route;

/// A request's leases: ending it (or dropping it) has its task give them back.
pub(super) struct Lease {
    _end: oneshot::Sender<()>,
}

/// What the task needs of the request, owned.
struct Held {
    store: Arc<dyn Store>,
    route: String,
    bucket: String,
    own: Vec<String>,
    of_limit: Vec<u8>,
    limits: Vec<Limit>,
    /// Each lease limit's current time, 0 once lapsed.
    at: Vec<u64>,
    /// `slidegate_leases_held{route}`.
    gauge: IntGauge,
}

impl Limiter {
    /// Hold the leases of an admission of `route` recorded at `recorded_at` by `by`, in the
    /// buckets `bucket` and `own`; `None` when the route has no concurrency limit.
    pub(super) fn hold_leases(
        &self,
        route: &Route,
        bucket: &str,
        own: &[String],
        recorded_at: &[u64],
        by: DecidedBy,
    ) -> Option<Lease> {
        let store = self.fallback().store_of(by)?.clone();
        let of_limit = &route.spec.limit_keys.of_limit;
        let (limits, of_limit, at) =
            part_of(Part::Leases, &route.spec.limits, of_limit, recorded_at)?;
        let at = (0..limits.len()).map(|i| at[i.min(at.len() - 1)]).collect();
        let (end, ended) = oneshot::channel();
        let held = Held {
            store,
            route: route.spec.name.clone(),
            bucket: bucket.to_owned(),
            own: own.to_vec(),
            of_limit,
            limits,
            at,
            gauge: route.metrics.leases_held.clone(),
        };
        held.gauge.inc();
        tokio::spawn(keep(held, ended));
        Some(Lease { _end: end })
    }
}

/// Renew every `lease_ttl / 3` (of the shortest) until the request ends, then give back.
async fn keep(mut held: Held, mut ended: oneshot::Receiver<()>) {
    let ttl = held.limits.iter().map(|l| l.window).min();
    let every = ttl.unwrap_or(Duration::from_secs(1)) / 3;
    loop {
        tokio::select! {
            _ = &mut ended => break,
            _ = tokio::time::sleep(every) => held.renew().await,
        }
    }
    held.release().await;
}

impl Held {
    fn buckets(&self) -> Buckets<'_> {
        Buckets::stacked(&self.bucket, &self.own, &self.of_limit)
    }

    /// One renewal: a failed one keeps the times, to be tried again at the next turn (the
    /// lease lasts a whole `lease_ttl` from the last success).
    async fn renew(&mut self) {
        let renewed = (self.store)
            .renew(Admission::new(
                &self.route,
                &self.buckets(),
                &self.limits,
                &self.at,
            ))
            .await;
        match renewed {
            Ok(at) => {
                // A lease that was held and is gone now (0) lapsed: a store unreachable for a
                // whole `lease_ttl`, or a failover that lost the write. The request runs on
                // uncounted, so say so once.
                let lapsed = (self.at.iter().zip(&at)).any(|(was, now)| *was != 0 && *now == 0);
                if lapsed {
                    log::warn!(
                        "route {}: a running request's concurrency lease lapsed in the store \
                         (unreachable for a whole lease_ttl, or lost in a failover); it runs on \
                         uncounted",
                        self.route
                    );
                }
                self.at = at;
            }
            Err(e) => log::debug!("route {}: a lease renewal failed: {e}", self.route),
        }
    }

    /// Give back every lease still held (a lapsed one, time 0, names no entry), then leave the
    /// gauge: a client that sees it drop finds the lease free in the store.
    async fn release(self) {
        let result = (self.store)
            .refund(Admission::new(
                &self.route,
                &self.buckets(),
                &self.limits,
                &self.at,
            ))
            .await;
        if let Err(e) = result {
            log::debug!(
                "route {}: a lease stays held until its deadline: {e}",
                self.route
            );
        }
        self.gauge.dec();
    }
}
