//! In-process store: exact within one process, sharded (no global lock on the hot path), and
//! bounded (buckets whose every log has slid out of its window are swept away).
//!
//! It has exactly the semantics of the Redis script, so the conformance suite runs against
//! both; it is the default store for single-instance deployments and tests.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use dashmap::DashMap;

use super::{Limit, LimitState, LimitView, Store, StoreError, Verdict, WindowView};

/// The log of one limit of one bucket: admitted timestamps (µs on the store's monotonic clock),
/// oldest first.
#[derive(Debug, Default)]
struct WindowLog {
    window_us: u64,
    entries: VecDeque<u64>,
}

impl WindowLog {
    /// Drop entries that are `window` or more old: an entry recorded at `t` frees its slot at
    /// exactly `t + window` (the same rule as the Lua script).
    fn evict(&mut self, now: u64) {
        let cutoff = now.saturating_sub(self.window_us);
        while self.entries.front().is_some_and(|&t| t <= cutoff) {
            self.entries.pop_front();
        }
    }
}

/// All logs of one bucket (route + client), keyed by window length so that a reload that only
/// changes `requests` keeps the recorded entries.
#[derive(Debug, Default)]
struct Bucket {
    logs: Vec<WindowLog>,
}

impl Bucket {
    fn log_index(&mut self, window_us: u64) -> usize {
        match self.logs.iter().position(|l| l.window_us == window_us) {
            Some(i) => i,
            None => {
                self.logs.push(WindowLog {
                    window_us,
                    entries: VecDeque::new(),
                });
                self.logs.len() - 1
            }
        }
    }
}

/// The in-process sliding-window-log store.
pub struct MemoryStore {
    buckets: DashMap<Box<str>, Bucket>,
    epoch: Instant,
    /// Wall-clock time of `epoch`, µs since the Unix epoch: the inspector shows timestamps on a
    /// clock people can read, while decisions stay on the monotonic one.
    epoch_unix_us: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            buckets: DashMap::new(),
            epoch: Instant::now(),
            epoch_unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        }
    }

    /// Microseconds on a monotonic clock; offset by one so that 0 never is a valid timestamp.
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    /// Number of buckets currently held.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True when no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Total recorded entries over all buckets and limits.
    pub fn entries(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.logs.iter().map(|l| l.entries.len()).sum::<usize>())
            .sum()
    }

    /// Evict expired entries everywhere and drop buckets with nothing left, so a million
    /// one-off clients do not stay in memory. Each shard is locked only while it is swept.
    pub fn sweep(&self) {
        let now = self.now_us();
        self.buckets.retain(|_, bucket| {
            bucket.logs.retain_mut(|log| {
                log.evict(now);
                !log.entries.is_empty()
            });
            !bucket.logs.is_empty()
        });
        // Give memory back after a wave of one-off clients, but don't rehash every second.
        if self.buckets.len() < self.buckets.capacity() / 4 {
            self.buckets.shrink_to_fit();
        }
    }

    fn decide(bucket: &mut Bucket, limits: &[Limit], now: u64) -> Verdict {
        // Pass 1: evict and count every limit; admitted only if all have room.
        let mut admitted = true;
        for limit in limits {
            let i = bucket.log_index(limit.window.as_micros() as u64);
            let log = &mut bucket.logs[i];
            log.evict(now);
            admitted &= log.entries.len() < limit.requests as usize;
        }
        // Pass 2: record in all or none, and report each limit's state.
        let states = limits
            .iter()
            .map(|limit| {
                let i = bucket.log_index(limit.window.as_micros() as u64);
                let log = &mut bucket.logs[i];
                if admitted {
                    log.entries.push_back(now);
                }
                // A full limit admits again when entry[len - requests] leaves: the oldest,
                // unless a reload lowered `requests` below what the log already holds.
                let pivot = log.entries.len().saturating_sub(limit.requests as usize);
                let reset_us = match log.entries.get(pivot) {
                    Some(&t) => t + log.window_us - now,
                    None => log.window_us,
                };
                LimitState {
                    remaining: u64::from(limit.requests).saturating_sub(log.entries.len() as u64)
                        as u32,
                    reset: Duration::from_micros(reset_us),
                }
            })
            .collect();
        Verdict { admitted, states }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn check(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError> {
        let now = self.now_us();
        // Look up first so the common case (known bucket) does not allocate the key.
        if let Some(mut b) = self.buckets.get_mut(bucket) {
            return Ok(Self::decide(&mut b, limits, now));
        }
        let mut b = self.buckets.entry(bucket.into()).or_default();
        Ok(Self::decide(&mut b, limits, now))
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        let now = self.now_us();
        let to_unix = |t: u64| t + self.epoch_unix_us;
        // A read lock only: nothing is evicted or recorded (eviction is the next check's job).
        let b = self.buckets.get(bucket);
        let limits = limits
            .iter()
            .map(|limit| {
                let window_us = limit.window.as_micros() as u64;
                let cutoff = now.saturating_sub(window_us);
                let entries: Vec<u64> = b
                    .as_ref()
                    .and_then(|b| b.logs.iter().find(|l| l.window_us == window_us))
                    .map(|log| {
                        log.entries
                            .iter()
                            .filter(|&&t| t > cutoff)
                            .map(|&t| to_unix(t))
                            .collect()
                    })
                    .unwrap_or_default();
                LimitView::from_entries(limit, &entries, to_unix(now))
            })
            .collect();
        Ok(WindowView {
            now_us: to_unix(now),
            limits,
        })
    }

    async fn reset(&self, bucket: &str, _limits: &[Limit]) -> Result<(), StoreError> {
        self.buckets.remove(bucket);
        Ok(())
    }

    fn sweep_expired(&self) {
        self.sweep();
    }
}
