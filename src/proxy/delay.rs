//! Smoothing bursts (`max_delay`, `max_queue`; nginx `limit_req burst=.. delay=..`): a denial
//! limit has room again soon waits for that room and is decided again.
//!
//! Three parts: [`wait_for`], the pure decision (should this answer wait, and how long); the
//! per-bucket [`Queues`] of waiters, whose [`Place`] is given back on drop (a client that
//! leaves mid-wait frees its place whatever path drops the request); and [`client_gone`], which
//! notices such a client during the wait. The waiting loop itself is
//! [`super::limiter::Limiter::check`].
//!
//! A waiter holds no store resources: no connection, no seat in a lane, only a timer and its place.
//! The promise stays the store's: a request is admitted only by a store decision, so never more
//! than `requests` are admitted in any window, however many waited.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use pingora::prelude::*;
use pingora::proxy::Session;

use super::outcome::Policy;
use crate::limiter::{StoreError, Verdict};
use crate::metrics::METRICS;

/// Decisions one request may take while it waits, the first included. Waiters of one bucket
/// wake together when room frees and only one takes it; the others wait for the next room
/// within their `max_delay`, but each at most this many times, so a long `max_delay` on a busy
/// bucket costs the store a bounded number of calls per request.
pub(super) const MAX_DECISIONS: u32 = 8;

/// How long a request should wait before it is decided again, or `None` when its answer is
/// final: it was admitted; the store could not decide (`on_error` answers, waiting would not
/// help); the route has no `max_delay` or is a shadow route (which never delays); room
/// frees only after `max_delay` from the first denial; or the request already took
/// [`MAX_DECISIONS`] decisions.
///
/// `waited` runs from the first denial's answer to when this decision was asked. Both ends
/// bracket the store's own instants (the first denial was decided before its answer came; this
/// decision is decided after it was asked), so `waited` never exceeds the time between the two
/// decisions on the store's clock, whatever the answers' latency: room that frees within
/// `max_delay` of the first denial always fits, however late answers arrive under load (a
/// waiter may then wait longer than `max_delay` by at most one decision's round trip).
///
/// Waiting until `max_delay` is used up, not once: a waiter that loses freed room to another
/// waiter, or that woke on a known denial's deadline just before Redis evicted the entry, is
/// still served if room frees again within its budget.
pub(super) fn wait_for(
    policy: Policy,
    result: &Result<Verdict, StoreError>,
    waited: Duration,
    decisions: u32,
) -> Option<Duration> {
    let smoothing = policy.smoothing.filter(|_| !policy.shadow)?;
    // The time until every full limit has room again: before it, no decision can admit.
    let reset = result.as_ref().ok()?.retry_after()?;
    let fits = waited.checked_add(reset)? <= smoothing.max_delay;
    (fits && decisions < MAX_DECISIONS).then_some(reset)
}

/// The waiters of every bucket. Only denials that may wait touch it: admitted requests and
/// routes without `max_delay` never do. An entry lives while its bucket has a waiter, so the
/// map holds at most the buckets with requests waiting now.
///
/// Two bounds: `max_queue` per bucket, and `store.max_delayed` over the process. A parked
/// request keeps all it holds in flight (its connection, Pingora's per-request state), so
/// 30 000 clients each parking one would otherwise hold hundreds of MB: past the process-wide
/// bound a denial is answered at once, as past a full queue.
#[derive(Default)]
pub(super) struct Queues {
    waiting: DashMap<Box<str>, u32>,
    /// Waiters over every bucket.
    total: AtomicU32,
}

impl Queues {
    /// A place in `bucket`'s queue, or `None` when `max_queue` requests already wait there or
    /// `max_total` wait over all buckets.
    pub(super) fn join(&self, bucket: &str, max_queue: u32, max_total: u32) -> Option<Place<'_>> {
        let taken = self
            .total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_total).then_some(n + 1)
            });
        if taken.is_err() {
            METRICS.delay_refused.inc();
            return None;
        }
        match self.waiting.entry(bucket.into()) {
            Entry::Occupied(mut n) if *n.get() < max_queue => *n.get_mut() += 1,
            Entry::Vacant(vacant) if max_queue > 0 => {
                vacant.insert(1);
            }
            Entry::Occupied(_) | Entry::Vacant(_) => {
                self.total.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
        }
        METRICS.waiting.inc();
        Some(Place {
            queues: self,
            bucket: bucket.into(),
        })
    }

    /// Requests waiting on `bucket` now.
    #[cfg(test)]
    pub(super) fn waiting(&self, bucket: &str) -> u32 {
        self.waiting.get(bucket).map_or(0, |n| *n)
    }

    /// Buckets with a waiter now.
    #[cfg(test)]
    pub(super) fn buckets(&self) -> usize {
        self.waiting.len()
    }

    /// Requests waiting now, over every bucket.
    #[cfg(test)]
    pub(super) fn total(&self) -> u32 {
        self.total.load(Ordering::Acquire)
    }
}

/// One request's place in its bucket's queue (and in `slidegate_requests_waiting`), given
/// back when dropped.
pub(super) struct Place<'a> {
    queues: &'a Queues,
    bucket: Box<str>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        METRICS.waiting.dec();
        self.queues.total.fetch_sub(1, Ordering::AcqRel);
        // The last waiter removes the entry: many buckets that once waited leave nothing behind.
        self.queues.waiting.remove_if_mut(&self.bucket, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}

/// Resolves when the client of a waiting request is gone, with the error to end it with: an
/// HTTP/2 stream the client reset (or whose connection closed), an HTTP/1 connection the client
/// closed. An HTTP/1 request whose body is not read yet is not watched (reading it here would
/// take the body from the upstream): it keeps its place until its wait ends, `max_delay` at most.
pub(super) async fn client_gone(session: &mut Session) -> Box<Error> {
    if let Some(closed) = session.downstream_session.watch_h2_stream_close() {
        let why = match closed.await {
            Ok(reason) => format!("client closed the stream ({reason}) while it waited"),
            Err(e) => format!("client stream failed while it waited: {e}"),
        };
        return Error::explain(ErrorType::H2Error, why).into_down();
    }
    if session.downstream_session.is_body_done() {
        // Body done: this only probes the connection. A FIN is an error; bytes of a pipelined
        // next request are kept for it by Pingora and the probe stays pending.
        if let Err(e) = session.downstream_session.read_body_or_idle(true).await {
            return e.into_down();
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnError, Smoothing};
    use crate::limiter::LimitState;

    const SECOND: Duration = Duration::from_secs(1);

    fn policy(max_delay: Option<Duration>, shadow: bool) -> Policy {
        Policy {
            shadow,
            on_error: OnError::Allow,
            smoothing: max_delay.map(|max_delay| Smoothing {
                max_delay,
                max_queue: 8,
            }),
        }
    }

    /// A verdict of two limits: the first full for `reset`, the second as given.
    fn verdict(admitted: bool, reset: Duration, second: LimitState) -> Result<Verdict, StoreError> {
        Ok(Verdict {
            admitted,
            recorded_at: admitted.then_some(1),
            recorded_each: Vec::new(),
            states: vec![
                LimitState {
                    remaining: u32::from(admitted),
                    reset,
                },
                second,
            ],
        })
    }

    fn roomy() -> LimitState {
        LimitState {
            remaining: 5,
            reset: Duration::from_secs(50),
        }
    }

    #[test]
    fn a_denial_whose_room_frees_in_time_waits_exactly_until_then() {
        let denied = verdict(false, Duration::from_millis(300), roomy());
        let p = policy(Some(SECOND), false);
        assert_eq!(
            wait_for(p, &denied, Duration::ZERO, 1),
            Some(Duration::from_millis(300))
        );
        // The budget counts from the first denial: 700 ms used leaves exactly 300 ms.
        assert_eq!(
            wait_for(p, &denied, Duration::from_millis(700), 2),
            Some(Duration::from_millis(300))
        );
        assert_eq!(wait_for(p, &denied, Duration::from_millis(701), 2), None);
    }

    #[test]
    fn the_wait_is_for_the_latest_full_limit() {
        // Both limits full: the request cannot be admitted before the later one frees.
        let full = LimitState {
            remaining: 0,
            reset: Duration::from_millis(900),
        };
        let denied = verdict(false, Duration::from_millis(100), full);
        let p = policy(Some(SECOND), false);
        assert_eq!(
            wait_for(p, &denied, Duration::ZERO, 1),
            Some(Duration::from_millis(900))
        );
        let p = policy(Some(Duration::from_millis(500)), false);
        assert_eq!(wait_for(p, &denied, Duration::ZERO, 1), None);
    }

    #[test]
    fn admitted_errors_shadow_and_routes_without_max_delay_never_wait() {
        let soon = verdict(false, Duration::from_millis(10), roomy());
        let admitted = verdict(true, Duration::from_millis(10), roomy());
        let failed = Err(StoreError::Timeout(Duration::from_millis(50)));
        let on = policy(Some(SECOND), false);
        assert_eq!(wait_for(on, &admitted, Duration::ZERO, 1), None);
        assert_eq!(wait_for(on, &failed, Duration::ZERO, 1), None);
        assert_eq!(
            wait_for(policy(Some(SECOND), true), &soon, Duration::ZERO, 1),
            None
        );
        assert_eq!(
            wait_for(policy(None, false), &soon, Duration::ZERO, 1),
            None
        );
    }

    /// A known denial (the deny cache's answer, its resets aged to now) waits until the cache's
    /// deadline, so the decision after the wait goes to the store: the cache never answers a
    /// waiter past the time room frees, and never makes it wait longer than that.
    #[tokio::test]
    async fn a_known_denial_waits_until_the_store_decides_again() {
        use crate::limiter::coalesce::fixture::Cached;
        use crate::limiter::fixtures::Counting;
        use crate::limiter::Limit;
        use std::sync::Arc;
        use std::time::Instant;

        let store = Arc::new(Counting::default());
        let cache = Cached::new(store.clone(), Duration::from_secs(10));
        let limits = [Limit::log(1, Duration::from_millis(200))];
        let started = Instant::now();
        assert!(cache.check("b", &limits).await.unwrap().admitted);
        assert!(!cache.check("b", &limits).await.unwrap().admitted);
        let mut result = cache.check("b", &limits).await;
        assert_eq!(store.reached(), 2, "the third answer is the cache's");
        let p = policy(Some(SECOND), false);
        let waiting = Instant::now();
        let mut decisions = 1;
        while let Some(wait) = wait_for(p, &result, waiting.elapsed(), decisions) {
            tokio::time::sleep(wait).await;
            result = cache.check("b", &limits).await;
            decisions += 1;
        }
        assert!(
            result.unwrap().admitted,
            "admitted after {decisions} decisions"
        );
        assert_eq!(
            store.reached(),
            1 + decisions as usize,
            "every decision after a wait reached the store"
        );
        // A wake a few microseconds before the eviction costs one more decision at most.
        assert!(decisions <= 3, "{decisions} decisions");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200),
            "admitted before room freed"
        );
        assert!(took < Duration::from_millis(300), "{took:?}");
    }

    #[test]
    fn a_request_takes_at_most_max_decisions() {
        let soon = verdict(false, Duration::from_millis(1), roomy());
        let p = policy(Some(SECOND), false);
        assert!(wait_for(p, &soon, Duration::ZERO, MAX_DECISIONS - 1).is_some());
        assert_eq!(wait_for(p, &soon, Duration::ZERO, MAX_DECISIONS), None);
    }

    #[test]
    fn a_queue_is_bounded_and_forgets_its_bucket_when_the_last_waiter_leaves() {
        let queues = Queues::default();
        let a = queues.join("b", 2, 100).expect("first place");
        let b = queues.join("b", 2, 100).expect("second place");
        assert!(queues.join("b", 2, 100).is_none(), "max_queue 2 reached");
        assert_eq!(queues.waiting("b"), 2);
        let other = queues
            .join("c", 2, 100)
            .expect("another bucket has its own queue");
        drop(a);
        let c = queues
            .join("b", 2, 100)
            .expect("a dropped place is free again");
        drop((b, c, other));
        assert_eq!(queues.buckets(), 0, "no entry left behind");
        assert!(queues.join("b", 0, 100).is_none());
        assert_eq!(queues.buckets(), 0, "a refused join leaves nothing");
        assert_eq!(queues.total(), 0, "a refused join holds no place");
    }

    #[test]
    fn the_process_wide_bound_holds_over_every_bucket() {
        let queues = Queues::default();
        let places: Vec<_> = (0..5)
            .map(|i| queues.join(&format!("r:c{i}"), 8, 5).expect("room"))
            .collect();
        assert_eq!(queues.total(), 5);
        assert!(
            queues.join("r:another", 8, 5).is_none(),
            "max_delayed 5 reached"
        );
        assert_eq!(queues.buckets(), 5, "a refused join adds no bucket");
        drop(places);
        assert_eq!(queues.total(), 0);
        assert!(queues.join("r:another", 8, 5).is_some());
        assert!(
            queues.join("r:x", 8, 0).is_none(),
            "max_delayed 0: nobody waits"
        );
    }

    #[test]
    fn many_buckets_that_waited_leave_an_empty_map() {
        let queues = Queues::default();
        for i in 0..10_000 {
            let place = queues.join(&format!("route:client-{i}"), 8, 100);
            assert!(place.is_some());
        }
        assert_eq!(queues.buckets(), 0);
        assert_eq!(queues.total(), 0);
    }
}
