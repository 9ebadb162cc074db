//! Plans read from Redis, kept for `refresh`: a client's plan is read from the store when its
//! entry is missing or older than that, so a change the billing system makes applies on every
//! proxy within `refresh` (plus one store call), and a busy client costs one read per
//! `refresh`, not one per request.
//!
//! Bounded whatever the clients send: two generations of at most [`PlanCache::capacity`]
//! entries each; when the young one fills, it becomes the old one and the oldest is dropped
//! (an entry read again is moved young). A flood of made-up keys costs one store read each and
//! pushes real clients' entries out at worst, which are then read again: never unbounded memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One client's plan as read, and when.
#[derive(Debug, Clone, Copy)]
struct Entry {
    plan: Option<u16>,
    read_at: Instant,
}

#[derive(Default)]
struct Generations {
    young: HashMap<Box<[u8]>, Entry>,
    old: HashMap<Box<[u8]>, Entry>,
}

/// Plans read from the store, by client key.
pub struct PlanCache {
    refresh: Duration,
    capacity: usize,
    inner: Mutex<Generations>,
}

/// What the cache knows of a client's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    /// Read less than `refresh` ago: the plan (`None`: the store names none).
    Fresh(Option<u16>),
    /// Read before, longer ago: to read again (kept to answer if the store cannot).
    Stale(Option<u16>),
    /// Never read (or pushed out).
    Unknown,
}

impl PlanCache {
    /// Entries per generation: 2 x 50,000 keys of up to ~100 bytes stay under ~20 MB.
    pub const CAPACITY: usize = 50_000;

    /// A cache whose entries are fresh for `refresh`.
    pub fn new(refresh: Duration, capacity: usize) -> PlanCache {
        PlanCache {
            refresh,
            capacity: capacity.max(1),
            inner: Mutex::default(),
        }
    }

    /// Most entries held (both generations).
    pub fn capacity(&self) -> usize {
        2 * self.capacity
    }

    /// What is known of `key` at `now`.
    pub fn get(&self, key: &[u8], now: Instant) -> Cached {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = inner.young.get(key).or_else(|| inner.old.get(key)) else {
            return Cached::Unknown;
        };
        match now.saturating_duration_since(entry.read_at) < self.refresh {
            true => Cached::Fresh(entry.plan),
            false => Cached::Stale(entry.plan),
        }
    }

    /// `key`'s plan as read from the store at `read_at`.
    pub fn put(&self, key: &[u8], plan: Option<u16>, read_at: Instant) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.old.remove(key);
        if inner.young.len() >= self.capacity && !inner.young.contains_key(key) {
            let young = std::mem::take(&mut inner.young);
            inner.old = young;
        }
        inner.young.insert(key.into(), Entry { plan, read_at });
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.young.len() + inner.old.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_fresh_for_refresh_then_stale() {
        let cache = PlanCache::new(Duration::from_secs(2), 10);
        let t = Instant::now();
        assert_eq!(cache.get(b"k", t), Cached::Unknown);
        cache.put(b"k", Some(3), t);
        cache.put(b"n", None, t);
        assert_eq!(
            cache.get(b"k", t + Duration::from_millis(1999)),
            Cached::Fresh(Some(3))
        );
        assert_eq!(
            cache.get(b"n", t + Duration::from_millis(10)),
            Cached::Fresh(None)
        );
        assert_eq!(
            cache.get(b"k", t + Duration::from_secs(2)),
            Cached::Stale(Some(3))
        );
    }

    #[test]
    fn a_flood_of_keys_stays_bounded_and_keeps_the_recent_ones() {
        let cache = PlanCache::new(Duration::from_secs(60), 100);
        let t = Instant::now();
        cache.put(b"real", Some(1), t);
        for i in 0..10_000u32 {
            cache.put(&i.to_le_bytes(), None, t);
            // The real client keeps coming back: each read moves it young.
            if i % 50 == 0 {
                cache.put(b"real", Some(1), t);
            }
            assert!(cache.len() <= cache.capacity(), "{} at {i}", cache.len());
        }
        assert_eq!(cache.get(b"real", t), Cached::Fresh(Some(1)));
        assert_eq!(cache.get(&0u32.to_le_bytes(), t), Cached::Unknown);
        assert_eq!(cache.get(&9_999u32.to_le_bytes(), t), Cached::Fresh(None));
    }
}
