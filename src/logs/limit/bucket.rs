//! The log's token bucket, pure: every decision takes the clock as an argument.

use std::time::{Duration, Instant};

/// A token bucket of log lines, and the count of lines it refused since the last summary.
#[derive(Debug)]
pub struct Bucket {
    /// Time worth of lines held: one line per `per_line`, at most `cap`.
    credit: Duration,
    per_line: Duration,
    cap: Duration,
    /// When `credit` was last brought up to date.
    at: Instant,
    /// Lines refused since the last summary.
    refused: u64,
    /// Minimum time between summaries.
    interval: Duration,
    /// When the last summary was due or written.
    summarised: Instant,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    /// Write it (else it is dropped and counted).
    pub write: bool,
    /// Write first a summary of this many dropped lines.
    pub summary: Option<u64>,
}

impl Bucket {
    /// A full bucket of `burst` lines refilling at `rate` lines per second, summarising
    /// refused lines at most once per `interval`.
    pub fn new(rate: u32, burst: u32, interval: Duration, now: Instant) -> Bucket {
        let per_line = Duration::from_secs(1) / rate.max(1);
        let cap = per_line * burst.max(1);
        Bucket {
            credit: cap,
            per_line,
            cap,
            at: now,
            refused: 0,
            interval,
            summarised: now,
        }
    }

    /// One line at `now`.
    pub fn admit(&mut self, now: Instant) -> Admit {
        self.credit = (self.credit + now.saturating_duration_since(self.at)).min(self.cap);
        self.at = self.at.max(now);
        let write = self.credit >= self.per_line;
        if write {
            self.credit -= self.per_line;
        } else {
            self.refused += 1;
        }
        Admit {
            write,
            summary: self.tick(now),
        }
    }

    /// The count of refused lines to summarise now, if any and the last summary is at least
    /// an interval old.
    pub fn tick(&mut self, now: Instant) -> Option<u64> {
        if self.refused == 0 || now.saturating_duration_since(self.summarised) < self.interval {
            return None;
        }
        self.summarised = now;
        Some(std::mem::take(&mut self.refused))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn bucket(now: Instant) -> Bucket {
        Bucket::new(20, 100, 10 * S, now)
    }

    #[test]
    fn a_burst_is_written_then_the_rate_holds() {
        let t = Instant::now();
        let mut b = bucket(t);
        let written = (0..1000).filter(|_| b.admit(t).write).count();
        assert_eq!(written, 100);
        // One second later: 20 more.
        let written = (0..1000).filter(|_| b.admit(t + S).write).count();
        assert_eq!(written, 20);
    }

    /// A flood of a minute, 10 000 lines a second: at most the burst plus the rate per
    /// second, and one summary per interval that adds up to every refused line.
    #[test]
    fn a_flood_is_bounded_and_every_refused_line_is_summarised() {
        let t = Instant::now();
        let mut b = bucket(t);
        let (mut written, mut summaries, mut summarised) = (0u64, 0u64, 0u64);
        let total = 60 * 10_000u64;
        for i in 0..total {
            let now = t + Duration::from_micros(i * 100);
            let a = b.admit(now);
            written += a.write as u64;
            if let Some(n) = a.summary {
                summaries += 1;
                summarised += n;
            }
        }
        assert!(written <= 100 + 20 * 60, "{written} lines written");
        assert!(written >= 20 * 60, "{written} lines written");
        assert!((5..=6).contains(&summaries), "{summaries} summaries");
        // The rest is summarised by the ticker after the flood.
        let end = t + 70 * S;
        summarised += b.tick(end).unwrap_or(0);
        assert_eq!(summarised + written, total);
        assert_eq!(b.tick(end + 60 * S), None, "nothing left to say");
    }

    #[test]
    fn quiet_logs_never_summarise() {
        let t = Instant::now();
        let mut b = bucket(t);
        for i in 0..600 {
            let a = b.admit(t + S * i);
            assert!(a.write);
            assert_eq!(a.summary, None);
        }
    }

    #[test]
    fn a_clock_going_backwards_grants_nothing() {
        let t = Instant::now() + 100 * S;
        let mut b = bucket(t);
        let _ = (0..100).map(|_| b.admit(t)).count();
        assert!(!b.admit(t - 50 * S).write);
        assert!(!b.admit(t).write);
    }
}
