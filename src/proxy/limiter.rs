//! The limiter side of the proxy: ask the route's store, time and count the answer, fall
//! back to this proxy's own log when the shared store cannot decide (`on_error = "local"`), and
//! let a denial wait for room when the route smooths bursts (`max_delay`, see [`super::delay`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::proxy::Session;
use prometheus::Histogram;

use super::delay::{self, Queues};
use super::outcome::{Checked, DecidedBy, Policy};
use crate::config::OnError;
use crate::limiter::learned::Learned;
use crate::limiter::{Buckets, Limit, LimitState, Store, StoreError, Verdict};
use crate::metrics::{StoreErrorMetrics, METRICS};
use crate::routes::Route;

/// The stores a request's decision may come from, and their metric handles.
pub(super) struct Limiter {
    pub(super) store: Arc<dyn Store>,
    /// This proxy's own log for `on_error = "local"` (present with a shared store).
    pub(super) local: Option<Arc<dyn Store>>,
    duration: Histogram,
    errors: StoreErrorMetrics,
    /// Requests waiting for room, per bucket (`max_queue`).
    queues: Queues,
    /// What the shared store last said of each bucket, where the local log may be needed:
    /// the local log starts from it (see [`crate::limiter::learned`]).
    learned: Learned,
}

impl Limiter {
    /// Decide with `store`, which owns the decision deadline (see [`Store`]): no second timer
    /// runs here.
    pub(super) fn new(store: Arc<dyn Store>) -> Limiter {
        let duration = METRICS
            .limiter_duration
            .with_label_values(&[store.backend()]);
        Limiter {
            store,
            local: None,
            duration,
            errors: StoreErrorMetrics::default(),
            queues: Queues::default(),
            learned: Learned::default(),
        }
    }

    /// The store decisions go to (for tests that build a second proxy on the same one).
    #[cfg(test)]
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// What the limits say of a request counted in `buckets` on `route`. A denial whose slot
    /// frees within the route's `max_delay` waits for it, with a place in the queue of the
    /// client's own bucket (the route's key, also when a limit of its own denied) and
    /// one of the process's `max_delayed` (none left: answered at once), and is decided again
    /// until admitted or out of budget (see [`delay::wait_for`]); a client that leaves
    /// meanwhile ends it with [`Checked::ClientGone`].
    pub(super) async fn check(
        &self,
        session: &mut Session,
        buckets: &Buckets<'_>,
        route: &Route,
        max_delayed: u32,
        cost: u32,
    ) -> Checked {
        let policy = Policy::of(route);
        let bucket = buckets.first();
        let weighted = weighted(route, cost);
        let limits = weighted.as_deref().unwrap_or(&route.spec.limits);
        let (mut result, mut by) = self.decide(buckets, route, limits, policy).await;
        let first = delay::wait_for(policy, &result, Duration::ZERO, 1);
        let (Some(mut wait), Some(smoothing)) = (first, policy.smoothing) else {
            return Checked::Decided {
                policy,
                result,
                by,
                delayed: false,
            };
        };
        let Some(_place) = self.queues.join(bucket, smoothing.max_queue, max_delayed) else {
            return Checked::Decided {
                policy,
                result,
                by,
                delayed: false,
            };
        };
        let started = Instant::now();
        let mut decisions = 1;
        loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                gone = delay::client_gone(session) => {
                    log::debug!("route {}: {bucket}: {gone}", route.spec.name);
                    route.metrics.delay.observe(started.elapsed().as_secs_f64());
                    return Checked::ClientGone;
                }
            }
            // The store measures `reset` from when it decides, which is after this instant and
            // before its answer arrives: timed from here, how long an answer took on its way
            // back never counts against the budget (see `delay::wait_for`).
            let asked = started.elapsed();
            (result, by) = self.decide(buckets, route, limits, policy).await;
            decisions += 1;
            match delay::wait_for(policy, &result, asked, decisions) {
                Some(next) => wait = next,
                None => break,
            }
        }
        route.metrics.delay.observe(started.elapsed().as_secs_f64());
        Checked::Decided {
            policy,
            result,
            by,
            delayed: true,
        }
    }

    /// The verdict for `buckets` on `route`, and who gave it. What the shared store says is
    /// learned per bucket: a limit with a key of its own (a `global` one) under that key, as
    /// the last client to ask saw it, so every client meets it in an outage.
    async fn decide(
        &self,
        buckets: &Buckets<'_>,
        route: &Route,
        limits: &[Limit],
        policy: Policy,
    ) -> (Result<Verdict, StoreError>, DecidedBy) {
        let name = &route.spec.name;
        let started = Instant::now();
        let fallback = self
            .local
            .as_ref()
            .filter(|_| policy.on_error == OnError::Local);
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
            return (Ok(no_room(r, frees)), DecidedBy::Local);
        }
        let asked = reduced.as_ref().map_or(limits, |(r, _)| r.as_slice());
        let result = self.store.check(name, buckets, asked).await;
        let answered = Instant::now();
        self.duration.observe((answered - started).as_secs_f64());
        let Err(e) = &result else {
            if let (Some(_), Ok(verdict)) = (fallback, &result) {
                self.learned
                    .learn_each(buckets, (asked, verdict), started, answered);
            }
            return (result, DecidedBy::Store);
        };
        if let StoreError::Overloaded(_) = e {
            // The proxy's own overload: shed, never `on_error` (see `StoreError::Overloaded`).
            return (result, DecidedBy::Store);
        }
        self.errors.count(e);
        // Per request at debug level only: an outage would otherwise write a log line per
        // request; the route's state log and the metrics say it.
        log::debug!("route {name}: limiter error: {e}");
        match fallback {
            // The shared store cannot decide: this proxy's own log does, for the same limits
            // less what the store had already admitted as far as this proxy learned.
            Some(local) => {
                let room = self.learned.room(buckets, limits, Instant::now());
                let verdict = match room {
                    Some(room) => local_after(local, name, buckets, limits, &room).await,
                    None => local.check(name, buckets, limits).await,
                };
                if verdict.as_ref().is_ok_and(|v| v.admitted) {
                    let longest = limits.iter().map(|l| l.window).max().unwrap_or_default();
                    let until = answered + longest;
                    self.learned.mark_local_each(buckets, limits.len(), until);
                }
                (verdict, DecidedBy::Local)
            }
            None => (result, DecidedBy::Store),
        }
    }
}

/// The route's limits as a request of `cost` counts in them (its cost limits weigh `cost`);
/// `None` for a route without cost limits, whose limits are used as configured.
pub(super) fn weighted(route: &Route, cost: u32) -> Option<Vec<Limit>> {
    (route.spec.cost.is_weighted())
        .then(|| route.spec.limits.iter().map(|l| l.weighted(cost)).collect())
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
/// bucket (`room`: per limit, the entries still held and when the next frees): the local log
/// admits only into the room the shared store had left.
async fn local_after(
    local: &Arc<dyn Store>,
    route: &str,
    buckets: &Buckets<'_>,
    limits: &[Limit],
    room: &[(u32, Duration)],
) -> Result<Verdict, StoreError> {
    let held: Vec<u32> = room.iter().map(|&(held, _)| held).collect();
    let reduced: Vec<Limit> = (limits.iter().zip(&held))
        .map(|(l, h)| Limit {
            requests: l.requests - h,
            ..*l
        })
        .collect();
    if reduced.iter().any(|l| l.requests == 0) {
        // No room left by what was learned: denied without recording anything.
        let states = (reduced.iter().enumerate())
            .map(|(i, l)| LimitState {
                remaining: l.requests,
                reset: match l.requests {
                    0 => room[i].1.max(Duration::from_millis(1)),
                    _ => l.window,
                },
            })
            .collect();
        return Ok(Verdict {
            admitted: false,
            states,
            recorded_at: None,
            recorded_each: Vec::new(),
        });
    }
    let mut verdict = local.check(route, buckets, &reduced).await?;
    for (i, state) in verdict.states.iter_mut().enumerate() {
        // A learned entry that frees first makes room first.
        if held[i] > 0 && state.remaining == 0 {
            state.reset = state.reset.min(room[i].1);
        }
    }
    Ok(verdict)
}
