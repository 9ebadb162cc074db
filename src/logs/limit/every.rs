//! One WARN line per key per interval for a recurring event (an upstream refusing
//! connections): the first occurrence at once, then at most one line per interval carrying
//! how many occurred since the last line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Pure throttle state of one recurring event.
#[derive(Debug, Default)]
pub struct Every {
    /// When the last line was written.
    at: Option<Instant>,
    /// Occurrences since the last line (this one included when a line is due).
    since: u64,
}

impl Every {
    /// One occurrence at `now`; the count to write when a line is due (at most one per
    /// `interval`).
    pub fn note(&mut self, now: Instant, interval: Duration) -> Option<u64> {
        self.since += 1;
        let due = self
            .at
            .is_none_or(|at| now.saturating_duration_since(at) >= interval);
        if !due {
            return None;
        }
        self.at = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

/// [`Every`] behind a mutex, for an event hooks on any thread note.
#[derive(Debug, Default)]
pub struct Throttled {
    every: Mutex<Every>,
}

impl Throttled {
    /// One occurrence now; the count to write if a line is due.
    pub fn note(&self, interval: Duration) -> Option<u64> {
        let mut every = self.every.lock().unwrap_or_else(|e| e.into_inner());
        every.note(Instant::now(), interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_at_once_then_one_line_per_interval_with_the_count() {
        let t = Instant::now();
        let i = Duration::from_secs(10);
        let mut e = Every::default();
        assert_eq!(e.note(t, i), Some(1));
        let mut lines = Vec::new();
        // 1000 events a second for 30 s.
        for ms in 1..30_000u64 {
            if let Some(n) = e.note(t + Duration::from_millis(ms), i) {
                lines.push(n);
            }
        }
        assert_eq!(lines, vec![10_000, 10_000]);
        assert_eq!(e.note(t + Duration::from_secs(40), i), Some(10_000));
    }
}
