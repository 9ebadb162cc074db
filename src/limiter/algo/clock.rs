//! Where the memory store's window rules get `now`: a [`Clock`] passed in, so the rules run
//! on a [`FakeClock`] in tests (no sleeps) and on a [`MonotonicClock`] in the proxy. The
//! Redis store needs none: its script reads Redis's `TIME`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The instant a [`Clock`]'s 0 stands for: 2020-01-01T00:00:00Z, µs since the Unix epoch. A
/// clock's values are the wall-clock time it reckons, less this (small enough for the memory
/// store's summary cells: 40 bits of ms last until 2054), so a kind that counts calendar time
/// (`calendar.rs`) finds it on the store's own clock.
pub const UNIX_AT_ZERO_US: u64 = 1_577_836_800_000_000;

/// A source of microseconds that never go back. Read once per decision (under the bucket's
/// lock), so a dynamic call costs nothing next to the decision.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since [`UNIX_AT_ZERO_US`] as this clock reckons it; never 0 (0 is no valid
    /// timestamp in a record).
    fn now_us(&self) -> u64;
}

/// The monotonic clock of the process, set to the wall clock when it was made and running at
/// the monotonic pace since (a wall clock stepped later moves no decision).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    epoch: Instant,
    /// The clock's value at `epoch`.
    start_us: u64,
}

impl MonotonicClock {
    /// A clock reading the wall clock now.
    pub fn new() -> MonotonicClock {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        MonotonicClock {
            epoch: Instant::now(),
            start_us: wall.saturating_sub(UNIX_AT_ZERO_US).max(1),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        self.start_us + self.epoch.elapsed().as_micros() as u64
    }
}

/// A clock that moves only when told (as linkerd2-proxy's fake clocks): clones share one
/// time, so a test keeps a handle while the store reads another.
#[derive(Debug, Clone)]
pub struct FakeClock(Arc<AtomicU64>);

impl FakeClock {
    /// A clock at `us` microseconds (at least 1).
    pub fn at(us: u64) -> FakeClock {
        FakeClock(Arc::new(AtomicU64::new(us.max(1))))
    }

    /// Move the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
    }
}

impl Default for FakeClock {
    /// A clock at 1 µs.
    fn default() -> Self {
        FakeClock::at(1)
    }
}

impl Clock for FakeClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_told_and_its_clones_share_it() {
        let clock = FakeClock::default();
        let store_side = clock.clone();
        assert_eq!(store_side.now_us(), 1);
        clock.advance(Duration::from_millis(2));
        assert_eq!(store_side.now_us(), 2001);
    }

    #[test]
    fn the_monotonic_clock_starts_at_the_wall_clock_and_never_goes_back() {
        let clock = MonotonicClock::new();
        let (a, b) = (clock.now_us(), clock.now_us());
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert!(b >= a && a + UNIX_AT_ZERO_US <= wall && wall - a - UNIX_AT_ZERO_US < 1_000_000);
    }
}
