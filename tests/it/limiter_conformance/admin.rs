//! The cases of the admin calls: `inspect` reports what the deciding step would (counts,
//! remaining, reset) and records nothing; after `reset` a bucket admits its full limit again.
//! Each for a log and for a slotted limit.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::store::{assert_near, check, inspect, limit, TOLERANCE};
use slidegate::limiter::{Limit, LimitKind, LimitView, Store};

const WINDOW: Duration = Duration::from_secs(10);

fn slotted() -> Limit {
    Limit::slotted(4, WINDOW, Duration::from_secs(1))
}

pub async fn inspect_log_after_admissions(store: Arc<dyn Store>) {
    inspect_after_admissions(store, limit(4, WINDOW)).await;
}

pub async fn inspect_slotted_after_admissions(store: Arc<dyn Store>) {
    inspect_after_admissions(store, slotted()).await;
}

pub async fn reset_log_admits_the_full_limit_again(store: Arc<dyn Store>) {
    reset_admits_the_full_limit_again(store, limit(4, WINDOW)).await;
}

pub async fn reset_slotted_admits_the_full_limit_again(store: Arc<dyn Store>) {
    reset_admits_the_full_limit_again(store, slotted()).await;
}

/// A bucket nobody asked about reads as empty; after each admission, `inspect` counts it and
/// reports the `remaining` and `reset` the admission did; a denial is not counted; and no
/// inspection records anything (the limit still fills after exactly `requests` admissions).
async fn inspect_after_admissions(store: Arc<dyn Store>, limit: Limit) {
    let (limits, b) = ([limit], "inspect:client");
    let unknown = inspect(&store, b, &limits).await;
    assert_eq!(
        (unknown[0].count, unknown[0].remaining),
        (0, limit.requests)
    );
    assert_near(unknown[0].reset, WINDOW, "reset of an empty bucket");
    assert!(unknown[0].entries_us.is_empty() && unknown[0].slots.is_empty());

    for n in 1..=limit.requests {
        let admitted = check(&store, b, &limits).await;
        assert!(admitted.admitted, "admission {n}");
        let seen = inspect(&store, b, &limits).await;
        let view = &seen[0];
        assert_eq!(view.count, u64::from(n), "count after {n} admissions");
        assert_eq!(view.remaining, admitted.states[0].remaining, "after {n}");
        assert_eq!(view.remaining, limit.requests - n);
        assert_near(
            view.reset,
            admitted.states[0].reset,
            "reset vs. the admission's",
        );
        assert_entries(view, &limit);
    }
    let denied = check(&store, b, &limits).await;
    assert!(
        !denied.admitted,
        "inspections recorded nothing: the limit is full"
    );
    let full = inspect(&store, b, &limits).await;
    assert_eq!(
        (full[0].count, full[0].remaining),
        (u64::from(limit.requests), 0)
    );
    assert_near(
        full[0].reset,
        denied.states[0].reset,
        "reset vs. the denial's",
    );
}

/// A view's entries agree with its count, lie in the window on the store's clock, and a slotted
/// limit lists its time slots (a log none).
fn assert_entries(view: &LimitView, limit: &Limit) {
    assert_eq!(view.entries_us.len() as u64, view.count);
    assert!(view.entries_us.is_sorted(), "oldest first: {view:?}");
    match limit.kind {
        LimitKind::Log(_) | LimitKind::Lease(_) | LimitKind::Calendar(_) => {
            assert!(view.slots.is_empty(), "{view:?}")
        }
        LimitKind::Slotted(_) => {
            let counted: u64 = view.slots.iter().map(|&(_, c)| u64::from(c)).sum();
            assert_eq!(counted, view.count, "{view:?}");
        }
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let now_us = now.as_micros() as u64;
    let slack = (TOLERANCE + Duration::from_secs(1)).as_micros() as u64;
    for &at in &view.entries_us {
        assert!(at <= now_us + slack, "entry {at} after now {now_us}");
        assert!(
            at + (WINDOW.as_micros() as u64) + slack >= now_us,
            "entry {at} out of window"
        );
    }
}

/// A full bucket, reset, reads as empty and admits exactly `requests` again, counting down; a
/// reset of a bucket the store does not know succeeds.
async fn reset_admits_the_full_limit_again(store: Arc<dyn Store>, limit: Limit) {
    let (limits, b) = ([limit], "reset:client");
    for _ in 0..limit.requests {
        assert!(check(&store, b, &limits).await.admitted);
    }
    assert!(!check(&store, b, &limits).await.admitted);
    store.reset(b, &limits).await.expect("reset");
    let view = inspect(&store, b, &limits).await;
    assert_eq!((view[0].count, view[0].remaining), (0, limit.requests));
    for left in (0..limit.requests).rev() {
        let v = check(&store, b, &limits).await;
        assert!(
            v.admitted,
            "denied after the reset with {left} to go: {v:?}"
        );
        assert_eq!(v.states[0].remaining, left);
    }
    assert!(
        !check(&store, b, &limits).await.admitted,
        "more than the limit"
    );
    store
        .reset("reset:nobody", &limits)
        .await
        .expect("reset of an unknown bucket");
}
