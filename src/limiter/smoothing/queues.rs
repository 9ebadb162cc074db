//! The waiters of every bucket, and the process-wide bound over them (`max_queue`,
//! `store.max_delayed`). A [`Place`] is given back on drop: a client that leaves mid-wait frees
//! its place whatever path drops the request.

use std::sync::atomic::{AtomicU32, Ordering};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use prometheus::{IntCounter, IntGauge};

/// What the queues count: `slidegate_requests_waiting` and `slidegate_delay_refused_total`.
#[derive(Clone)]
pub struct QueueMetrics {
    /// Requests waiting for room now.
    pub waiting: IntGauge,
    /// Denials answered at once because `max_delayed` requests were already waiting.
    pub refused: IntCounter,
}

impl QueueMetrics {
    /// Handles registered nowhere (for tests).
    #[cfg(test)]
    pub(crate) fn unregistered() -> QueueMetrics {
        QueueMetrics {
            waiting: IntGauge::new("waiting", "waiting").unwrap(),
            refused: IntCounter::new("refused", "refused").unwrap(),
        }
    }
}

/// The waiters of every bucket. Only denials that may wait touch it: admitted requests and
/// routes without `max_delay` never do. An entry lives while its bucket has a waiter, so the
/// map holds at most the buckets with requests waiting now.
///
/// Two bounds: `max_queue` per bucket, and `store.max_delayed` over the process. A parked
/// request keeps all it holds in flight (its connection, Pingora's per-request state), so
/// 30 000 clients each parking one would otherwise hold hundreds of MB: past the process-wide
/// bound a denial is answered at once, as past a full queue.
pub struct Queues {
    waiting: DashMap<Box<str>, u32>,
    /// Waiters over every bucket.
    total: AtomicU32,
    metrics: QueueMetrics,
}

impl Queues {
    /// No waiter yet; counted in `metrics`.
    pub fn new(metrics: QueueMetrics) -> Queues {
        Queues {
            waiting: DashMap::default(),
            total: AtomicU32::new(0),
            metrics,
        }
    }

    /// A place in `bucket`'s queue, or `None` when `max_queue` requests already wait there or
    /// `max_total` wait over all buckets.
    pub fn join(&self, bucket: &str, max_queue: u32, max_total: u32) -> Option<Place<'_>> {
        let taken = self
            .total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_total).then_some(n + 1)
            });
        if taken.is_err() {
            self.metrics.refused.inc();
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
        self.metrics.waiting.inc();
        Some(Place {
            queues: self,
            bucket: bucket.into(),
        })
    }

    /// Requests waiting on `bucket` now.
    #[cfg(test)]
    pub(crate) fn waiting(&self, bucket: &str) -> u32 {
        self.waiting.get(bucket).map_or(0, |n| *n)
    }

    /// Buckets with a waiter now.
    #[cfg(test)]
    pub(crate) fn buckets(&self) -> usize {
        self.waiting.len()
    }

    /// Requests waiting now, over every bucket.
    #[cfg(test)]
    pub(crate) fn total(&self) -> u32 {
        self.total.load(Ordering::Acquire)
    }
}

/// One request's place in its bucket's queue (and in `slidegate_requests_waiting`), given
/// back when dropped.
pub struct Place<'a> {
    queues: &'a Queues,
    bucket: Box<str>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queues.metrics.waiting.dec();
        self.queues.total.fetch_sub(1, Ordering::AcqRel);
        // The last waiter removes the entry: many buckets that once waited leave nothing behind.
        self.queues.waiting.remove_if_mut(&self.bucket, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues() -> Queues {
        Queues::new(QueueMetrics::unregistered())
    }

    #[test]
    fn a_queue_is_bounded_and_forgets_its_bucket_when_the_last_waiter_leaves() {
        let queues = queues();
        let a = queues.join("b", 2, 100).expect("first place");
        let b = queues.join("b", 2, 100).expect("second place");
        assert!(queues.join("b", 2, 100).is_none(), "max_queue 2 reached");
        assert_eq!(queues.waiting("b"), 2);
        assert_eq!(queues.metrics.waiting.get(), 2);
        let other = queues
            .join("c", 2, 100)
            .expect("another bucket has its own queue");
        drop(a);
        let c = queues
            .join("b", 2, 100)
            .expect("a dropped place is free again");
        drop((b, c, other));
        assert_eq!(queues.buckets(), 0, "no entry left behind");
        assert_eq!(queues.metrics.waiting.get(), 0);
        assert!(queues.join("b", 0, 100).is_none());
        assert_eq!(queues.buckets(), 0, "a refused join leaves nothing");
        assert_eq!(queues.total(), 0, "a refused join holds no place");
    }

    #[test]
    fn the_process_wide_bound_holds_over_every_bucket() {
        let queues = queues();
        let places: Vec<_> = (0..5)
            .map(|i| queues.join(&format!("r:c{i}"), 8, 5).expect("room"))
            .collect();
        assert_eq!(queues.total(), 5);
        assert!(
            queues.join("r:another", 8, 5).is_none(),
            "max_delayed 5 reached"
        );
        assert_eq!(queues.metrics.refused.get(), 1);
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
        let queues = queues();
        for i in 0..10_000 {
            let place = queues.join(&format!("route:client-{i}"), 8, 100);
            assert!(place.is_some());
        }
        assert_eq!(queues.buckets(), 0);
        assert_eq!(queues.total(), 0);
    }
}
