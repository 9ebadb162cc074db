//! When a lane's sender gives up on a call, and when an idle sender ends: one timer per sender,
//! not one per call. Pure: the sender hands it the instants; it reads no clock.
//!
//! A call's deadline is the backend's timeout (Redis: `store.timeout`) from when it was sent. A
//! lane's calls travel on one connection and are answered in order, so the oldest call in flight
//! always runs out first: the sender keeps one timer, due at the oldest call's deadline. Each
//! call sent later is due later, so the timer only ever moves later, which Tokio does without
//! touching its timer wheel (a timer per call cost about 2k instructions per decision at one
//! connection: registered, parked on, removed).
//!
//! The timeout bounds waiting for an *unresponsive* store, never waiting that is the proxy's own
//! doing. When the proxy's threads are busy, a timer fires late and a reply that arrived in
//! time sits unread in a socket: a timer that fired more than [`LAG_TOLERANCE`] late proves
//! nothing about the store, so the calls in flight get a grace as long as the proxy was late
//! (at most one timeout at a time), and only time the proxy was free to notice an answer counts.
//!
//! With nothing in flight, the timer is when the idle sender ends: one timeout after it sent its
//! last call. A busy lane thus keeps one sender (and one timer) instead of starting one per
//! busy period, and an idle one holds nothing for longer than a timeout.

use std::time::{Duration, Instant};

/// A timer that fires later than this was late because the proxy was busy.
pub(crate) const LAG_TOLERANCE: Duration = Duration::from_millis(5);

/// One sender's deadlines (see the module documentation).
#[derive(Debug)]
pub(crate) struct Deadlines {
    timeout: Duration,
    /// Calls in flight are not failed before this (the proxy was late; see [`Self::fired`]).
    grace: Option<Instant>,
    /// When the last call was sent.
    last_activity: Instant,
}

/// What the timer's firing means (see [`Deadlines::fired`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fired {
    /// The timer fired late: the calls in flight wait on, until the new due time.
    Late,
    /// Every call in flight sent at or before this instant ran out its deadline.
    Expired(Instant),
    /// Nothing in flight, idle for a timeout: the sender may end.
    Idle,
}

impl Deadlines {
    /// A sender starting at `now`, giving up on a call after `timeout`.
    pub(crate) fn new(timeout: Duration, now: Instant) -> Deadlines {
        Deadlines {
            timeout,
            grace: None,
            last_activity: now,
        }
    }

    /// A call was sent at `now`.
    pub(crate) fn activity(&mut self, now: Instant) {
        self.last_activity = self.last_activity.max(now);
    }

    /// When the timer is due, with the oldest call in flight sent at `oldest` (`None`: none).
    pub(crate) fn due(&mut self, oldest: Option<Instant>) -> Instant {
        match oldest {
            Some(sent) => (sent + self.timeout).max(self.grace.unwrap_or(sent)),
            None => {
                // A grace is for the calls that were in flight when the proxy was late.
                self.grace = None;
                self.last_activity + self.timeout
            }
        }
    }

    /// The timer, due at `due`, fired at `now`, with the oldest call in flight sent at `oldest`.
    pub(crate) fn fired(&mut self, now: Instant, due: Instant, oldest: Option<Instant>) -> Fired {
        if oldest.is_none() {
            return Fired::Idle;
        }
        let late = now.saturating_duration_since(due);
        if late > LAG_TOLERANCE {
            // The proxy was too busy to tell whether an answer came: look again once it has
            // been free for as long as it was late.
            self.grace = Some(now + late.min(self.timeout));
            return Fired::Late;
        }
        // The timer never fires before `due`, at least the oldest call's deadline.
        Fired::Expired(now - self.timeout)
    }
}

#[cfg(test)]
mod tests;
