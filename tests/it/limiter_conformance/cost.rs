//! The cases of cost limits (`unit = "cost"`): a decision weighs its cost in the cost limits
//! and 1 in the request limits, exactly under concurrency and all-or-nothing across them; a
//! refund gives back the charged cost.

use std::sync::Arc;
use std::time::Duration;

use crate::common::store::{check, inspect, limit};
use futures::future::join_all;
use slidegate::limiter::{Admission, Buckets, Change, Limit, Store};

const WINDOW: Duration = Duration::from_secs(60);
const QUOTA: u32 = 1000;

fn quota() -> Limit {
    Limit::cost(QUOTA, WINDOW, Duration::from_secs(1))
}

/// 200 concurrent decisions of random cost (0..=60) against a quota of 1000 and 150 requests:
/// the admitted costs sum to at most the quota, the store counts exactly their sum, no more
/// than 150 are admitted, and a request that did not fit left nothing behind.
pub async fn cost_exact_under_concurrency(store: Arc<dyn Store>) {
    let mut rng = fastrand::Rng::with_seed(35);
    let costs: Vec<u32> = (0..200).map(|_| rng.u32(0..=60)).collect();
    let runs = costs.iter().map(|&cost| {
        let store = store.clone();
        async move {
            let limits = [quota().weighted(cost), limit(150, WINDOW).weighted(cost)];
            (cost, check(&store, "cost:a", &limits).await)
        }
    });
    let verdicts = join_all(runs).await;
    let admitted: Vec<u32> = (verdicts.iter().filter(|(_, v)| v.admitted))
        .map(|(c, _)| *c)
        .collect();
    let sum: u32 = admitted.iter().sum();
    assert!(
        sum <= QUOTA,
        "{}: admitted {sum} > {QUOTA}",
        store.backend()
    );
    assert!(admitted.len() <= 150);
    assert!(
        sum + 60 > QUOTA || admitted.len() == 150,
        "{}: only {sum}",
        store.backend()
    );
    let views = inspect(&store, "cost:a", &[quota(), limit(150, WINDOW)]).await;
    assert_eq!(views[0].count, u64::from(sum), "{}", store.backend());
    assert_eq!(views[1].count, admitted.len() as u64, "{}", store.backend());
    for (cost, v) in verdicts.iter().filter(|(_, v)| !v.admitted) {
        assert_eq!(
            v.states[0].remaining, 0,
            "a cost of {cost} that did not fit: {v:?}"
        );
        assert!(v.retry_after().is_some());
    }
}

/// All-or-nothing with a request limit: a full request limit denies a request of cost 0 and
/// of cost 10 alike, and neither is charged; a cost that does not fit takes no request slot;
/// cost 0 is admitted without consuming; a refund gives back the charged cost.
pub async fn cost_and_requests_all_or_nothing(store: Arc<dyn Store>) {
    let both = |cost| [quota().weighted(cost), limit(2, WINDOW).weighted(cost)];
    let v = check(&store, "cost:b", &both(990)).await;
    assert!(v.admitted);
    assert_eq!((v.states[0].remaining, v.states[1].remaining), (10, 1));
    let v = check(&store, "cost:b", &both(11)).await;
    assert!(!v.admitted, "11 does not fit in 10: {v:?}");
    assert_eq!(v.violated().collect::<Vec<_>>(), [0]);
    assert_eq!(v.states[1].remaining, 1, "the denial took no request slot");
    let zero = check(&store, "cost:b", &both(0)).await;
    assert!(zero.admitted);
    assert_eq!(
        (zero.states[0].remaining, zero.states[1].remaining),
        (10, 0)
    );
    let full = check(&store, "cost:b", &both(0)).await;
    assert!(!full.admitted, "the request limit is full: {full:?}");
    assert_eq!(full.violated().collect::<Vec<_>>(), [1]);
    let counts = inspect(&store, "cost:b", &both(1)).await;
    assert_eq!((counts[0].count, counts[1].count), (990, 2));

    let one = [quota().weighted(400)];
    let v = check(&store, "cost:c", &one).await;
    let at = v.recorded_times().expect("recorded").to_vec();
    let buckets = Buckets::one("cost:c");
    store
        .refund(Admission::new(
            crate::common::store::ROUTE,
            &buckets,
            &one,
            &at,
        ))
        .await
        .expect("refund");
    assert_eq!(inspect(&store, "cost:c", &one).await[0].count, 0);
}

/// A settle: a charge adds with no room check, so the bucket goes into debt and denies until
/// the window frees it; a give-back lowers it again; a request limit (a log) takes no charge;
/// a charge lands in the slot of now, whatever time its admission names.
pub async fn settle_charges_into_debt_and_gives_back(store: Arc<dyn Store>) {
    let (route, bucket) = (crate::common::store::ROUTE, "cost:d");
    let buckets = Buckets::one(bucket);
    let both = |cost| [quota().weighted(cost), limit(5, WINDOW).weighted(cost)];
    let v = check(&store, bucket, &both(400)).await;
    let at = v.recorded_times().expect("recorded").to_vec();
    amend(
        &store,
        Admission::new(route, &buckets, &both(700), &at),
        Change::Charge,
    )
    .await;
    let counts = inspect(&store, bucket, &both(1)).await;
    assert_eq!(
        (counts[0].count, counts[1].count),
        (1100, 1),
        "{}",
        store.backend()
    );
    let denied = check(&store, bucket, &both(1)).await;
    assert!(!denied.admitted, "in debt: {denied:?}");
    assert_eq!(denied.states[0].remaining, 0);
    assert!(denied.retry_after().is_some());
    amend(
        &store,
        Admission::new(route, &buckets, &both(300), &at),
        Change::GiveBack,
    )
    .await;
    let counts = inspect(&store, bucket, &both(1)).await;
    assert_eq!(counts[0].count, 800, "{}", store.backend());
    let v = check(&store, bucket, &both(150)).await;
    assert!(v.admitted, "{v:?}");
    assert_eq!(v.states[0].remaining, 50);
    // Nothing was recorded 5 s after it (slots of 1 s): the charge still lands, now.
    let never = [at[0] + 5_000_000];
    let huge = both(5000);
    let stray = Admission::new(route, &buckets, &huge[..1], &never);
    amend(&store, stray, Change::Charge).await;
    assert_eq!(inspect(&store, bucket, &both(1)).await[0].count, 5950);
}

/// A charge whose admission has left the window (a response that outlasted it) lands in the
/// slot of now, and stays one window from there; one for a bucket the store no longer holds
/// (or never did) creates it. The charge used to go where the admission was counted, and
/// vanish with it.
pub async fn a_charge_outlives_its_admissions_slot(store: Arc<dyn Store>) {
    let (route, bucket) = (crate::common::store::ROUTE, "cost:late");
    let buckets = Buckets::one(bucket);
    let window = Duration::from_secs(1);
    let short = |cost| [Limit::cost(QUOTA, window, Duration::from_millis(100)).weighted(cost)];
    let t0 = tokio::time::Instant::now();
    let v = check(&store, bucket, &short(400)).await;
    let at = v.recorded_times().expect("recorded").to_vec();
    // The admission's slot (100 ms) leaves 1.1 s after it at the latest.
    tokio::time::sleep_until(t0 + Duration::from_millis(1300)).await;
    assert_eq!(inspect(&store, bucket, &short(1)).await[0].count, 0);
    let late = short(700);
    amend(
        &store,
        Admission::new(route, &buckets, &late, &at),
        Change::Charge,
    )
    .await;
    assert_eq!(
        inspect(&store, bucket, &short(1)).await[0].count,
        700,
        "{}",
        store.backend()
    );
    let denied = check(&store, bucket, &short(301)).await;
    assert!(!denied.admitted, "{}: {denied:?}", store.backend());
    // A bucket with nothing recorded: the charge creates it.
    let (fresh, none) = ("cost:fresh", Buckets::one("cost:fresh"));
    let charge = short(250);
    amend(
        &store,
        Admission::new(route, &none, &charge, &at),
        Change::Charge,
    )
    .await;
    assert_eq!(inspect(&store, fresh, &short(1)).await[0].count, 250);
}

async fn amend(store: &Arc<dyn Store>, admission: Admission<'_>, change: Change) {
    let admission = admission.with_change(change);
    store.refund(admission).await.expect("refund or charge");
}
