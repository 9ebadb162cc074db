//! What was learned of one bucket: per limit, how many entries the shared store held and when
//! they leave the window (pure rules on a given instant; see [`super::learned`]).

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::limiter::{Limit, LimitId, Verdict};

/// What was learned of one limit of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LearnedLimit {
    id: LimitId,
    /// Entries in the window when learned.
    count: u32,
    /// Room left when learned: with `count`, how full the limit was.
    remaining: u32,
    /// When the oldest of them leaves the window.
    oldest_frees: Instant,
    /// When the last of them leaves the window, at the latest.
    all_free: Instant,
}

/// What was learned of one bucket: one entry per limit, in the route's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LearnedBucket {
    limits: SmallVec<[LearnedLimit; 2]>,
    /// Until when this proxy's own log may hold admissions of the bucket (see
    /// [`Learned::mark_local`]).
    pub(super) local_until: Option<Instant>,
    /// When the decision this was learned from was asked: a later-read answer to an earlier
    /// question does not replace it.
    pub(super) asked: Option<Instant>,
}

impl LearnedBucket {
    /// What `verdict` (for `limits`, given at `now`) says is in the bucket.
    pub fn from_verdict(limits: &[Limit], verdict: &Verdict, now: Instant) -> LearnedBucket {
        let limits = limits
            .iter()
            .zip(&verdict.states)
            .map(|(limit, state)| LearnedLimit {
                id: limit.id(),
                count: limit.requests.saturating_sub(state.remaining),
                remaining: state.remaining,
                oldest_frees: now + state.reset.min(limit.window),
                all_free: now + limit.window,
            })
            .collect();
        LearnedBucket {
            limits,
            local_until: None,
            asked: None,
        }
    }

    /// How many learned entries of limit `i` are still in its window at `now`, at least (the
    /// oldest until it frees, the others until a window after they were learned); 0 when the
    /// limit is not the one learned (a reload changed it).
    pub fn held(&self, i: usize, limit: &Limit, now: Instant) -> u32 {
        let Some(l) = self.limits.get(i).filter(|l| l.id == limit.id()) else {
            return 0;
        };
        if l.count == 0 || now >= l.all_free {
            0
        } else if now < l.oldest_frees {
            l.count
        } else {
            l.count - 1
        }
    }

    /// When the learned entries of limit `i` next free one place, after `now`.
    pub fn next_free(&self, i: usize, now: Instant) -> Duration {
        self.limits.get(i).map_or(Duration::ZERO, |l| {
            let at = if now < l.oldest_frees {
                l.oldest_frees
            } else {
                l.all_free
            };
            at.saturating_duration_since(now)
        })
    }

    pub(super) fn spent(&self, now: Instant) -> bool {
        self.local_until.is_none_or(|t| now >= t)
            && (self.limits.iter()).all(|l| l.count == 0 || now >= l.all_free)
    }

    pub(super) fn single(&self) -> bool {
        self.local_until.is_none() && self.limits.iter().all(|l| l.count <= 1)
    }

    /// How full the fullest limit was when learned, in thousandths (1000: at its limit); a
    /// bucket the local log may hold admissions of counts as full.
    pub(super) fn fill(&self) -> u32 {
        if self.local_until.is_some() {
            return 1000;
        }
        let of = |l: &LearnedLimit| {
            let all = u64::from(l.count) + u64::from(l.remaining);
            (u64::from(l.count) * 1000).checked_div(all).unwrap_or(0) as u32
        };
        self.limits.iter().map(of).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitState;

    fn verdict(admitted: bool, remaining: u32, reset: Duration) -> Verdict {
        Verdict {
            admitted,
            recorded_at: admitted.then_some(1),
            recorded_each: Vec::new(),
            states: vec![LimitState { remaining, reset }],
        }
    }

    /// The learned count is held while its entries can still be in the window, and no longer:
    /// pure arithmetic on a given clock, no sleeping.
    #[test]
    fn held_counts_free_one_then_all() {
        let t0 = Instant::now();
        let limit = Limit::log(5, Duration::from_secs(60));
        let b =
            LearnedBucket::from_verdict(&[limit], &verdict(true, 2, Duration::from_secs(20)), t0);
        assert_eq!(b.held(0, &limit, t0), 3);
        assert_eq!(b.held(0, &limit, t0 + Duration::from_secs(19)), 3);
        assert_eq!(b.next_free(0, t0), Duration::from_secs(20));
        assert_eq!(b.held(0, &limit, t0 + Duration::from_secs(20)), 2);
        assert_eq!(
            b.next_free(0, t0 + Duration::from_secs(20)),
            Duration::from_secs(40)
        );
        assert_eq!(b.held(0, &limit, t0 + Duration::from_secs(60)), 0);
        // A denial: the whole limit is held.
        let d =
            LearnedBucket::from_verdict(&[limit], &verdict(false, 0, Duration::from_secs(5)), t0);
        assert_eq!(d.held(0, &limit, t0), 5);
        // Another limit (a reload changed the window): nothing learned of it.
        let other = Limit::log(5, Duration::from_secs(30));
        assert_eq!(d.held(0, &other, t0), 0);
    }
}
