//! How long a decision waits for Redis: `store.timeout` bounds waiting for an *unresponsive*
//! store, never waiting that is the proxy's own doing.
//!
//! Two things make a healthy Redis look slow from inside a loaded proxy, and neither may turn
//! into a fail-open:
//! - **Queueing.** A decision that finds its lane's window of calls full waits for one of
//!   them to return, then rides in the next batch. While that lane keeps getting answers, the
//!   store is answering: the decision waits on. At `timeout` after it started it gives up, unless the lane answered within the last
//!   [`RECENT`]; then it looks again [`RECENT`] after that answer, and so on.
//! - **A saturated event loop.** When the proxy's threads are busy, a timer fires late and a
//!   reply that arrived in time sits unread in a socket. A timer that fired more than
//!   [`LAG_TOLERANCE`] late proves nothing about Redis: the wait is extended by as long as the
//!   proxy was late (at most `timeout` at a time), so only time the proxy was free to notice an
//!   answer counts.
//!
//! On a frozen Redis with an idle proxy, then, a decision gives up `timeout` after it started,
//! or at most [`RECENT`] later when the lane answered just before freezing.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::limiter::StoreError;

/// A timer that fires later than this was late because the proxy was busy.
pub(crate) const LAG_TOLERANCE: Duration = Duration::from_millis(5);

/// An answer on the lane this recent means the store is answering right now.
pub(crate) const RECENT: Duration = Duration::from_millis(10);

/// Wait for `call` under the rules above. `last_answer` tells when the lane last got an answer
/// (`None` for a call, which waits for its own answer: see `redis/call.rs`).
pub(crate) async fn wait<T>(
    timeout: Duration,
    last_answer: impl Fn() -> Option<Instant>,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let mut due = started + timeout;
    tokio::pin!(call);
    loop {
        if let Ok(result) = tokio::time::timeout_at(due.into(), &mut call).await {
            return result;
        }
        let now = Instant::now();
        match next_due(now, due, started, last_answer(), timeout) {
            Some(next) => due = next,
            None => return Err(StoreError::Timeout(timeout)),
        }
    }
}

/// Pure: a wait that started at `started` had its timer (due at `due`) fire at `now`; the lane
/// last answered at `last_answer`. The next due time, or `None` to give up.
pub(crate) fn next_due(
    now: Instant,
    due: Instant,
    started: Instant,
    last_answer: Option<Instant>,
    timeout: Duration,
) -> Option<Instant> {
    let late = now.saturating_duration_since(due);
    if late > LAG_TOLERANCE {
        return Some(now + late.min(timeout));
    }
    let last = last_answer.filter(|&a| a > started)?;
    (now.saturating_duration_since(last) < RECENT).then(|| now.max(last + RECENT))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_millis(50);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_silent_store_times_out_on_time() {
        let t0 = Instant::now();
        assert_eq!(next_due(t0 + T, t0 + T, t0, None, T), None);
        // An answer from before the wait began says nothing about now.
        assert_eq!(
            next_due(t0 + ms(60), t0 + ms(60), t0 + ms(10), Some(t0), T),
            None
        );
    }

    #[test]
    fn a_late_timer_is_extended_by_its_lateness() {
        let t0 = Instant::now();
        let fired = t0 + T + ms(30);
        assert_eq!(next_due(fired, t0 + T, t0, None, T), Some(fired + ms(30)));
        let very_late = t0 + T + ms(500);
        assert_eq!(
            next_due(very_late, t0 + T, t0, None, T),
            Some(very_late + T)
        );
    }

    #[test]
    fn a_lane_that_is_answering_keeps_its_waiters() {
        let t0 = Instant::now();
        let now = t0 + T;
        let just = now - ms(2);
        assert_eq!(next_due(now, now, t0, Some(just), T), Some(just + RECENT));
    }

    #[test]
    fn a_lane_that_answered_a_while_ago_is_not_answering() {
        let t0 = Instant::now();
        let now = t0 + T;
        assert_eq!(next_due(now, now, t0, Some(t0 + ms(20)), T), None);
    }

    #[test]
    fn frozen_right_after_an_answer_gives_up_within_recent() {
        let t0 = Instant::now();
        let now = t0 + T;
        let last = now - ms(1);
        let next = next_due(now, now, t0, Some(last), T).unwrap();
        assert!(next <= t0 + T + RECENT);
        assert_eq!(next_due(next, next, t0, Some(last), T), None);
    }
}
