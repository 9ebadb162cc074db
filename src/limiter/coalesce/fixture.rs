//! A test fixture: any [`Store`] behind the coalescer with the local deny cache on, as the
//! Redis store puts Redis, so the unit tests of what reads a cached denial (the proxy's
//! `max_delay` waits) run the real lanes and memory over an in-process store.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::sender::{self, Backend, Coalescer};
use super::Pending;
use crate::limiter::{Buckets, Checked, Store, StoreError};

/// See the module documentation.
pub(crate) struct Cached<S> {
    store: Arc<S>,
    coalescer: Coalescer,
}

impl<S: Store + 'static> Cached<S> {
    /// `store` behind one lane, denials trusted for `max_age`.
    pub(crate) fn new(store: Arc<S>, max_age: Duration) -> Arc<Cached<S>> {
        let coalescer = Coalescer::new(1);
        coalescer.known().serve_cache(max_age);
        Arc::new(Cached { store, coalescer })
    }

    /// Decide one request for `bucket`, from the memory or through the store.
    pub(crate) async fn check(
        self: &Arc<Self>,
        bucket: &str,
        limits: &[crate::limiter::Limit],
    ) -> Checked {
        sender::decide(self, &Buckets::one(bucket), limits).await
    }
}

impl<S: Store + 'static> Backend for Cached<S> {
    fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    fn lane_of(&self, _bucket: &str) -> usize {
        0
    }

    fn generation(&self) -> u64 {
        self.store.generation()
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        drop(tokio::spawn(task));
    }

    fn deadline(&self) -> Duration {
        Duration::from_secs(5)
    }

    fn timed_out(&self, _error: &StoreError) {}

    /// The batch's decisions one by one, in order.
    async fn send(&self, batch: &[Pending]) -> Result<Vec<Checked>, StoreError> {
        let mut verdicts = Vec::with_capacity(batch.len());
        for p in batch {
            verdicts.push(
                self.store
                    .check("r", &Buckets::one(&p.bucket), &p.limits)
                    .await,
            );
        }
        Ok(verdicts)
    }
}
