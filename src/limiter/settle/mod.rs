//! The settle layer (`count_status`, `settle`): an admission stays counted while its request
//! is in flight; when its response ends it is given back in the limits that count requests
//! (its status is not counted), or its charge in the cost limits is corrected to the real cost
//! the upstream reported, given back or charged on top. The pure rules are in
//! [`correction`](mod@correction); [`amend`] sends a correction to the store that recorded the
//! admission ([`Fallback::store_of`](super::fallback::Fallback::store_of)), off the response
//! path.

pub mod correction;

use std::sync::Arc;

pub use correction::{
    correction, counts, scope_of, Correction, Counts, Ended, Reported, Scope, Settlement, Ticket,
};

use super::{Admission, Buckets, Change, Limit, Store, StoreError};

/// An admission as its store recorded it, owned (a task that outlives the request holds it):
/// its route, its buckets, the limits concerned and their record times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    route: String,
    bucket: String,
    own: Vec<String>,
    of_limit: Vec<u8>,
    limits: Vec<Limit>,
    at: Vec<u64>,
}

impl Recorded {
    /// The admission of `route` in `bucket` (the route's) and `own` (the limits' own keys'),
    /// of `limits` with their buckets' indexes and record times (as [`scope_of`] gives them).
    pub fn new(
        route: &str,
        (bucket, own): (&str, &[String]),
        (limits, of_limit, at): (Vec<Limit>, Vec<u8>, Vec<u64>),
    ) -> Recorded {
        Recorded {
            route: route.to_owned(),
            bucket: bucket.to_owned(),
            own: own.to_vec(),
            of_limit,
            limits,
            at,
        }
    }

    /// The route's name.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The limits concerned.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The record time of each limit (one for all, or one per limit).
    pub fn at(&self) -> &[u64] {
        &self.at
    }

    /// The record times, replaced (a lease renewed).
    pub fn set_at(&mut self, at: Vec<u64>) {
        self.at = at;
    }

    /// The bucket of each limit.
    pub fn buckets(&self) -> Buckets<'_> {
        Buckets::stacked(&self.bucket, &self.own, &self.of_limit)
    }

    /// Give back (or with [`Change::Charge`] charge) this admission in `store`.
    pub async fn refund(&self, store: &dyn Store, change: Change) -> Result<(), StoreError> {
        let buckets = self.buckets();
        let admission = Admission::new(&self.route, &buckets, &self.limits, &self.at);
        store.refund(admission.with_change(change)).await
    }

    /// Renew this admission's leases in `store`: their new times (see [`Store::renew`]).
    pub async fn renew(&self, store: &dyn Store) -> Result<Vec<u64>, StoreError> {
        let buckets = self.buckets();
        (store.renew(Admission::new(
            &self.route,
            &buckets,
            &self.limits,
            &self.at,
        )))
        .await
    }
}

/// Apply `change` to `recorded` in `store`, in a task of its own: the response does not wait
/// for the store, and until the store has applied it the admission counts as charged (the
/// bound errs on the safe side for a give back; a charge lands a moment late). A failure leaves
/// the charge as it was. `done` is told how it went.
pub fn amend<F>(store: Arc<dyn Store>, recorded: Recorded, change: Change, done: F)
where
    F: FnOnce(&Result<(), StoreError>) + Send + 'static,
{
    tokio::spawn(async move {
        let result = recorded.refund(&*store, change).await;
        if let Err(e) = &result {
            log::debug!(
                "route {}: correcting an admission failed, it stands: {e}",
                recorded.route
            );
        }
        done(&result);
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;
    use crate::limiter::fixtures::Counting;

    #[tokio::test]
    async fn an_amend_gives_back_in_the_store_and_says_so() {
        let store = Arc::new(Counting::default());
        let limits = [Limit::log(1, Duration::from_secs(60))];
        let buckets = Buckets::one("r:c");
        let decide = || store.check("r", &buckets, &limits);
        let first = decide().await.unwrap();
        assert!(first.admitted);
        assert!(!decide().await.unwrap().admitted, "the limit is full");
        let part = scope_of(
            Scope::Counted,
            &limits,
            &[],
            first.recorded_times().unwrap(),
        );
        let recorded = Recorded::new("r", ("r:c", &[]), part.expect("a counted limit"));
        let (tell, told) = oneshot::channel();
        amend(store.clone(), recorded, Change::GiveBack, move |r| {
            let _ = tell.send(r.is_ok());
        });
        assert!(told.await.unwrap(), "given back");
        assert!(decide().await.unwrap().admitted, "room again");
    }
}
