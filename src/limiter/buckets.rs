//! Which bucket each limit of a decision counts in ([`Buckets`]), and how a decision over
//! several buckets is made all-or-nothing by stores that cannot decide them in one atomic step
//! ([`reserve_in_order`]).
//!
//! A route's limits count in the route's bucket unless a limit has a key of its own
//! (`limits[].key`): `{ requests = 2000, window = "1m", key = "global" }` counts every client's
//! requests in one bucket while the route's other limits count per client. The common case,
//! every limit in one bucket, is [`Buckets::one`]: a borrowed text, nothing allocated.

use std::future::Future;

use super::{Checked, Limit, LimitState, Verdict};

/// The bucket of each limit of one decision: one for all, or one per limit (see the module
/// documentation). Cheap to copy: it borrows the texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets<'a> {
    /// The route's own bucket (the route's key), and every limit's unless `of_limit` says
    /// otherwise.
    first: &'a str,
    /// The other buckets (the limits' own keys), in the route's order of first use.
    rest: &'a [String],
    /// Per limit: 0 for `first`, `k` for `rest[k - 1]`. Empty: every limit counts in `first`.
    of_limit: &'a [u8],
}

impl<'a> Buckets<'a> {
    /// Every limit counts in `bucket`.
    pub const fn one(bucket: &'a str) -> Buckets<'a> {
        Buckets {
            first: bucket,
            rest: &[],
            of_limit: &[],
        }
    }

    /// Limit `i` counts in `first` when `of_limit[i]` is 0, else in `rest[of_limit[i] - 1]`
    /// (an empty `of_limit`: every limit in `first`). An index past `rest` means `first`.
    pub const fn stacked(first: &'a str, rest: &'a [String], of_limit: &'a [u8]) -> Buckets<'a> {
        Buckets {
            first,
            rest,
            of_limit,
        }
    }

    /// True when every limit counts in one bucket ([`Buckets::first`]).
    pub fn is_one(&self) -> bool {
        self.of_limit.iter().all(|&k| self.text(k) == self.first)
    }

    /// The route's own bucket (the one a client's waiting queue and learned state are kept
    /// under).
    pub fn first(&self) -> &'a str {
        self.first
    }

    /// The bucket limit `i` counts in.
    pub fn of(&self, i: usize) -> &'a str {
        self.text(self.of_limit.get(i).copied().unwrap_or(0))
    }

    fn text(&self, k: u8) -> &'a str {
        match k {
            0 => self.first,
            k => self.rest.get(usize::from(k) - 1).map_or(self.first, |s| s),
        }
    }

    /// The distinct buckets of `limits`, each with the indexes of its limits, in the order
    /// stores reserve them: the route's own bucket first, then the limits' own keys in the
    /// route's order (the config puts a `global` one last). Every request of a route, on every
    /// proxy, meets its buckets in this one order; and the broad bucket, reserved last, is never
    /// given back: only a narrower one is, and only when the broad one is full (see
    /// [`reserve_in_order`]).
    pub fn groups(&self, limits: usize) -> Vec<(&'a str, Vec<usize>)> {
        let mut groups: Vec<(&'a str, Vec<usize>)> = Vec::with_capacity(1 + self.rest.len());
        let key_of = |i: usize| usize::from(self.of_limit.get(i).copied().unwrap_or(0));
        for k in 0..=self.rest.len() {
            for i in (0..limits).filter(|&i| key_of(i).min(self.rest.len()) == k) {
                let bucket = self.of(i);
                match groups.iter_mut().find(|(b, _)| *b == bucket) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((bucket, vec![i])),
                }
            }
        }
        groups
    }

    /// Every limit's bucket, owned (what a queued decision keeps).
    pub fn per_limit(&self, limits: usize) -> Box<[Box<str>]> {
        (0..limits).map(|i| self.of(i).into()).collect()
    }
}

/// The record time of every limit of an admission: `at[0]` for all when it has one entry, else
/// one per limit (see [`Verdict::recorded_times`]).
pub fn time_of(at: &[u64], i: usize) -> u64 {
    at.get(i).or(at.first()).copied().unwrap_or(0)
}

/// One part of a decision a store can make atomically: some of the limits (their indexes in
/// the route's list), in the order the parts are reserved.
pub struct Step {
    /// Indexes into the decision's limits.
    pub members: Vec<usize>,
}

/// Decide the `parts` of one decision one after another, each atomically by `decide` (its
/// limits and their indexes), and give back with `release` (the part's limits, indexes and
/// record time) what earlier parts admitted as soon as one part denies: all-or-nothing for a
/// store that cannot decide every part in one atomic step (a Redis Cluster, whose keys in
/// different hash slots cannot be one script call; the memory store, whose buckets are under
/// different locks).
///
/// Between a part's reservation and its release another decision may find that part one fuller
/// than it ends up: it may be denied (a brief over-count), never admitted past a limit, since
/// every part's own decision is exact. Callers reserve in one fixed order, the route's key
/// order ([`Buckets::groups`]), so two requests over the same buckets meet in the same order and
/// one of them wins, instead of each holding one bucket and losing the other. With the broad
/// bucket last, a reservation is given back only when that last bucket is full, so the brief
/// over-count can only deny a request the full bucket denies anyway.
///
/// The verdict's states are in the order of `limits`: an earlier part's states as its admission
/// left them less the released request; a part not reached shows its full `requests` left.
pub async fn reserve_in_order<D, DF, R, RF>(
    limits: &[Limit],
    parts: &[Step],
    mut decide: D,
    mut release: R,
) -> Checked
where
    D: FnMut(Vec<Limit>, &[usize]) -> DF,
    DF: Future<Output = Checked>,
    R: FnMut(Vec<Limit>, &[usize], u64) -> RF,
    RF: Future<Output = ()>,
{
    let mut states: Vec<Option<LimitState>> = vec![None; limits.len()];
    let mut times = vec![0u64; limits.len()];
    let mut reserved: Vec<(usize, u64)> = Vec::with_capacity(parts.len());
    let pick = |members: &[usize]| members.iter().map(|&i| limits[i]).collect::<Vec<_>>();
    let mut admitted = true;
    for (p, part) in parts.iter().enumerate() {
        let verdict = match decide(pick(&part.members), &part.members).await {
            Ok(v) => v,
            Err(e) => {
                give_back(&mut release, parts, &reserved, &pick).await;
                return Err(e);
            }
        };
        for (state, &i) in verdict.states.iter().zip(&part.members) {
            states[i] = Some(*state);
            times[i] = verdict.recorded_at.unwrap_or(0);
        }
        if !verdict.admitted {
            admitted = false;
            break;
        }
        reserved.push((p, verdict.recorded_at.unwrap_or(0)));
    }
    if !admitted {
        give_back(&mut release, parts, &reserved, &pick).await;
        for &(p, _) in &reserved {
            for &i in &parts[p].members {
                if let Some(s) = &mut states[i] {
                    // What the reservation took: its weight (a cost limit's cost), not 1.
                    let took = limits[i].weight;
                    s.remaining = s.remaining.saturating_add(took).min(limits[i].requests);
                }
            }
        }
    }
    let states = (states.into_iter().zip(limits))
        .map(|(s, l)| {
            s.unwrap_or(LimitState {
                remaining: l.requests,
                reset: l.window,
            })
        })
        .collect();
    Ok(Verdict::combined(admitted, states, times))
}

/// Release every reserved part (its index and record time).
async fn give_back<R, RF>(
    release: &mut R,
    parts: &[Step],
    reserved: &[(usize, u64)],
    pick: &impl Fn(&[usize]) -> Vec<Limit>,
) where
    R: FnMut(Vec<Limit>, &[usize], u64) -> RF,
    RF: Future<Output = ()>,
{
    for &(p, at) in reserved {
        let members = &parts[p].members;
        release(pick(members), members, at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bucket_for_every_limit_and_stacked_ones() {
        let one = Buckets::one("r:ip:1");
        assert!(one.is_one());
        assert_eq!((one.of(0), one.of(3)), ("r:ip:1", "r:ip:1"));
        let rest = vec!["r:global".to_string()];
        let stacked = Buckets::stacked("r:ip:1", &rest, &[0, 1, 0]);
        assert!(!stacked.is_one());
        assert_eq!(stacked.of(1), "r:global");
        let groups = stacked.groups(3);
        assert_eq!(groups, vec![("r:ip:1", vec![0, 2]), ("r:global", vec![1])]);
        // Reserved in key order, the route's own first, whatever order the limits come in.
        let later = Buckets::stacked("r:ip:1", &rest, &[1, 0]);
        assert_eq!(
            later.groups(2),
            vec![("r:ip:1", vec![1]), ("r:global", vec![0])]
        );
        assert_eq!(time_of(&[7], 2), 7);
        assert_eq!(time_of(&[7, 8, 9], 1), 8);
    }
}
