//! One lane's state (see [`super::sender`]): whether its sender runs, how many calls it has in
//! flight, what waits for the next one, and which busy period it is in; and the one memory of
//! provable denials ([`KnownDenials`]) every lane answers arriving and queued decisions from.
//! Pure: the sender asks it what to do next, handing it the [`Bounds`]; it imports nothing of
//! the sender.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::sync::{oneshot, Notify};

use super::{Answer, Arrival, Bounds, Next, Pending};
use crate::limiter::{Limit, Verdict};

/// Every lane of a store, one per seat.
pub(crate) struct Lanes(Box<[Seat]>);

/// One lane and the bell its sender listens to.
struct Seat {
    lane: Mutex<Lane>,
    /// Rung when a decision queues while the window has room ([`Arrival::Send`]): the sender
    /// sends it now instead of when a call returns. A ring while the sender is busy is kept
    /// (one permit), so none is lost.
    wake: Notify,
    /// The sender's calls numbered below this ran out their deadline (see
    /// [`Lanes::expired`]). Written by the lane's sender only, read by its calls, which it
    /// polls itself.
    expired: AtomicU64,
}

impl Lanes {
    /// `count` idle lanes under `bounds`.
    pub(crate) fn new(count: usize, bounds: Bounds) -> Lanes {
        let seat = |_| Seat {
            lane: Mutex::new(Lane::new(bounds)),
            wake: Notify::new(),
            expired: AtomicU64::new(0),
        };
        Lanes((0..count).map(seat).collect())
    }

    /// Lane `i`, locked.
    pub(crate) fn get(&self, i: usize) -> MutexGuard<'_, Lane> {
        // The lock guards plain data: a panic while holding it leaves it usable.
        self.0[i].lane.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lane `i`'s bell (see [`Arrival::Send`]).
    pub(crate) fn bell(&self, i: usize) -> &Notify {
        &self.0[i].wake
    }

    /// Lane `i`'s calls are numbered by its sender, in the order sent; those numbered below
    /// this ran out their deadline, and fail when next polled. It only grows, so a sender
    /// numbers its calls from it on.
    pub(crate) fn expired(&self, i: usize) -> u64 {
        self.0[i].expired.load(Ordering::Relaxed)
    }

    /// Lane `i`'s calls numbered below `upto` ran out their deadline.
    pub(crate) fn expire(&self, i: usize, upto: u64) {
        self.0[i].expired.fetch_max(upto, Ordering::Relaxed);
    }
}

/// See the module documentation.
pub(crate) struct Lane {
    bounds: Bounds,
    /// The lane's sender runs.
    sending: bool,
    /// Calls sent and not yet returned, at most `bounds.window`.
    in_flight: usize,
    /// Nothing queued and nothing in flight since the sender last looked: the busy period
    /// ended (the sender may still run, see [`Lane::retire`]).
    idle: bool,
    pending: Vec<Pending>,
    /// Busy periods ended so far: a denial learned in an earlier one no longer answers here
    /// unless a deny cache keeps denials (see [`KnownDenials::outlives_lanes`]).
    epoch: u64,
}

impl Lane {
    /// An idle lane.
    pub(crate) fn new(bounds: Bounds) -> Lane {
        Lane {
            bounds,
            sending: false,
            in_flight: 0,
            idle: true,
            pending: Vec::new(),
            epoch: 0,
        }
    }

    /// The stamp a denial learned or read on this lane now carries, under `generation`.
    pub(crate) fn stamp(&self, known: &KnownDenials, generation: u64) -> Stamp {
        let epoch = if known.outlives_lanes() {
            0
        } else {
            self.epoch
        };
        Stamp { generation, epoch }
    }

    /// A decision for `bucket` arrives at `now`, under the store's `generation`; `verdict` is
    /// where its answer goes if queued. A denial `known` holds answers it at once.
    pub(crate) fn arrive(
        &mut self,
        (bucket, per_limit): (&str, Option<Box<[Box<str>]>>),
        limits: &[Limit],
        verdict: Answer,
        known: &KnownDenials,
        generation: u64,
        now: Instant,
    ) -> Arrival {
        let stamp = self.stamp(known, generation);
        let answered = per_limit
            .is_none()
            .then(|| known.verdict(bucket, limits, stamp, now));
        if let Some(known) = answered.flatten() {
            return Arrival::Known(known);
        }
        if self.pending.len() >= self.bounds.max_pending {
            return Arrival::Overloaded;
        }
        self.pending.push(Pending {
            bucket: bucket.into(),
            per_limit,
            limits: limits.into(),
            verdict,
        });
        if !self.sending {
            self.sending = true;
            Arrival::Start
        } else if self.in_flight < self.bounds.window {
            Arrival::Send
        } else {
            Arrival::Queued
        }
    }

    /// Take every queued decision (to fail them: a call ran out its deadline). Calls in flight
    /// and the sender carry on.
    pub(crate) fn take_queued(&mut self) -> Vec<Pending> {
        std::mem::take(&mut self.pending)
    }

    /// True while the lane's sender runs.
    #[cfg(test)]
    pub(crate) fn is_sending(&self) -> bool {
        self.sending
    }

    /// Calls in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Answer at once every queued decision whose bucket `known` proves full under `stamp`.
    pub(crate) fn answer_known(&mut self, known: &KnownDenials, stamp: Stamp) {
        let now = Instant::now();
        self.pending.retain_mut(|p| {
            if p.per_limit.is_some() {
                return true;
            }
            let Some(verdict) = known.verdict(&p.bucket, &p.limits, stamp, now) else {
                return true;
            };
            // Swap in a dead sender: the real one is consumed by answering.
            let (dead, _) = oneshot::channel();
            let answer = std::mem::replace(&mut p.verdict, dead);
            let _ = answer.send(Ok(verdict));
            false
        });
    }

    /// What the sender does next: send the oldest `max_batch` queued decisions while the window
    /// has room; wait while calls are in flight; else the lane is idle again: its busy period
    /// ends, and the sender waits for the bell (or ends, [`Lane::retire`]).
    pub(crate) fn next_batch(&mut self) -> Next {
        if self.in_flight >= self.bounds.window {
            return Next::Wait;
        }
        if self.pending.is_empty() {
            if self.in_flight > 0 {
                return Next::Wait;
            }
            if !self.idle {
                self.idle = true;
                self.epoch += 1;
            }
            return Next::Idle;
        }
        self.idle = false;
        self.in_flight += 1;
        let n = self.pending.len().min(self.bounds.max_batch);
        Next::Send(self.pending.drain(..n).collect())
    }

    /// A call the sender started (a [`Next::Send`]) has returned, answered or failed.
    pub(crate) fn returned(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The sender, idle for a while, ends if the lane is still idle (true): the next request
    /// starts a sender again. False when a decision queued meanwhile (the sender sends it).
    pub(crate) fn retire(&mut self) -> bool {
        let idle = self.pending.is_empty() && self.in_flight == 0;
        if idle {
            drop(self.release());
        }
        idle
    }

    /// True when nothing is queued or in flight and the busy period has ended.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.idle && self.pending.is_empty() && self.in_flight == 0
    }

    /// Idle again, whatever waited: the waiters are returned to be dropped (they see their
    /// batch dropped). The sender's calls in flight are dropped with it. The busy period ends:
    /// without a deny cache its denials answer no more.
    pub(crate) fn release(&mut self) -> Vec<Pending> {
        self.sending = false;
        self.in_flight = 0;
        self.idle = true;
        self.epoch += 1;
        std::mem::take(&mut self.pending)
    }
}

// ---------------------------------------------------------------------------------------------
// The memory of denials.

/// Upper bound on remembered buckets; past it new denials are simply not remembered (correct,
/// only slower), so a flood of distinct clients cannot grow memory without bound.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// Which state of the store, and which busy period of a lane, a denial was learned in: it only
/// answers decisions made under the same stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The store's [`Store::generation`](crate::limiter::Store::generation) before the call that found the denial.
    pub generation: u64,
    /// The learning lane's busy period while no deny cache reads the memory; else 0.
    pub epoch: u64,
}

/// A bucket found full.
struct Denial {
    /// Before this instant no request for the bucket can be admitted.
    until: Instant,
    /// When the call that found it was sent (the proof's time base), to age the verdict.
    sent: Instant,
    stamp: Stamp,
    /// The limits it was decided under: a request that started before a reload can finish
    /// after the memory was cleared, and its old-limit denial must not bind the new limits.
    limits: Box<[Limit]>,
    verdict: Verdict,
}

/// The one memory of provable denials, which answers decisions locally while a bucket is
/// known to be full, so a flood that is already being denied costs no round trips.
///
/// Why a denial is exact: when a decision says a bucket is denied, each full limit stays full
/// until its oldest entry leaves the window (`reset`). Denied requests are never recorded and no
/// proxy can admit into a full log, so nothing can make room earlier, and admission needs every
/// limit to have room: no request for this bucket can be admitted before the largest `reset` of
/// the full limits, i.e. [`Verdict::retry_after`].
///
/// The instant is computed as a duration from the store's reply (Redis's clock), added to the
/// moment the call was *sent* on this proxy's monotonic clock. The store decided after that
/// moment, so the remembered deadline is never later than the true one: the memory never denies
/// a request the store would have admitted, and proxy clocks never matter.
///
/// All of this assumes the store kept its state. A denial is therefore tied to the store's
/// [`Store::generation`](crate::limiter::Store::generation), which changes when a shared
/// store's connection is lost or rebuilt (Redis may have restarted empty); entries of an older
/// generation are ignored. And since a `FLUSHALL`, an eviction or a failover on a kept
/// connection is not seen, a denial is trusted for at most the memory's `max_age`.
///
/// The coalescing store learns every denial its calls bring back. With the local deny cache
/// on (`local_deny_cache`, [`KnownDenials::serve_cache`]) a denial answers until its deadline
/// or `deny_cache_max_age`; without it a lane trusts a denial only while the lane that learned
/// it stays busy (its [`Stamp::epoch`]), so `local_deny_cache = false` still asks the store for
/// every request that finds its lane idle.
pub struct KnownDenials {
    denied: DashMap<Box<str>, Denial>,
    /// A denial is trusted for at most this long, in µs, whatever its deadline.
    max_age_us: AtomicU64,
    /// A deny cache reads this memory: denials outlive the busy period of their lane.
    cached: AtomicBool,
}

impl KnownDenials {
    /// An empty memory trusting a denial for at most `max_age`.
    pub fn new(max_age: Duration) -> KnownDenials {
        KnownDenials {
            denied: DashMap::new(),
            max_age_us: AtomicU64::new(micros(max_age)),
            cached: AtomicBool::new(false),
        }
    }

    /// A deny cache reads this memory from now on, trusting a denial for `max_age`.
    pub(crate) fn serve_cache(&self, max_age: Duration) {
        self.max_age_us.store(micros(max_age), Ordering::Relaxed);
        self.cached.store(true, Ordering::Relaxed);
    }

    /// True when a deny cache reads this memory: lanes then stamp their denials with epoch 0,
    /// the cache's, instead of their busy period.
    pub(crate) fn outlives_lanes(&self) -> bool {
        self.cached.load(Ordering::Relaxed)
    }

    /// The remembered denial of `bucket` under `limits` and `stamp`, aged to `now`, if it is
    /// still certain.
    pub fn verdict(
        &self,
        bucket: &str,
        limits: &[Limit],
        stamp: Stamp,
        now: Instant,
    ) -> Option<Verdict> {
        let d = self.denied.get(bucket)?;
        let certain = now < d.until && d.stamp == stamp && *d.limits == *limits;
        certain.then(|| d.verdict.aged(now - d.sent))
    }

    /// `verdict` came back for `bucket` from a call sent at `sent` under `stamp`: a denial is
    /// remembered, an admission teaches nothing.
    pub fn learn(
        &self,
        bucket: &str,
        limits: &[Limit],
        verdict: &Verdict,
        sent: Instant,
        stamp: Stamp,
    ) {
        let Some(wait) = verdict.retry_after() else {
            return;
        };
        // A lease is given back whenever its request ends, on any proxy: a full concurrency
        // limit proves nothing about the next moment.
        if limits.iter().any(Limit::is_lease) {
            return;
        }
        if self.denied.len() >= MAX_ENTRIES && !self.denied.contains_key(bucket) {
            return;
        }
        let max_age = Duration::from_micros(self.max_age_us.load(Ordering::Relaxed));
        let denial = Denial {
            // Never later than the proof allows, never longer than max_age.
            until: sent + wait.min(max_age),
            sent,
            stamp,
            limits: limits.into(),
            verdict: verdict.clone(),
        };
        self.denied.insert(bucket.into(), denial);
    }

    /// Forget `bucket` (an operator reset it, or an admission was refunded).
    pub fn forget(&self, bucket: &str) {
        self.denied.remove(bucket);
    }

    /// Forget everything (new limits may admit what the old ones denied).
    pub fn clear(&self) {
        self.denied.clear();
    }

    /// Drop what can no longer answer: past its deadline, or of another generation.
    pub fn sweep(&self, now: Instant, generation: u64) {
        self.denied
            .retain(|_, d| d.until > now && d.stamp.generation == generation);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod known_tests;
