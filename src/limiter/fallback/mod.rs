//! The local fallback layer (`on_error = "local"`): the shared store decides; when it cannot,
//! this proxy's own log does, for the same limits less what the shared store had already
//! admitted as far as this proxy learned ([`learned`]), so the local log does not start empty
//! mid-window. After a local admission, until it has left every window, the shared store is
//! asked with each limit reduced by what the local log holds: one proxy never admits more than
//! the limit in a window however its calls fared (lost, late, or answered again).
//!
//! The proxy's own overload ([`StoreError::Overloaded`]) is shed, never given to the local
//! log. Without a local log, or on a route whose `on_error` is not `"local"`, this layer is the
//! shared store alone, and learns nothing.

mod bucket;
pub mod learned;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use bucket::LearnedBucket;
use learned::Learned;

use super::layer::{Ask, Decide, Decided, DecidedBy, Observe};
use super::{Buckets, Limit, LimitState, Store, StoreError, Verdict};

/// The shared store, with this proxy's own log in front of its failures.
pub struct Fallback<O = ()> {
    shared: Arc<dyn Store>,
    /// This proxy's own log for `on_error = "local"` (present with a shared store).
    local: Option<Arc<dyn Store>>,
    /// What the shared store last said of each bucket, where the local log may be needed.
    learned: Learned,
    observe: O,
}

impl<O: Observe> Fallback<O> {
    /// Decide with `shared` (which owns the decision deadline: no second timer runs here),
    /// telling `observe` how it answered.
    pub fn new(shared: Arc<dyn Store>, observe: O) -> Fallback<O> {
        Fallback {
            shared,
            local: None,
            learned: Learned::default(),
            observe,
        }
    }

    /// Remember at most about `buckets` buckets of what the shared store said
    /// (`store.fallback_buckets`; [`learned::MAX_LEARNED`] unless set).
    pub fn set_learned_capacity(&mut self, buckets: usize) {
        self.learned = Learned::with_capacity(buckets);
    }

    /// Decide with `local` while the shared store cannot, on routes with `on_error = "local"`.
    pub fn set_local(&mut self, local: Option<Arc<dyn Store>>) {
        self.local = local;
    }

    /// The shared store.
    pub fn shared(&self) -> &Arc<dyn Store> {
        &self.shared
    }

    /// The store that recorded what `by` decided: an admission is given back, settled or
    /// renewed there. `None` for the local log when there is none.
    pub fn store_of(&self, by: DecidedBy) -> Option<&Arc<dyn Store>> {
        match by {
            DecidedBy::Store => Some(&self.shared),
            DecidedBy::Local => self.local.as_ref(),
        }
    }

    /// What was learned of each bucket (for tests).
    #[cfg(test)]
    pub(crate) fn learned(&self) -> &Learned {
        &self.learned
    }
}

impl<O: Observe> Decide for Fallback<O> {
    /// The verdict for `ask`, and who gave it. What the shared store says is learned per
    /// bucket: a limit with a key of its own (a `global` one) under that key, as the last
    /// client to ask saw it, so every client meets it in an outage.
    async fn decide(&self, ask: Ask<'_>) -> Decided {
        let Ask {
            route,
            buckets,
            limits,
            local,
        } = ask;
        let started = Instant::now();
        let fallback = self.local.as_ref().filter(|_| local);
        // After this proxy admitted from its own log, the store decides in what that log left.
        let reduced = match fallback {
            Some(local) if self.learned.is_local_any(buckets, limits.len(), started) => {
                Some(local_reduced(local, buckets, limits).await)
            }
            _ => None,
        };
        if let Some((r, frees)) = reduced
            .as_ref()
            .filter(|(r, _)| r.iter().any(|l| l.requests == 0))
        {
            // The local log holds a whole limit: its denial, the store not asked.
            return Decided {
                result: Ok(no_room(r, frees)),
                by: DecidedBy::Local,
            };
        }
        let asked = reduced.as_ref().map_or(limits, |(r, _)| r.as_slice());
        let result = self.shared.check(route, buckets, asked).await;
        let answered = Instant::now();
        self.observe.answered(answered - started);
        let store = |result| Decided {
            result,
            by: DecidedBy::Store,
        };
        let e = match &result {
            Ok(verdict) => {
                if fallback.is_some() {
                    (self.learned).learn_each(buckets, (asked, verdict), started, answered);
                }
                return store(result);
            }
            // The proxy's own overload: shed, never `on_error` (see `StoreError::Overloaded`).
            Err(StoreError::Overloaded(_)) => return store(result),
            Err(e) => e,
        };
        self.observe.failed(e);
        // Per request at debug level only: an outage would otherwise write a log line per
        // request; the route's state log and the metrics say it.
        log::debug!("route {route}: limiter error: {e}");
        let Some(local) = fallback else {
            return store(result);
        };
        // The shared store cannot decide: this proxy's own log does, for the same limits less
        // what the store had already admitted as far as this proxy learned.
        let verdict = match self.learned.held(buckets, limits, Instant::now()) {
            Some(held) => local_after(local, route, buckets, limits, &held).await,
            None => local.check(route, buckets, limits).await,
        };
        if verdict.as_ref().is_ok_and(|v| v.admitted) {
            let longest = limits.iter().map(|l| l.window).max().unwrap_or_default();
            let until = answered + longest;
            self.learned.mark_local_each(buckets, limits.len(), until);
        }
        Decided {
            result: verdict,
            by: DecidedBy::Local,
        }
    }
}

/// `limits` each reduced by what this proxy's own log holds of it (in its bucket of
/// `buckets`): the room the store may still give this proxy after it admitted locally; with,
/// per limit, when the local log next frees room.
async fn local_reduced(
    local: &Arc<dyn Store>,
    buckets: &Buckets<'_>,
    limits: &[Limit],
) -> (Vec<Limit>, Vec<Duration>) {
    let mut reduced = limits.to_vec();
    let mut frees: Vec<Duration> = limits.iter().map(|l| l.window).collect();
    for (bucket, members) in buckets.groups(limits.len()) {
        let sub: Vec<Limit> = members.iter().map(|&i| limits[i]).collect();
        // Unreadable: as if the local log held everything (deny rather than over-admit).
        let held: Vec<(u64, Duration)> = match local.inspect(bucket, &sub).await {
            Ok(view) => view.limits.iter().map(|v| (v.count, v.reset)).collect(),
            Err(_) => sub
                .iter()
                .map(|l| (u64::from(l.requests), l.window))
                .collect(),
        };
        for (&i, (count, reset)) in members.iter().zip(held) {
            reduced[i].requests -= count.min(u64::from(limits[i].requests)) as u32;
            frees[i] = reset;
        }
    }
    (reduced, frees)
}

/// A denial of `limits` (reduced), some with no room left, which free at `frees`; recording
/// nothing.
fn no_room(limits: &[Limit], frees: &[Duration]) -> Verdict {
    let states = (limits.iter().zip(frees))
        .map(|(l, &frees)| LimitState {
            remaining: l.requests,
            reset: match l.requests {
                0 => frees.max(Duration::from_millis(1)),
                _ => l.window,
            },
        })
        .collect();
    Verdict {
        admitted: false,
        states,
        recorded_at: None,
        recorded_each: Vec::new(),
    }
}

/// The local log's verdict for `buckets` with each limit reduced by what was learned of its
/// bucket (`held`: per limit, the entries still held and when the next frees): the local log
/// admits only into the room the shared store had left.
async fn local_after(
    local: &Arc<dyn Store>,
    route: &str,
    buckets: &Buckets<'_>,
    limits: &[Limit],
    held: &[(u32, Duration)],
) -> Result<Verdict, StoreError> {
    let reduced: Vec<Limit> = (limits.iter().zip(held))
        .map(|(l, &(h, _))| Limit {
            requests: l.requests - h,
            ..*l
        })
        .collect();
    if reduced.iter().any(|l| l.requests == 0) {
        // No room left by what was learned: denied without recording anything.
        let frees: Vec<Duration> = held.iter().map(|&(_, frees)| frees).collect();
        return Ok(no_room(&reduced, &frees));
    }
    let mut verdict = local.check(route, buckets, &reduced).await?;
    for (i, state) in verdict.states.iter_mut().enumerate() {
        // A learned entry that frees first makes room first.
        if held[i].0 > 0 && state.remaining == 0 {
            state.reset = state.reset.min(held[i].1);
        }
    }
    Ok(verdict)
}
