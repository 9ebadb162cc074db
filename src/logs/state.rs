//! WARN lines when a route's limiter changes state (fail-open, fail-closed, local fallback,
//! overflow, back to normal): one line per change, naming the route and how many decisions
//! each state took since the last line, a reminder with the counts while the route stays out
//! of normal, and at most one line per route per [`MIN_INTERVAL`]. Not one line per request,
//! and not silence.
//!
//! The hot path costs one relaxed atomic load while a route stays normal; the bookkeeping,
//! behind a mutex, only runs while a route is in some other state or changing.

use std::fmt::Display;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per route this often.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// How a route's limiter is deciding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LimiterState {
    /// The store decides.
    Normal = 0,
    /// The store cannot decide; requests are admitted unrecorded (`on_error = "allow"`).
    FailOpen = 1,
    /// The store cannot decide; requests get 503 (`on_error = "deny"`).
    FailClosed = 2,
    /// The shared store cannot decide; this proxy's local log decides (`on_error = "local"`).
    Local = 3,
    /// The memory store's share for this route cannot hold even one client's bucket: clients
    /// are decided in its summary of evicted clients alone.
    Overflow = 4,
}

impl LimiterState {
    fn describe(self) -> &'static str {
        match self {
            LimiterState::Normal => "store deciding again",
            LimiterState::FailOpen => "store failing: admitting unrecorded (on_error = allow)",
            LimiterState::FailClosed => "store failing: answering 503 (on_error = deny)",
            LimiterState::Local => "shared store failing: deciding locally (on_error = local)",
            LimiterState::Overflow => {
                "memory store arena (the route's share of max_memory) too small for one bucket: deciding in its summary alone"
            }
        }
    }
}

/// One route's log state.
#[derive(Debug)]
pub struct StateLog {
    /// The last state noted, for the cheap "still normal" check.
    current: AtomicU8,
    book: Mutex<Book>,
}

/// What the last line said and what happened since.
#[derive(Debug)]
struct Book {
    /// The state the last line announced (or `Normal` before any line).
    logged: LimiterState,
    /// When the last line was written.
    at: Option<Instant>,
    /// Decisions per state since the last line, indexed by the state's number.
    since: [u64; 5],
}

/// A line to write: the state now and the counts since the last line.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    /// The state now.
    pub state: LimiterState,
    /// Decisions in each state since the last line (this one included), in state order.
    pub since: Vec<(LimiterState, u64)>,
}

impl Default for StateLog {
    fn default() -> Self {
        StateLog {
            current: AtomicU8::new(LimiterState::Normal as u8),
            book: Mutex::new(Book {
                logged: LimiterState::Normal,
                at: None,
                since: [0; 5],
            }),
        }
    }
}

impl StateLog {
    /// One decision of `route` was made in `state`; writes a WARN line when one is due.
    pub fn note(&self, route: &str, state: LimiterState) {
        self.note_cause(route, state, None);
    }

    /// [`StateLog::note`] of a decision the store failed (`cause`): a line written for it
    /// says what the store did ("store timed out after 50ms"), formatted only then.
    pub fn note_cause(&self, route: &str, state: LimiterState, cause: Option<&dyn Display>) {
        self.note_at(route, (state, cause), Instant::now());
    }

    /// [`StateLog::note_cause`] at `now`; the line written, if one was.
    fn note_at(
        &self,
        route: &str,
        (state, cause): (LimiterState, Option<&dyn Display>),
        now: Instant,
    ) -> Option<Line> {
        let normal = LimiterState::Normal as u8;
        if state == LimiterState::Normal && self.current.load(Ordering::Relaxed) == normal {
            return None;
        }
        let line = {
            let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
            let line = book.note(state, now);
            // Back to normal within the interval after an outage's line: the "deciding
            // again" line is still due, so the book keeps seeing normal decisions until it is
            // written (the fast path above would otherwise skip it for good).
            let pending = state == LimiterState::Normal && book.logged != LimiterState::Normal;
            let shown = if pending { book.logged } else { state };
            self.current.store(shown as u8, Ordering::Relaxed);
            line
        };
        if let Some(line) = &line {
            let counts: Vec<String> = line
                .since
                .iter()
                .map(|(s, n)| format!("{n} {}", label(*s)))
                .collect();
            let counts = if counts.is_empty() {
                String::new()
            } else {
                format!(" ({} since the last line)", counts.join(", "))
            };
            match cause {
                Some(cause) => log::warn!(
                    "route {route}: {}{counts}; last error: {cause}",
                    line.state.describe()
                ),
                None => log::warn!("route {route}: {}{counts}", line.state.describe()),
            }
        }
        line
    }
}

/// A state's name in the counts of a line.
fn label(state: LimiterState) -> &'static str {
    match state {
        LimiterState::Normal => "decided by the store",
        LimiterState::FailOpen => "admitted unrecorded",
        LimiterState::FailClosed => "answered 503",
        LimiterState::Local => "decided locally",
        LimiterState::Overflow => "decided in the summary",
    }
}

const STATES: [LimiterState; 5] = [
    LimiterState::Normal,
    LimiterState::FailOpen,
    LimiterState::FailClosed,
    LimiterState::Local,
    LimiterState::Overflow,
];

impl Book {
    /// Pure: count one decision in `state` at `now`; the line to write, if the state differs
    /// from the last line's and the last line is at least [`MIN_INTERVAL`] old.
    fn note(&mut self, state: LimiterState, now: Instant) -> Option<Line> {
        self.since[state as usize] += 1;
        let due = self
            .at
            .is_none_or(|at| now.duration_since(at) >= MIN_INTERVAL);
        // A change, or a reminder while not normal, never more often than the interval.
        let worth = state != self.logged || state != LimiterState::Normal;
        if !(worth && due) {
            return None;
        }
        let since = STATES
            .iter()
            .filter(|&&s| self.since[s as usize] > 0)
            .map(|&s| (s, self.since[s as usize]))
            .collect();
        self.logged = state;
        self.at = Some(now);
        self.since = [0; 5];
        Some(Line { state, since })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> Book {
        Book {
            logged: LimiterState::Normal,
            at: None,
            since: [0; 5],
        }
    }

    #[test]
    fn normal_traffic_writes_nothing() {
        let mut b = book();
        let t = Instant::now();
        for i in 0..1000 {
            assert_eq!(
                b.note(LimiterState::Normal, t + Duration::from_millis(i)),
                None
            );
        }
    }

    #[test]
    fn a_change_is_one_line_then_silence_then_the_count() {
        let mut b = book();
        let t = Instant::now();
        b.note(LimiterState::Normal, t);
        let first = b.note(LimiterState::Local, t).unwrap();
        assert_eq!(first.state, LimiterState::Local);
        assert_eq!(
            first.since,
            vec![(LimiterState::Normal, 1), (LimiterState::Local, 1)]
        );
        for i in 1..500 {
            assert_eq!(
                b.note(LimiterState::Local, t + Duration::from_millis(i)),
                None
            );
        }
        // Back within the interval: no line yet, counted.
        assert_eq!(
            b.note(LimiterState::Normal, t + Duration::from_secs(1)),
            None
        );
        let back = b.note(LimiterState::Normal, t + MIN_INTERVAL).unwrap();
        assert_eq!(back.state, LimiterState::Normal);
        assert_eq!(
            back.since,
            vec![(LimiterState::Normal, 2), (LimiterState::Local, 499)]
        );
        // Normal again: silence.
        assert_eq!(b.note(LimiterState::Normal, t + 3 * MIN_INTERVAL), None);
    }

    #[test]
    fn back_to_normal_soon_after_an_outage_is_still_said() {
        let log = StateLog::default();
        let t = Instant::now();
        let at = |state, now| log.note_at("r", (state, None), now);
        assert!(at(LimiterState::FailClosed, t).is_some());
        // Back within the interval: no line yet, and not forgotten either.
        assert_eq!(at(LimiterState::Normal, t + Duration::from_secs(3)), None);
        assert_eq!(at(LimiterState::Normal, t + Duration::from_secs(5)), None);
        let back = at(LimiterState::Normal, t + MIN_INTERVAL).expect("the recovery line");
        assert_eq!(back.state, LimiterState::Normal);
        // Then silence, on the fast path.
        assert_eq!(at(LimiterState::Normal, t + 2 * MIN_INTERVAL), None);
        assert_eq!(
            log.current.load(Ordering::Relaxed),
            LimiterState::Normal as u8
        );
    }

    #[test]
    fn a_lasting_outage_is_reminded_once_per_interval() {
        let mut b = book();
        let t = Instant::now();
        assert!(b.note(LimiterState::FailClosed, t).is_some());
        assert_eq!(b.note(LimiterState::FailClosed, t + MIN_INTERVAL / 2), None);
        let reminder = b.note(LimiterState::FailClosed, t + MIN_INTERVAL).unwrap();
        assert_eq!(reminder.since, vec![(LimiterState::FailClosed, 2)]);
    }

    #[test]
    fn flapping_is_rate_limited_per_interval() {
        let mut b = book();
        let t = Instant::now();
        let mut lines = 0;
        for i in 0..10_000u64 {
            let state = if i % 2 == 0 {
                LimiterState::FailOpen
            } else {
                LimiterState::Normal
            };
            lines += b.note(state, t + Duration::from_millis(i * 3)).is_some() as u32;
        }
        // 30 s of flapping: one line at the start and one per 10 s after.
        assert!(lines <= 4, "{lines} lines");
    }
}
