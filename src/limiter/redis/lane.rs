//! One lane's state (see `batch.rs`): whether its sender runs, how many calls it has in
//! flight, what waits for the next one, when the lane last got an answer, and which buckets
//! its calls found full, and the bounds of all of these. Pure: the sender (`batch.rs`) asks it
//! what to do next; it imports nothing of the sender.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use crate::limiter::{Limit, StoreError, Verdict};

/// Most decisions in one call. A batch this size runs in Redis for a few hundred µs.
pub(super) const MAX_BATCH: usize = 64;

/// Most decisions waiting on one lane: 64 batches, a few tens of ms of Redis time.
pub(super) const MAX_PENDING: usize = 64 * MAX_BATCH;

/// Most calls in flight per lane. One call in flight made a decision that arrived meanwhile
/// wait for it and then for its own call (1.5 to 2 round trips with Redis 1 ms away); with a
/// few, an arrival almost always finds room and leaves at once. Under a flood a full window
/// still batches (each call then carries what queued while the window was full), and a few
/// calls of at most [`MAX_BATCH`] keep Redis's queue for one lane to about a ms. 4 suffices
/// at 256 concurrent callers (`tests/redis_rtt.rs`: added p50 about one round trip at 1 and 5
/// ms).
pub(super) const WINDOW: usize = 4;

/// A remembered denial is trusted for at most this long (it is dropped sooner when the lane
/// goes idle): a `FLUSHALL` or failover on a kept connection may have freed the bucket.
const MAX_DENIAL_AGE: Duration = Duration::from_secs(1);

/// Most denials a lane remembers; past it new ones are simply not remembered (correct, only
/// slower), so rotating keys cannot grow memory.
const MAX_DENIALS: usize = MAX_PENDING;

/// Where a verdict goes.
pub(super) type Answer = oneshot::Sender<Result<Verdict, StoreError>>;

/// Every lane of a store.
pub(super) struct Lanes(Box<[Slot]>);

/// One lane and the bell its sender listens to.
#[derive(Default)]
struct Slot {
    lane: Mutex<Lane>,
    /// Rung when a decision queues while the window has room ([`Arrival::Send`]): the sender
    /// sends it now instead of when a call returns. A ring while the sender is busy is kept
    /// (one permit), so none is lost.
    wake: Notify,
}

impl Lanes {
    /// `count` idle lanes.
    pub(super) fn new(count: usize) -> Lanes {
        Lanes((0..count).map(|_| Slot::default()).collect())
    }

    /// Lane `i`, locked.
    pub(super) fn get(&self, i: usize) -> MutexGuard<'_, Lane> {
        // The lock guards plain data: a panic while holding it leaves it usable.
        self.0[i].lane.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lane `i`'s bell (see [`Arrival::Send`]).
    pub(super) fn bell(&self, i: usize) -> &Notify {
        &self.0[i].wake
    }
}

/// One queued decision and where its verdict goes.
pub(super) struct Pending {
    pub(super) bucket: Box<str>,
    pub(super) limits: Box<[Limit]>,
    pub(super) verdict: Answer,
}

/// What a decision arriving at a lane does next.
pub(super) enum Arrival {
    /// The lane knows the bucket is full: this is the verdict.
    Known(Verdict),
    /// Queued on an idle lane: the caller starts the lane's sender.
    Start,
    /// Queued while the sender runs and the window has room: the caller rings the lane's
    /// bell, so the sender sends it now.
    Send,
    /// Queued while [`WINDOW`] calls are in flight: it goes in the next call, when one
    /// returns. The verdict comes through the channel.
    Queued,
    /// The queue is full: answer at once.
    Overloaded,
}

/// A bucket a call of this lane found full.
struct Denial {
    limits: Box<[Limit]>,
    verdict: Verdict,
    /// When the call that found it was sent (the proof's time base, see `deny_cache.rs`).
    sent: Instant,
    /// Until then no request for the bucket can be admitted.
    until: Instant,
    /// The store's generation before that call.
    generation: u64,
}

/// What the sender does next (see [`Lane::next_batch`]).
pub(super) enum Next {
    /// Send this batch now (it counts as in flight until [`Lane::returned`]).
    Send(Vec<Pending>),
    /// Nothing to send now: wait for a call to return or the bell to ring.
    Wait,
    /// Nothing queued and nothing in flight: the lane is idle again and the sender ends.
    Idle,
}

/// See the module documentation.
#[derive(Default)]
pub(super) struct Lane {
    /// The lane's sender runs.
    sending: bool,
    /// Calls sent and not yet returned, at most [`WINDOW`].
    in_flight: usize,
    pending: Vec<Pending>,
    last_answer: Option<Instant>,
    denied: HashMap<Box<str>, Denial>,
}

impl Lane {
    /// A decision for `bucket` arrives at `now`; `verdict` is where its answer goes if queued.
    pub(super) fn arrive(
        &mut self,
        bucket: &str,
        limits: &[Limit],
        verdict: Answer,
        generation: u64,
        now: Instant,
    ) -> Arrival {
        if let Some(known) = self.known(bucket, limits, generation, now) {
            return Arrival::Known(known);
        }
        if self.pending.len() >= MAX_PENDING {
            return Arrival::Overloaded;
        }
        self.pending.push(Pending {
            bucket: bucket.into(),
            limits: limits.into(),
            verdict,
        });
        if !self.sending {
            self.sending = true;
            Arrival::Start
        } else if self.in_flight < WINDOW {
            Arrival::Send
        } else {
            Arrival::Queued
        }
    }

    /// A call of this lane was answered at `now`.
    pub(super) fn answered(&mut self, now: Instant) {
        self.last_answer = Some(now);
    }

    /// When a call of this lane was last answered.
    pub(super) fn last_answer(&self) -> Option<Instant> {
        self.last_answer
    }

    /// True while the lane's sender runs.
    #[cfg(test)]
    pub(super) fn is_sending(&self) -> bool {
        self.sending
    }

    /// Calls in flight.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// `verdict` came back for `bucket` from a call sent at `sent` under `generation`: a
    /// denial is remembered (see [`Lane::answer_known`]).
    pub(super) fn learn(
        &mut self,
        bucket: &str,
        limits: &[Limit],
        verdict: &Verdict,
        sent: Instant,
        generation: u64,
    ) {
        let Some(wait) = verdict.retry_after() else {
            return;
        };
        if self.denied.len() >= MAX_DENIALS {
            let now = Instant::now();
            self.denied.retain(|_, d| d.until > now);
        }
        if self.denied.len() >= MAX_DENIALS && !self.denied.contains_key(bucket) {
            return;
        }
        let denial = Denial {
            limits: limits.into(),
            verdict: verdict.clone(),
            sent,
            until: sent + wait.min(MAX_DENIAL_AGE),
            generation,
        };
        self.denied.insert(bucket.into(), denial);
    }

    /// Answer at once every queued decision whose bucket is known to be full.
    pub(super) fn answer_known(&mut self, generation: u64) {
        if self.denied.is_empty() {
            return;
        }
        let now = Instant::now();
        let known = &self.denied;
        self.pending.retain_mut(|p| {
            let Some(d) = known.get(&p.bucket) else {
                return true;
            };
            if *d.limits != *p.limits || d.generation != generation || now >= d.until {
                return true;
            }
            // Swap in a dead sender: the real one is consumed by answering.
            let (dead, _) = oneshot::channel();
            let answer = std::mem::replace(&mut p.verdict, dead);
            let _ = answer.send(Ok(d.verdict.aged(now - d.sent)));
            false
        });
    }

    /// The remembered denial for `bucket`, aged to `now`, if it is still certain.
    fn known(
        &self,
        bucket: &str,
        limits: &[Limit],
        generation: u64,
        now: Instant,
    ) -> Option<Verdict> {
        let d = self.denied.get(bucket)?;
        let certain = *d.limits == *limits && d.generation == generation && now < d.until;
        certain.then(|| d.verdict.aged(now - d.sent))
    }

    /// Forget what the lane knows of `bucket` (an operator reset it).
    pub(super) fn forget(&mut self, bucket: &str) {
        self.denied.remove(bucket);
    }

    /// What the sender does next: send the oldest `max` queued decisions while fewer than
    /// [`WINDOW`] calls are in flight; wait while calls are in flight; else the lane is idle
    /// again and the next request starts a sender.
    pub(super) fn next_batch(&mut self, max: usize) -> Next {
        if self.in_flight >= WINDOW {
            return Next::Wait;
        }
        if self.pending.is_empty() {
            if self.in_flight > 0 {
                return Next::Wait;
            }
            self.release();
            return Next::Idle;
        }
        self.in_flight += 1;
        let n = self.pending.len().min(max);
        Next::Send(self.pending.drain(..n).collect())
    }

    /// A call the sender started (a [`Next::Send`]) has returned, answered or failed.
    pub(super) fn returned(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Idle again, whatever waited: the waiters are returned to be dropped (they see their
    /// batch dropped). The sender's calls in flight are dropped with it.
    pub(super) fn release(&mut self) -> Vec<Pending> {
        self.sending = false;
        self.in_flight = 0;
        self.denied.clear();
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests;
