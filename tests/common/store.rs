//! Limits for tests that drive a [`Store`](slidegate::limiter::Store) directly.

use std::time::Duration;

use slidegate::limiter::Limit;

/// At most `requests` in any `window`.
pub fn limit(requests: u32, window: Duration) -> Limit {
    Limit::log(requests, window)
}

/// The route named by tests that decide directly on a store: one name, so that a memory store
/// keeps all of a test's buckets in one room, as the proxy does for one route.
pub const ROUTE: &str = "test";
