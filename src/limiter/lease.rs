//! The lease layer (concurrency limits): a task tied to the request renews its leases every
//! `lease_ttl / 3` while it runs, so a long stream keeps them, and gives them back when the
//! request ends ([`Lease`] dropped). A client that leaves does not end it: the patched Pingora
//! (`vendor/README.md`, patch three) reads the upstream's response to its end first, at most
//! `read_timeout`, so an app that goes on working is still counted. The same task renews and
//! releases, so a release never races a renewal in flight: it always names the lease's newest
//! time. A proxy that dies takes its tasks with it; its leases then leave at their deadline.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::oneshot;

use super::settle::Recorded;
use super::Store;

/// A request's leases: dropping it has its task give them back.
pub struct Lease {
    _end: oneshot::Sender<()>,
}

/// What the task that keeps a request's leases needs of the request, owned (the memory
/// store's `summary::Held` is what an evicted bucket still holds).
struct Holder {
    store: Arc<dyn Store>,
    /// The lease limits, each at its current time (0 once lapsed).
    recorded: Recorded,
    /// `slidegate_leases_held{route}`: held while the task holds the leases.
    gauge: IntGauge,
}

/// Hold the leases of `recorded` (the admission's concurrency limits, one time per limit) in
/// `store`, counted in `gauge`, until the returned [`Lease`] is dropped.
pub fn hold(store: Arc<dyn Store>, recorded: Recorded, gauge: IntGauge) -> Lease {
    let (end, ended) = oneshot::channel();
    gauge.inc();
    let held = Holder {
        store,
        recorded,
        gauge,
    };
    tokio::spawn(keep(held, ended));
    Lease { _end: end }
}

/// Renew every `lease_ttl / 3` (of the shortest) until the request ends, then give back.
async fn keep(mut held: Holder, mut ended: oneshot::Receiver<()>) {
    let ttl = held.recorded.limits().iter().map(|l| l.window).min();
    let every = ttl.unwrap_or(Duration::from_secs(1)) / 3;
    loop {
        tokio::select! {
            _ = &mut ended => break,
            _ = tokio::time::sleep(every) => held.renew().await,
        }
    }
    held.release().await;
}

impl Holder {
    /// One renewal: a failed one keeps the times, to be tried again at the next turn (the
    /// lease lasts a whole `lease_ttl` from the last success).
    async fn renew(&mut self) {
        let route = self.recorded.route();
        match self.recorded.renew(&*self.store).await {
            Ok(at) => {
                // A lease that was held and is gone now (0) lapsed: a store unreachable for a
                // whole `lease_ttl`, or a failover that lost the write. The request runs on
                // uncounted, so say so once.
                let was = self.recorded.at();
                let lapsed = (was.iter().zip(&at)).any(|(was, now)| *was != 0 && *now == 0);
                if lapsed {
                    log::warn!(
                        "route {route}: a running request's concurrency lease lapsed in the store \
                         (unreachable for a whole lease_ttl, or lost in a failover); it runs on \
                         uncounted"
                    );
                }
                self.recorded.set_at(at);
            }
            Err(e) => log::debug!("route {route}: a lease renewal failed: {e}"),
        }
    }

    /// Give back every lease still held (a lapsed one, time 0, names no entry), then leave the
    /// gauge: a client that sees it drop finds the lease free in the store.
    async fn release(self) {
        let result = (self.recorded)
            .refund(&*self.store, super::Change::GiveBack)
            .await;
        if let Err(e) = result {
            log::debug!(
                "route {}: a lease stays held until its deadline: {e}",
                self.recorded.route()
            );
        }
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::clock::FakeClock;
    use crate::limiter::memory::MemoryStore;
    use crate::limiter::settle::{scope_of, Scope};
    use crate::limiter::{Buckets, Limit};

    /// A lease is held while its request runs, renewed past its `lease_ttl`, and given back
    /// when the request ends: the store on a fake clock moved with paused time.
    #[tokio::test(start_paused = true)]
    async fn a_lease_is_renewed_while_held_and_given_back_when_dropped() {
        let clock = FakeClock::default();
        let store = Arc::new(MemoryStore::new().with_clock(clock.clone()));
        let limits = [Limit::lease(1, Duration::from_secs(3))];
        let buckets = Buckets::one("r:c");
        let decide = || store.check("r", &buckets, &limits);
        let first = decide().await.unwrap();
        assert!(first.admitted);
        let part = scope_of(Scope::Leases, &limits, &[], first.recorded_times().unwrap());
        let recorded = Recorded::new("r", ("r:c", &[]), part.expect("a lease limit"));
        let gauge = IntGauge::new("leases", "leases").unwrap();
        let lease = hold(store.clone(), recorded, gauge.clone());
        assert_eq!(gauge.get(), 1);
        // Three lease_ttl in steps of 100 ms: renewed every second, it never lapses.
        for _ in 0..90 {
            clock.advance(Duration::from_millis(100));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!decide().await.unwrap().admitted, "the lease still holds");
        drop(lease);
        while gauge.get() != 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(decide().await.unwrap().admitted, "given back when dropped");
    }

    /// Without renewals a lease lapses at its deadline: what the renewals above prevent.
    #[tokio::test]
    async fn an_unrenewed_lease_lapses() {
        let clock = FakeClock::default();
        let store = MemoryStore::new().with_clock(clock.clone());
        let limits = [Limit::lease(1, Duration::from_secs(3))];
        let buckets = Buckets::one("r:c");
        let decide = || store.check("r", &buckets, &limits);
        assert!(decide().await.unwrap().admitted);
        clock.advance(Duration::from_secs(3));
        assert!(decide().await.unwrap().admitted);
    }
}
