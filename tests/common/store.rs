//! Limits for tests that drive a [`Store`](slidegate::limiter::Store) directly.

use std::time::Duration;

use slidegate::limiter::Limit;

/// At most `requests` in any `window`.
pub fn limit(requests: u32, window: Duration) -> Limit {
    Limit::log(requests, window)
}
