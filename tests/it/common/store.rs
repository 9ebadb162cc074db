//! Limits, and the calls of tests that drive a [`Store`] directly.

use std::sync::Arc;
use std::time::Duration;

use slidegate::limiter::{Buckets, Limit, LimitView, Store, Verdict};

/// The route named by tests that decide directly on a store: one name, so that a memory store
/// keeps all of a test's buckets in one arena, as the proxy does for one route.
pub const ROUTE: &str = "test";

/// Slack for comparing a `reset` with the time measured by the test: scheduling, round trips
/// and the Redis clock vs. the test's clock.
pub const TOLERANCE: Duration = Duration::from_millis(150);

/// At most `requests` in any `window`.
pub fn limit(requests: u32, window: Duration) -> Limit {
    Limit::log(requests, window)
}

/// One decision for `bucket` of [`ROUTE`], which must succeed and give one state per limit.
pub async fn check(store: &Arc<dyn Store>, bucket: &str, limits: &[Limit]) -> Verdict {
    let verdict = store
        .check(ROUTE, &Buckets::one(bucket), limits)
        .await
        .unwrap_or_else(|e| panic!("{} check failed: {e}", store.backend()));
    assert_eq!(verdict.states.len(), limits.len());
    verdict
}

/// The inspector's view of every limit of `bucket`, which must succeed and give one view per
/// limit.
pub async fn inspect(store: &Arc<dyn Store>, bucket: &str, limits: &[Limit]) -> Vec<LimitView> {
    let view = store
        .inspect(bucket, limits)
        .await
        .unwrap_or_else(|e| panic!("{} inspect failed: {e}", store.backend()));
    assert_eq!(view.limits.len(), limits.len());
    view.limits
}

/// Each limit's `remaining` after a decision.
pub fn remaining(v: &Verdict) -> Vec<u32> {
    v.states.iter().map(|s| s.remaining).collect()
}

/// `actual` is within [`TOLERANCE`] of `expected`.
pub fn assert_near(actual: Duration, expected: Duration, what: &str) {
    let diff = actual.abs_diff(expected);
    assert!(
        diff <= TOLERANCE,
        "{what}: {actual:?}, expected {expected:?} ± {TOLERANCE:?}"
    );
}
