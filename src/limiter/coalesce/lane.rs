//! One lane's state (see [`super::sender`]): whether its sender runs, how many calls it has in
//! flight, what waits for the next one, and which busy period it is in. It answers arriving and
//! queued decisions from the memory of denials ([`KnownDenials`], `known.rs`). Pure: the sender
//! asks it what to do next, handing it the [`Bounds`]; it imports nothing of the sender.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{oneshot, Notify};

use super::known::{KnownDenials, LearnedUnder};
use super::{Answer, Arrival, Bounds, Next, Pending};
use crate::limiter::Limit;

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
    /// A decision that arrived with calls in flight will ring the bell (an [`Arrival::Defer`]):
    /// later arrivals ride on that ring. Cleared by the ring, or by a batch taking what queued.
    ring_deferred: bool,
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
            ring_deferred: false,
            epoch: 0,
        }
    }

    /// What a denial learned or read on this lane now is tied to: the store's `generation`
    /// and, unless a deny cache reads the memory, this lane's busy period.
    pub(crate) fn learned_under(&self, known: &KnownDenials, generation: u64) -> LearnedUnder {
        let epoch = if known.outlives_lanes() {
            0
        } else {
            self.epoch
        };
        LearnedUnder { generation, epoch }
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
        let under = self.learned_under(known, generation);
        let answered = per_limit
            .is_none()
            .then(|| known.verdict(bucket, limits, under, now));
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
        } else if self.in_flight >= self.bounds.window || self.ring_deferred {
            Arrival::Queued
        } else if self.in_flight == 0 {
            Arrival::Send
        } else {
            self.ring_deferred = true;
            Arrival::Defer
        }
    }

    /// The deferred ring is due: true if it still is (no batch took what queued meanwhile),
    /// and then it is no longer deferred.
    pub(crate) fn ring_now(&mut self) -> bool {
        std::mem::take(&mut self.ring_deferred)
    }

    /// Take every queued decision (to fail them: a call ran out its deadline). Calls in flight
    /// and the sender carry on.
    pub(crate) fn take_queued(&mut self) -> Vec<Pending> {
        self.ring_deferred = false;
        std::mem::take(&mut self.pending)
    }

    /// True while the lane's sender runs.
    #[cfg(test)]
    pub(crate) fn is_sending(&self) -> bool {
        self.sending
    }

    /// Decisions queued.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.pending.len()
    }

    /// Calls in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Answer at once every queued decision whose bucket `known` proves full under `under`.
    pub(crate) fn answer_known(&mut self, known: &KnownDenials, under: LearnedUnder) {
        let now = Instant::now();
        self.pending.retain_mut(|p| {
            if p.per_limit.is_some() {
                return true;
            }
            let Some(verdict) = known.verdict(&p.bucket, &p.limits, under, now) else {
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
        self.ring_deferred = false;
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
        self.ring_deferred = false;
        self.idle = true;
        self.epoch += 1;
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests;
