//! Concurrency limits (leases): exactly N held under concurrency, a denial that promises at
//! most 1 s, a release that frees one lease and nothing of a log beside it, a log of the same
//! window that is another record, and a lease not given back leaving at its deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::store::{check, ROUTE};
use futures::future::join_all;
use slidegate::limiter::{Admission, Buckets, Limit, Store};

/// The lease's deadline: short, so the case sees one pass.
const TTL: Duration = Duration::from_secs(1);

pub async fn leases_held_released_and_expired(store: Arc<dyn Store>) {
    let (lease, log) = (Limit::lease(3, TTL), Limit::log(100, TTL));
    let limits = [lease, log];
    let b = "lease:client";
    let t0 = Instant::now();
    let calls = (0..200).map(|_| {
        let store = store.clone();
        tokio::spawn(async move { store.check(ROUTE, &Buckets::one(b), &limits).await })
    });
    let verdicts: Vec<_> = (join_all(calls).await.into_iter())
        .map(|r| r.unwrap().expect("check failed"))
        .collect();
    let admitted: Vec<_> = verdicts.iter().filter(|v| v.admitted).collect();
    assert_eq!(admitted.len(), 3, "exactly N leases");
    let denied = verdicts.iter().find(|v| !v.admitted).unwrap();
    assert_eq!(denied.violated().collect::<Vec<_>>(), [0], "{denied:?}");
    assert!(denied.retry_after().unwrap() <= Duration::from_secs(1));
    // The release gives back one lease (the leases alone, as the proxy sends it).
    let at = admitted[0].recorded_times().unwrap().to_vec();
    (store
        .refund(Admission::new(ROUTE, &Buckets::one(b), &[lease], &at[..1]))
        .await)
        .unwrap();
    let again = check(&store, b, &limits).await;
    assert!(again.admitted, "{again:?}");
    assert_eq!(again.states[0].remaining, 0);
    // The log beside it kept every admission, the released one too: 4 of 100.
    assert_eq!(again.states[1].remaining, 96);
    assert!(!check(&store, b, &limits).await.admitted);
    let view = store.inspect(b, &limits).await.unwrap();
    assert_eq!((view.limits[0].count, view.limits[1].count), (3, 4));
    // Leases not given back leave at their deadline, one lease_ttl after they were taken.
    tokio::time::sleep_until((t0 + TTL + Duration::from_millis(300)).into()).await;
    let late = (store.inspect(b, &limits).await.unwrap().limits[0]).count;
    assert!(late <= 1, "{late} leases left after their deadline");
    assert!(check(&store, b, &limits).await.admitted);
}

/// A renewed lease outlives its first deadline and is released by its new time; the entry it
/// replaced, or a lease given back, renews nothing.
pub async fn a_renewed_lease_outlives_its_first_deadline(store: Arc<dyn Store>) {
    let limits = [Limit::lease(1, TTL)];
    let b = Buckets::one("renew:client");
    let t0 = Instant::now();
    let first = store.check(ROUTE, &b, &limits).await.unwrap();
    let at = first.recorded_at.expect("admitted");
    tokio::time::sleep_until((t0 + Duration::from_millis(600)).into()).await;
    let renewed = store
        .renew(Admission::new(ROUTE, &b, &limits, &[at]))
        .await
        .unwrap();
    assert!(renewed[0] > at, "{renewed:?} after {at}");
    assert_eq!(
        store
            .renew(Admission::new(ROUTE, &b, &limits, &[at]))
            .await
            .unwrap(),
        [0]
    );
    // Past the first deadline: still held.
    tokio::time::sleep_until((t0 + TTL + Duration::from_millis(200)).into()).await;
    assert!(!store.check(ROUTE, &b, &limits).await.unwrap().admitted);
    store
        .refund(Admission::new(ROUTE, &b, &limits, &renewed))
        .await
        .unwrap();
    assert_eq!(
        store
            .renew(Admission::new(ROUTE, &b, &limits, &renewed))
            .await
            .unwrap(),
        [0]
    );
    assert!(store.check(ROUTE, &b, &limits).await.unwrap().admitted);
}
