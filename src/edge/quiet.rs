//! "Nothing left, and nothing new for a while": the rule both ends of a graceful stop wait on.
//!
//! After Pingora's accept loop stops, a connection it accepted an instant before is counted
//! only once its task first runs, which on a loaded machine can be milliseconds later. One
//! reading of zero is therefore no proof that nothing is left: the count must stay at zero for
//! a quiet period, and anything counted meanwhile starts the period again. The rule is pure
//! (the caller passes the time in), so it is tested without sleeping.

use std::time::{Duration, Instant};

/// Watches a count that should reach zero and stay there for `period`.
#[derive(Debug, Clone)]
pub struct Quiet {
    period: Duration,
    /// When the count was last seen reaching zero; `None` while it is above zero.
    since: Option<Instant>,
}

impl Quiet {
    /// A rule that wants `period` of zeros.
    pub fn new(period: Duration) -> Self {
        Quiet {
            period,
            since: None,
        }
    }

    /// Read `count` at `now`: has it been zero (or below, which a gauge must not let hold
    /// anything up) for the whole period?
    pub fn settled(&mut self, count: i64, now: Instant) -> bool {
        if count > 0 {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_millis(200);

    #[test]
    fn settled_only_after_a_quiet_period_that_a_late_count_restarts() {
        let t0 = Instant::now();
        let mut q = Quiet::new(P);
        assert!(!q.settled(0, t0));
        assert!(!q.settled(0, t0 + P / 2));
        // Something counted late restarts the quiet period.
        assert!(!q.settled(1, t0 + P / 2));
        assert!(!q.settled(0, t0 + P));
        assert!(!q.settled(0, t0 + 2 * P - Duration::from_millis(1)));
        assert!(q.settled(0, t0 + 2 * P));
    }

    #[test]
    fn a_count_below_zero_does_not_hold_anything_up() {
        let t0 = Instant::now();
        let mut q = Quiet::new(P);
        assert!(!q.settled(-1, t0));
        assert!(q.settled(-1, t0 + P));
    }

    #[test]
    fn a_zero_period_is_settled_at_the_first_zero() {
        let mut q = Quiet::new(Duration::ZERO);
        assert!(!q.settled(3, Instant::now()));
        assert!(q.settled(0, Instant::now()));
    }
}
