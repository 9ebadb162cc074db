//! The sender: decisions pending for one lane go out as few calls, with a small window of
//! calls in flight.
//!
//! Most of a one-limit decision's cost in a store like Redis is the call itself, and most of
//! its cost in the proxy is the client library's per-command machinery (channel hops, framing,
//! reply parsing). A batch pays both once. The [`Backend`] decides a batch in order, atomically
//! (Redis: one run of the deciding script, assembled from `lua/sliding_window/skeleton.lua`), so a batch decides exactly what the same
//! decisions sent one by one would.
//!
//! A **lane** is what one call may carry: one Redis has one lane; a Cluster has one per hash
//! slot (all keys of a call must share a slot), see [`Backend::lane_of`]. Each lane has one
//! **sender**, a task the backend spawns ([`Backend::spawn`]: Redis's own I/O thread), that
//! keeps up to [`WINDOW`] calls in flight (the state machine is in `lane.rs`):
//! - lane idle: the request queues its decision and starts the sender, which sends it at once;
//! - nothing in flight: the request queues its decision and rings the sender's bell; the sender
//!   sends what queued, at once;
//! - fewer than [`WINDOW`] calls in flight: the request queues its decision; the first to do so
//!   rings the bell once its worker has run the other tasks it had ready ([`Arrival::Defer`]),
//!   and the sender sends everything that queued meanwhile as one call. Ringing at once woke
//!   the store's thread for each such request (a system call of several µs when it slept),
//!   often for a call of its own; deferred, a worker's pass over its ready requests costs one
//!   (docs/benchmarks.md: Redis calls per request 0.24 -> 0.18 at 64 connections);
//! - [`WINDOW`] calls in flight: the request queues its decision. When a call returns, the
//!   sender sends what queued meanwhile as one call.
//!
//! So a decision waits about one round trip however many run at once (a store one network hop
//! away is not left idle while a call travels), and the rate is not capped at one call per round
//! trip.
//!
//! **How long a decision waits.** The request sets no timer of its own: every call is bounded by
//! the backend's deadline (Redis: `store.timeout`), so a sent decision is answered or failed within
//! it, by the sender's one timer (`deadline.rs`: due at the oldest call's deadline, late timers
//! forgiven, and, with nothing in flight, when the idle sender ends). A queued decision waits for a
//! call to return, then rides in the next: while the store answers it waits on (the queue is
//! bounded, so its wait is too), and when a call runs out its deadline ([`StoreError::Timeout`])
//! the store is not answering, so every decision queued on that lane fails with it at once, instead
//! of being sent into the same silence. Each of those queued after the failed call was sent, so on
//! a frozen store no decision waits longer than one deadline. One timer per sender, none per call
//! or decision: a call that runs out is failed by the sender, which numbers its calls and marks
//! those sent too long ago ([`Lanes::expired`]); a call checks the mark whenever it is polled, and
//! the sender polls its calls itself.
//!
//! **The sender stays while its lane is busy.** When the queue empties and nothing is in
//! flight, the busy period ends but the sender waits for the bell for one deadline more before
//! it ends, so a lane kept busy by one client at a time keeps one sender instead of starting a
//! task per request.
//!
//! **Order.** Two calls in flight may carry decisions for the same bucket: the store must run
//! them in the order they queued. All of a lane's calls travel on one multiplexed connection,
//! where the order in which commands are handed to the connection is the order Redis runs them;
//! redis-rs hands a command over (a send into the connection's channel, which then writes in
//! order) on the first poll of its future. The sender is the only task that starts a lane's
//! calls, and it polls each call once as it takes the call's batch from the queue, before it
//! takes the next: so the write order is the queue order, explicitly, whatever order tokio would
//! first poll tasks in. (The sender runs outside tokio's cooperative budget, whose exhaustion
//! would make a first poll return before the command was handed over; a call that finds the
//! connection's channel full waits in its first-come-first-served queue, later calls behind it.)
//! What this cannot order: a call that redis-rs retries or that the store sends again
//! (`NOSCRIPT` after `SCRIPT FLUSH`, a Cluster `MOVED` or `TRYAGAIN`, a reconnect) runs after
//! the calls written meanwhile. Each call is still atomic, so no limit is exceeded; only the
//! order between those calls' decisions may differ.
//!
//! Under load a batch holds what arrived while the window was full, at most [`MAX_BATCH`]
//! decisions, so one script run stays short. At most [`MAX_PENDING`] wait per lane; beyond
//! that a decision is answered at once with [`StoreError::Overloaded`], so waiting stays
//! bounded: the proxy's own overload, shed with a `503` (counted as `overloaded`), never
//! decided by the route's `on_error` (see [`crate::limiter::fallback`]).
//!
//! **A known-full bucket costs nothing** (`known.rs`, [`KnownDenials`]): a denial that comes
//! back answers at once every queued decision for the same bucket and limits, and any that
//! arrive while the lane is busy (with the deny cache on, also after), for as long as the
//! denial is certain (it holds with several calls in flight, since a denial proves that no
//! decision anywhere can be admitted for the bucket before its `until`). A burst of thousands
//! for one bucket thus costs a few calls.

use std::future::Future;
use std::sync::{Arc, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::deadline::{Deadlines, Fired};
use super::known::KnownDenials;
use super::lane::{Lane, Lanes};
use super::{Arrival, Bounds, Call, Next, Pending};
use crate::limiter::{Buckets, Checked, Limit, StoreError};

/// Most decisions in one call. A batch this size runs in Redis for a few hundred µs.
pub(crate) const MAX_BATCH: usize = 64;

/// Most decisions waiting on one lane: 64 batches, a few tens of ms of Redis time.
pub(crate) const MAX_PENDING: usize = 64 * MAX_BATCH;

/// Most calls in flight per lane. One call in flight made a decision that arrived meanwhile
/// wait for it and then for its own call (1.5 to 2 round trips with Redis 1 ms away); with a
/// few, an arrival almost always finds room and leaves at once. Under a flood a full window
/// still batches (each call then carries what queued while the window was full), and a few
/// calls of at most [`MAX_BATCH`] keep Redis's queue for one lane to about a ms. 4 suffices
/// at 256 concurrent callers (`tests/it/redis_rtt.rs`: added p50 about one round trip at 1 and 5
/// ms).
pub(crate) const WINDOW: usize = 4;

/// The lanes' bounds, from the three above.
const BOUNDS: Bounds = Bounds {
    max_batch: MAX_BATCH,
    max_pending: MAX_PENDING,
    window: WINDOW,
};

/// Without a deny cache, a denial a lane learned is trusted for at most this long (it is
/// dropped sooner when the lane goes idle): a `FLUSHALL` or failover on a kept connection may
/// have freed the bucket. The deny cache sets its own age
/// (`local_deny_cache`, [`KnownDenials::serve_cache`]).
const MAX_DENIAL_AGE: Duration = Duration::from_secs(1);

/// What the coalescer sends through: a store that decides a batch of decisions in one call.
pub(crate) trait Backend: Send + Sync + 'static {
    /// This backend's coalescer (its lanes and memory of denials).
    fn coalescer(&self) -> &Coalescer;

    /// The lane of `bucket`, below the count [`Coalescer::new`] was given.
    fn lane_of(&self, bucket: &str) -> usize;

    /// See [`crate::limiter::Store::generation`].
    fn generation(&self) -> u64;

    /// Run a lane's sender, detached, where the backend's calls are best driven from.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static);

    /// How long a call may go unanswered before it fails with [`StoreError::Timeout`]
    /// (Redis: `store.timeout`).
    fn deadline(&self) -> Duration;

    /// A call ran out its deadline (`error`): the sender failed its decisions and what queued
    /// behind it. The backend learns of it (Redis: its gate counts the failure).
    fn timed_out(&self, error: &StoreError);

    /// Decide `batch` in one call, in order: one verdict per decision, or one error for all
    /// when the call failed (then the store was not answering).
    fn send(
        &self,
        batch: &[Pending],
    ) -> impl Future<Output = Result<Vec<Checked>, StoreError>> + Send;
}

/// Decisions waiting to be sent and calls in flight, per lane, and what calls found full.
pub(crate) struct Coalescer {
    lanes: Lanes,
    known: Arc<KnownDenials>,
}

impl Coalescer {
    /// `lanes` idle lanes.
    pub(crate) fn new(lanes: usize) -> Coalescer {
        Coalescer {
            lanes: Lanes::new(lanes, BOUNDS),
            known: Arc::new(KnownDenials::new(MAX_DENIAL_AGE)),
        }
    }

    /// The memory of denials, for a deny cache to read (see [`KnownDenials`]).
    pub(crate) fn known(&self) -> &Arc<KnownDenials> {
        &self.known
    }
}

/// Decide one request in its lane's next batch, or from a denial already known. The batch goes
/// out at once while the window has room (the request starts its lane's sender, or rings it),
/// else when a call in flight returns.
///
/// Every limit's bucket must be in the lane of `buckets.first()` (one call carries them).
pub(crate) async fn decide<B: Backend>(
    backend: &Arc<B>,
    buckets: &Buckets<'_>,
    limits: &[Limit],
) -> Checked {
    let coalescer = backend.coalescer();
    let bucket = buckets.first();
    let lane = backend.lane_of(bucket);
    let generation = backend.generation();
    let (tx, rx) = oneshot::channel();
    let per_limit = (!buckets.is_one()).then(|| buckets.per_limit(limits.len()));
    let arrival = coalescer.lanes.get(lane).arrive(
        (bucket, per_limit),
        limits,
        tx,
        &coalescer.known,
        generation,
        Instant::now(),
    );
    match arrival {
        Arrival::Known(verdict) => return Ok(verdict),
        Arrival::Overloaded => return Err(StoreError::Overloaded(MAX_PENDING)),
        Arrival::Queued => {}
        Arrival::Send => coalescer.lanes.bell(lane).notify_one(),
        Arrival::Defer => {
            // Ring once this worker has run what else it had ready: a ring wakes the store's
            // thread (a system call when it sleeps), and the decisions queued meanwhile, on any
            // worker, go with this one. Tokio runs a yielded task after the tasks already
            // queued, and at the latest at its next look at I/O (every 61 tasks), so under a
            // flood the wait stays short. Rung on drop, so a request dropped here (its client
            // gone) does not strand what queued behind its ring.
            let ring = DeferredRing { coalescer, lane };
            tokio::task::yield_now().await;
            drop(ring);
        }
        Arrival::Start => {
            // The guard exists before the task first runs: a task dropped unpolled releases
            // the lane too.
            let task = Draining {
                backend: backend.clone(),
                lane,
                finished: false,
            };
            // Unconstrained: tokio's cooperative budget could otherwise make a call's first
            // poll return before it handed its command over (see `drain`).
            backend.spawn(tokio::task::unconstrained(drain(task)));
        }
    }
    // No timer here: the calls are bounded (see the module documentation).
    rx.await
        .unwrap_or_else(|_| Err(StoreError::Unavailable("batch dropped".into())))
}

/// Send one batch (at `sent`) and deliver its verdicts; remember the denials they bring. `seq`
/// numbers the call among its lane's: once the sender marks it expired ([`Lanes::expired`]), it
/// fails with [`StoreError::Timeout`] the next time it is polled.
async fn send_batch<B: Backend>(
    backend: &B,
    lane: usize,
    mut batch: Vec<Pending>,
    (seq, sent): (u64, Instant),
) {
    // A waiter that gave up (deadline, client gone) is not decided: it was answered without
    // this decision, so recording it would charge a request twice.
    batch.retain(|p| !p.verdict.is_closed());
    if batch.is_empty() {
        return;
    }
    let generation = backend.generation();
    let lanes = &backend.coalescer().lanes;
    let answer = {
        let call = backend.send(&batch);
        tokio::pin!(call);
        std::future::poll_fn(|cx| {
            if lanes.expired(lane) > seq {
                let error = StoreError::Timeout(backend.deadline());
                backend.timed_out(&error);
                return Poll::Ready(Err(error));
            }
            call.as_mut().poll(cx)
        })
        .await
    };
    let verdicts = match answer {
        Ok(verdicts) => verdicts,
        Err(error) => {
            if matches!(error, StoreError::Timeout(_)) {
                // The store is not answering: what queued behind this call fails with it
                // (see "How long a decision waits" above).
                let queued = lanes.get(lane).take_queued();
                fail_all(queued, &error);
            }
            return fail_all(batch, &error);
        }
    };
    let Coalescer { lanes, known } = backend.coalescer();
    let mut lane = lanes.get(lane);
    // (The lock is held while verdicts are delivered: no await below.)
    let under = lane.learned_under(known, generation);
    let mut denied = false;
    for (p, verdict) in batch.into_iter().zip(verdicts) {
        if let (Ok(v), None) = (&verdict, &p.per_limit) {
            denied |= !v.admitted;
            known.learn(&p.bucket, &p.limits, v, sent, under);
        }
        // The waiter may have given up in the meantime; nothing to do then.
        let _ = p.verdict.send(verdict);
    }
    // Only a denial just learned can answer what waits: any older one answered its bucket's
    // waiters when it was learned, and later arrivals at once.
    if denied {
        lane.answer_known(known, under);
    }
}

/// A deferred ring ([`Arrival::Defer`]), rung when dropped unless a batch took what queued.
struct DeferredRing<'a> {
    coalescer: &'a Coalescer,
    lane: usize,
}

impl Drop for DeferredRing<'_> {
    fn drop(&mut self) {
        let due = self.coalescer.lanes.get(self.lane).ring_now();
        if due {
            self.coalescer.lanes.bell(self.lane).notify_one();
        }
    }
}

/// Give every decision of a batch the same error.
fn fail_all(batch: Vec<Pending>, error: &StoreError) {
    for p in batch {
        let _ = p.verdict.send(Err(error.clone()));
    }
}

/// A call in flight: its number among the lane's calls and when it was sent.
struct InFlight {
    call: Call,
    seq: u64,
    sent: Instant,
}

/// The lane's sender: keep up to [`WINDOW`] calls in flight while the lane is busy, fail those
/// that run out their deadline, and end once the lane has been idle for a deadline (see
/// `deadline.rs`); then the next request starts a sender again.
async fn drain<B: Backend>(mut task: Draining<B>) {
    let mut calls: Vec<InFlight> = Vec::with_capacity(WINDOW);
    let mut next_seq = task.lanes().expired(task.lane);
    let mut deadlines = Deadlines::new(task.backend.deadline(), Instant::now());
    let timer = tokio::time::sleep_until(deadlines.due(None).into());
    tokio::pin!(timer);
    loop {
        loop {
            // (A statement of its own: the lane's lock must end before the first poll.)
            let next = task.lane().next_batch();
            // Wait or idle: nothing to send until a call returns or the bell rings.
            let Next::Send(batch) = next else { break };
            let (backend, lane, seq) = (task.backend.clone(), task.lane, next_seq);
            next_seq += 1;
            let sent = Instant::now();
            deadlines.activity(sent);
            let mut call: Call =
                Box::pin(async move { send_batch(&*backend, lane, batch, (seq, sent)).await });
            // The first poll hands the command to the connection (see the module
            // documentation): now, before the next batch is taken. If the connection's channel
            // is full, the call waits in its (first come, first served) queue and later calls
            // wait behind it.
            if poll_once(&mut call).await.is_ready() {
                task.lane().returned();
            } else {
                calls.push(InFlight { call, seq, sent });
            }
        }
        let oldest = calls.first().map(|c| c.sent);
        let due = deadlines.due(oldest);
        // Moving a timer later is an atomic store in Tokio, not a trip through its wheel.
        if timer.deadline() != due.into() {
            timer.as_mut().reset(due.into());
        }
        tokio::select! {
            // Calls first: one marked expired must be polled (and removed) before the timer is
            // looked at again.
            biased;
            () = one_returns(&mut calls) => task.lane().returned(),
            () = task.bell().notified() => {}
            () = &mut timer => match deadlines.fired(Instant::now(), due, oldest) {
                Fired::Late => {}
                Fired::Expired(cutoff) => {
                    let live = calls.iter().find(|c| c.sent > cutoff).map_or(next_seq, |c| c.seq);
                    task.lanes().expire(task.lane, live);
                }
                Fired::Idle => {
                    if task.lane().retire() {
                        task.finished = true;
                        return;
                    }
                }
            },
        }
    }
}

/// Poll `call` once. The waker is the sender's own, so the call's next wake-up reaches the
/// sender, which polls it in [`one_returns`] from then on: no wake-up is lost.
async fn poll_once(call: &mut Call) -> Poll<()> {
    std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await
}

/// Wait until one of `calls` completes and remove it; pending forever when there are none.
/// A linear scan: there are at most [`WINDOW`] of them.
async fn one_returns(calls: &mut Vec<InFlight>) {
    std::future::poll_fn(|cx| {
        // In the order the calls started (`remove`, not `swap_remove`): a call that could not
        // hand its command over on its first poll (the connection's channel full) does so
        // before any later one.
        let done = calls
            .iter_mut()
            .position(|c| c.call.as_mut().poll(cx).is_ready());
        match done {
            Some(i) => {
                drop(calls.remove(i));
                Poll::Ready(())
            }
            None => Poll::Pending,
        }
    })
    .await
}

/// The sender's hold on its lane. If the sender ends any other way than by emptying the queue
/// (a panic, the runtime dropping it), `sending` would stay set and every later request would
/// queue behind a task that no longer exists: on drop it answers the waiters (their batch was
/// dropped; so were the calls in flight, with their waiters) and lets the next request start a
/// sender again.
struct Draining<B: Backend> {
    backend: Arc<B>,
    lane: usize,
    finished: bool,
}

impl<B: Backend> Draining<B> {
    /// Every lane of the backend.
    fn lanes(&self) -> &Lanes {
        &self.backend.coalescer().lanes
    }

    /// The sender's lane, locked.
    fn lane(&self) -> MutexGuard<'_, Lane> {
        self.lanes().get(self.lane)
    }

    /// The sender's bell.
    fn bell(&self) -> &Notify {
        self.backend.coalescer().lanes.bell(self.lane)
    }
}

impl<B: Backend> Drop for Draining<B> {
    fn drop(&mut self) {
        if !self.finished {
            let orphans = self.lane().release();
            drop(orphans);
        }
    }
}

#[cfg(test)]
mod tests;
