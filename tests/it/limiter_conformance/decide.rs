//! The cases of deciding: exact counts, sliding windows, stacked and slotted limits, refunds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::store::{assert_near, check, limit, remaining, ROUTE, TOLERANCE};
use futures::future::join_all;
use slidegate::limiter::{Admission, Buckets, Limit, Store, Verdict};

/// 500 concurrent checks against 10/min admit exactly 10, each seeing a distinct `remaining`.
pub async fn exact_count_under_concurrency(store: Arc<dyn Store>) {
    exact_under_concurrency(store, limit(10, Duration::from_secs(60))).await;
}

/// The same for a slotted limit: 500 concurrent checks, exactly 10 admitted.
pub async fn slotted_exact_under_concurrency(store: Arc<dyn Store>) {
    let slotted = Limit::slotted(10, Duration::from_secs(60), Duration::from_millis(100));
    exact_under_concurrency(store, slotted).await;
}

async fn exact_under_concurrency(store: Arc<dyn Store>, limit: Limit) {
    let limits = [limit];
    let calls = (0..500).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .check(ROUTE, &Buckets::one("conc:client"), &limits)
                .await
        })
    });
    let verdicts: Vec<Verdict> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap().expect("check failed"))
        .collect();
    let admitted: Vec<&Verdict> = verdicts.iter().filter(|v| v.admitted).collect();
    assert_eq!(admitted.len(), 10, "{} admitted", admitted.len());
    let mut seen: Vec<u32> = admitted.iter().map(|v| v.states[0].remaining).collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..10).collect::<Vec<_>>(),
        "each admission saw its own count"
    );
    assert!(verdicts
        .iter()
        .filter(|v| !v.admitted)
        .all(|v| v.states[0].remaining == 0));
}

/// The fixed-window boundary burst does not get through a sliding window.
pub async fn boundary_burst(store: Arc<dyn Store>) {
    let limits = [limit(10, Duration::from_secs(2))];
    let t0 = Instant::now();
    for _ in 0..10 {
        assert!(check(&store, "burst:client", &limits).await.admitted);
    }
    tokio::time::sleep_until((t0 + Duration::from_millis(1600)).into()).await;
    for _ in 0..10 {
        let v = check(&store, "burst:client", &limits).await;
        assert!(!v.admitted, "admitted 1.6 s into a 2 s window that is full");
        let expected = Duration::from_millis(2000).saturating_sub(t0.elapsed());
        assert_near(v.retry_after().unwrap(), expected, "retry_after at 1.6 s");
    }
    tokio::time::sleep_until((t0 + Duration::from_millis(2400)).into()).await;
    for i in 0..10 {
        let v = check(&store, "burst:client", &limits).await;
        assert!(
            v.admitted,
            "request {i} denied after the window slid past the burst"
        );
    }
    assert!(!check(&store, "burst:client", &limits).await.admitted);
}

/// Stacked limits: a request denied by one limit is recorded in none.
pub async fn stacked_limits_all_or_nothing(store: Arc<dyn Store>) {
    let limits = [
        limit(3, Duration::from_secs(1)),
        limit(5, Duration::from_secs(10)),
    ];
    let b = "stacked:client";
    let t0 = Instant::now();
    for expected in [[2, 4], [1, 3], [0, 2]] {
        let v = check(&store, b, &limits).await;
        assert!(v.admitted);
        assert_eq!(remaining(&v), expected);
    }
    // Denied by the 1 s limit: the 10 s limit keeps its 2 remaining, however many are denied.
    for _ in 0..5 {
        let v = check(&store, b, &limits).await;
        assert!(!v.admitted);
        assert_eq!(remaining(&v), [0, 2]);
        assert_eq!(v.violated().collect::<Vec<_>>(), [0]);
        let expected = Duration::from_secs(1).saturating_sub(t0.elapsed());
        assert_near(
            v.retry_after().unwrap(),
            expected,
            "retry_after (1 s limit)",
        );
    }
    tokio::time::sleep_until((t0 + Duration::from_millis(1200)).into()).await;
    for expected in [[2, 1], [1, 0]] {
        let v = check(&store, b, &limits).await;
        assert!(v.admitted);
        assert_eq!(remaining(&v), expected);
    }
    // Now denied by the 10 s limit only: the 1 s limit keeps its 1 remaining.
    for _ in 0..5 {
        let v = check(&store, b, &limits).await;
        assert!(!v.admitted);
        assert_eq!(remaining(&v), [1, 0]);
        assert_eq!(v.violated().collect::<Vec<_>>(), [1]);
        let expected = Duration::from_secs(10).saturating_sub(t0.elapsed());
        assert_near(
            v.retry_after().unwrap(),
            expected,
            "retry_after (10 s limit)",
        );
    }
}

/// `remaining` counts down per admission; `reset` is the time until the oldest entry leaves.
pub async fn reset_and_remaining(store: Arc<dyn Store>) {
    let window = Duration::from_secs(2);
    let limits = [limit(5, Duration::from_secs(2))];
    let b = "reset:client";
    let t0 = Instant::now();

    let first = check(&store, b, &limits).await;
    assert!(first.admitted);
    assert_eq!(first.states[0].remaining, 4);
    assert!(first.states[0].reset <= window);
    assert_near(first.states[0].reset, window, "reset of a fresh log");
    assert_eq!(first.retry_after(), None);

    tokio::time::sleep_until((t0 + Duration::from_millis(500)).into()).await;
    let second = check(&store, b, &limits).await;
    assert_eq!(second.states[0].remaining, 3);
    assert_near(
        second.states[0].reset,
        window - t0.elapsed(),
        "reset after 0.5 s",
    );

    for expected in [2, 1, 0] {
        let v = check(&store, b, &limits).await;
        assert!(v.admitted);
        assert_eq!(v.states[0].remaining, expected);
    }
    let denied = check(&store, b, &limits).await;
    assert!(!denied.admitted);
    assert_eq!(denied.states[0].remaining, 0);
    assert_near(
        denied.retry_after().unwrap(),
        window - t0.elapsed(),
        "retry_after",
    );
    assert_eq!(denied.retry_after(), Some(denied.states[0].reset));

    // The first entry has left, the four from t0 + 0.5 s have not.
    tokio::time::sleep_until((t0 + Duration::from_millis(2100)).into()).await;
    let again = check(&store, b, &limits).await;
    assert!(again.admitted);
    assert_eq!(again.states[0].remaining, 0);
    assert_near(
        again.states[0].reset,
        (window + Duration::from_millis(500)).saturating_sub(t0.elapsed()),
        "reset once the oldest of the 0.5 s entries is the oldest",
    );
}

/// Buckets are independent, and a route with three limits works for many buckets (on a Cluster
/// they hash to different nodes; the shared hash tag keeps each call in one slot: no CROSSSLOT).
pub async fn buckets_are_independent(store: Arc<dyn Store>) {
    let limits = [
        limit(2, Duration::from_secs(10)),
        limit(3, Duration::from_secs(60)),
        limit(4, Duration::from_secs(3600)),
    ];
    let calls = (0..64).map(|i| {
        let store = store.clone();
        async move {
            let bucket = format!("many:client-{i}");
            let mut admitted = Vec::new();
            for _ in 0..3 {
                admitted.push(check(&store, &bucket, &limits).await.admitted);
            }
            assert_eq!(admitted, [true, true, false], "bucket {bucket}");
        }
    });
    join_all(calls).await;
}

/// Logs are keyed by window: a reload that changes `requests` keeps the recorded entries, one
/// that changes the window starts that limit afresh.
pub async fn logs_are_keyed_by_window(store: Arc<dyn Store>) {
    let b = "reload:client";
    for _ in 0..3 {
        assert!(
            check(&store, b, &[limit(5, Duration::from_secs(10))])
                .await
                .admitted
        );
    }
    let lowered = check(&store, b, &[limit(3, Duration::from_secs(10))]).await;
    assert!(
        !lowered.admitted,
        "3 entries already fill a limit lowered to 3"
    );
    assert_eq!(remaining(&lowered), [0]);
    let raised = check(&store, b, &[limit(10, Duration::from_secs(10))]).await;
    assert!(raised.admitted);
    assert_eq!(remaining(&raised), [6]);
    let new_window = check(&store, b, &[limit(5, Duration::from_secs(20))]).await;
    assert!(new_window.admitted);
    assert_eq!(remaining(&new_window), [4]);
}

/// A route without limits is always admitted.
pub async fn no_limits_admits(store: Arc<dyn Store>) {
    let v = check(&store, "none:client", &[]).await;
    assert!(v.admitted);
    assert!(v.states.is_empty());
}

/// A slotted limit (`resolution`) admits exactly `requests` of a burst, refuses the rest with a
/// `reset` of when its slot leaves (at most window + resolution away), and admits again then.
pub async fn slotted_burst_and_reset(store: Arc<dyn Store>) {
    let limits = [Limit::slotted(
        5,
        Duration::from_millis(600),
        Duration::from_millis(200),
    )];
    let b = "slotted:client";
    let start = Instant::now();
    for n in (0..5).rev() {
        let v = check(&store, b, &limits).await;
        assert!(v.admitted);
        assert_eq!(remaining(&v), [n]);
    }
    let denied = check(&store, b, &limits).await;
    assert!(!denied.admitted);
    let reset = denied.states[0].reset;
    assert!(
        reset > Duration::ZERO && reset <= Duration::from_millis(800),
        "{reset:?}"
    );
    assert_eq!(denied.retry_after(), Some(reset));
    // Still refused just before the reset, admitted once it has passed.
    let wait_until = |at: Duration| tokio::time::sleep_until((start + at).into());
    wait_until(reset.saturating_sub(TOLERANCE)).await;
    assert!(
        !check(&store, b, &limits).await.admitted,
        "free before its reset"
    );
    wait_until(reset + Duration::from_millis(20)).await;
    assert!(
        check(&store, b, &limits).await.admitted,
        "still full after its reset"
    );
}

/// A route mixing a log and a slotted limit of one window: two records (two ids), all or none.
pub async fn slotted_and_log_all_or_nothing(store: Arc<dyn Store>) {
    let w = Duration::from_secs(60);
    let limits = [limit(3, w), Limit::slotted(2, w, Duration::from_secs(1))];
    let b = "mixed:client";
    let mut got = Vec::new();
    for _ in 0..4 {
        let v = check(&store, b, &limits).await;
        got.push((v.admitted, remaining(&v)));
    }
    assert_eq!(
        got,
        [
            (true, vec![2, 1]),
            (true, vec![1, 0]),
            (false, vec![1, 0]),
            (false, vec![1, 0]),
        ]
    );
}

/// `count_status`: a refund removes that admission's own entries from a log and a slotted
/// limit alike, so exactly one more request is admitted; a refund naming no admission changes
/// nothing.
pub async fn refund_gives_back_its_own_entry(store: Arc<dyn Store>) {
    let w = Duration::from_secs(60);
    let limits = [limit(3, w), Limit::slotted(3, w, Duration::from_secs(1))];
    let (route, b) = ("refund", "refund:client");
    let mut at = Vec::new();
    for _ in 0..3 {
        let v = store
            .check(route, &Buckets::one(b), &limits)
            .await
            .expect("check failed");
        assert!(v.admitted);
        at.push(v.recorded_at.expect("an admission has a time"));
    }
    assert!(
        !store
            .check(route, &Buckets::one(b), &limits)
            .await
            .unwrap()
            .admitted
    );
    // Nothing was recorded two windows after the last admission: no slot comes back.
    let never = at[2] + 2 * w.as_micros() as u64;
    store
        .refund(Admission::new(route, &Buckets::one(b), &limits, &[never]))
        .await
        .unwrap();
    assert!(
        !store
            .check(route, &Buckets::one(b), &limits)
            .await
            .unwrap()
            .admitted
    );
    // The second admission's entries go: one more is admitted, then the limit is full again.
    store
        .refund(Admission::new(route, &Buckets::one(b), &limits, &[at[1]]))
        .await
        .unwrap();
    let again = store.check(route, &Buckets::one(b), &limits).await.unwrap();
    assert!(again.admitted, "{again:?}");
    assert_eq!(remaining(&again), [0, 0]);
    assert!(
        !store
            .check(route, &Buckets::one(b), &limits)
            .await
            .unwrap()
            .admitted
    );
}
