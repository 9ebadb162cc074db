//! Coalescing: decisions pending for one lane go out as few `EVALSHA` calls, with a small
//! window of calls in flight.
//!
//! Most of a one-limit decision's cost in Redis is the `EVALSHA` itself and its `TIME`, and
//! most of its cost in the proxy is the client library's per-command machinery (channel hops,
//! framing, reply parsing). A batch pays both once. The script takes any number of decisions
//! and runs them in order, atomically (see `lua/sliding_window.lua`), so a batch decides
//! exactly what the same decisions sent one by one would.
//!
//! A **lane** is what one call may carry: one Redis has one lane; a Cluster has one per hash
//! slot (all keys of a call must share a slot), see [`super::conn::Target::lane_of`]. Each
//! lane has one **sender**, a task on the store's I/O thread (`io.rs`), that keeps up to
//! [`WINDOW`] calls in flight (the state machine is in `lane.rs`):
//! - lane idle: the request queues its decision and starts the sender, which sends it at once;
//! - fewer than [`WINDOW`] calls in flight: the request queues its decision and rings the
//!   sender's bell; the sender sends what queued, at once;
//! - [`WINDOW`] calls in flight: the request queues its decision. When a call returns, the
//!   sender sends what queued meanwhile as one call.
//!
//! So a decision waits about one round trip however many run at once (a Redis one network
//! hop away is not left idle while a call travels), and the rate is not capped at one call
//! per round trip. Either way the request waits for its verdict (see `patience.rs` for how
//! long).
//!
//! **Order.** Two calls in flight may carry decisions for the same bucket: Redis must run them
//! in the order they queued. All of a lane's calls travel on one multiplexed connection, where
//! the order in which commands are handed to the connection is the order Redis runs them; redis-rs
//! hands a command over (a send into the connection's channel, which then writes in order) on
//! the first poll of its future. The sender is the only task that starts a lane's calls, and it
//! polls each call once as it takes the call's batch from the queue, before it takes the next:
//! so the write order is the queue order, explicitly, whatever order tokio would first poll
//! tasks in. (The sender runs outside tokio's cooperative budget, whose exhaustion would make
//! a first poll return before the command was handed over; a call that finds the connection's
//! channel full waits in its first-come-first-served queue, later calls behind it.) What this cannot order: a call that redis-rs retries or that the store sends again
//! (`NOSCRIPT` after `SCRIPT FLUSH`, a Cluster `MOVED` or `TRYAGAIN`, a reconnect) runs after the
//! calls written meanwhile. Each call is still atomic, so no limit is exceeded; only the order
//! between those calls' decisions may differ.
//!
//! Under load a batch holds what arrived while the window was full, at most [`MAX_BATCH`]
//! decisions, so one script run stays short. At most [`MAX_PENDING`] wait per lane; beyond
//! that a decision is answered at once with [`StoreError::Overloaded`] (the route's `on_error`
//! decides it, and it is counted), so waiting stays bounded.
//!
//! **A known-full bucket costs nothing** (`lane.rs`): a denial that comes back answers at once
//! every queued decision for the same bucket and limits, and any that arrive while the lane
//! is busy, for as long as the denial is certain (the deny cache's argument, in
//! `deny_cache.rs`; it holds with several calls in flight, since a denial proves that no
//! decision anywhere can be admitted for the bucket before its `until`). A burst of thousands
//! for one bucket thus costs a few calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use tokio::sync::oneshot;

use super::lane::{Arrival, Next, Pending, MAX_BATCH, MAX_PENDING, WINDOW};
use super::{patience, Inner};
use crate::limiter::{Limit, StoreError, Verdict};

impl Inner {
    /// Decide one request in its lane's next batch, or from a denial the lane already knows.
    /// The batch goes out at once while the window has room (the request starts its lane's
    /// sender, or rings it), else when a call in flight returns.
    pub(super) async fn check_coalesced(
        self: &Arc<Self>,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<Verdict, StoreError> {
        let lane = self.target.lane_of(bucket);
        let generation = self.gate.generation();
        let (tx, rx) = oneshot::channel();
        let arrival = self
            .lanes
            .get(lane)
            .arrive(bucket, limits, tx, generation, Instant::now());
        match arrival {
            Arrival::Known(verdict) => return Ok(verdict),
            Arrival::Overloaded => return Err(StoreError::Overloaded(MAX_PENDING)),
            Arrival::Queued => {}
            Arrival::Send => self.lanes.bell(lane).notify_one(),
            Arrival::Start => {
                // The guard exists before the task first runs: a task dropped unpolled
                // releases the lane too.
                let task = Draining {
                    inner: self.clone(),
                    lane,
                    finished: false,
                };
                // Unconstrained: tokio's cooperative budget could otherwise make a call's
                // first poll return before it handed its command over (see `drain`).
                self.io.spawn(tokio::task::unconstrained(drain(task)));
            }
        }
        let answered = async {
            rx.await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("batch dropped".into())))
        };
        let last_answer = || self.lanes.get(lane).last_answer();
        patience::wait(self.timeout, last_answer, answered).await
    }

    /// Send one batch and deliver its verdicts.
    async fn send_batch(&self, lane: usize, mut batch: Vec<Pending>) {
        // A waiter that gave up (deadline, client gone) is not decided: it was answered
        // without this decision, so recording it would charge a request twice.
        batch.retain(|p| !p.verdict.is_closed());
        if batch.is_empty() {
            return;
        }
        let conn = match self.live_conn() {
            Ok(conn) => conn,
            Err(error) => return fail_all(batch, &error),
        };
        let generation = self.gate.generation();
        let evalsha = self.evalsha(batch.iter().map(|p| (&*p.bucket, &*p.limits)));
        let sent = Instant::now();
        let mut reply = match self.call(&conn, &evalsha).await {
            Ok(reply) => reply,
            Err(error) => return fail_all(batch, &error),
        };
        let mut lane = self.lanes.get(lane);
        lane.answered(Instant::now());
        // (The lock is held while verdicts are delivered: no await below.)
        let expected: usize = batch.iter().map(|p| 1 + 2 * p.limits.len()).sum();
        if reply.len() != expected {
            let error = StoreError::Backend(format!(
                "script reply has {} integers for {} decisions, expected {expected}",
                reply.len(),
                batch.len()
            ));
            return fail_all(batch, &error);
        }
        for p in batch {
            let verdict = reply.next_verdict(&p.limits);
            if let Ok(v) = &verdict {
                lane.learn(&p.bucket, &p.limits, v, sent, generation);
            }
            // The waiter may have given up in the meantime; nothing to do then.
            let _ = p.verdict.send(verdict);
        }
        lane.answer_known(generation);
    }
}

/// Give every decision of a batch the same error.
fn fail_all(batch: Vec<Pending>, error: &StoreError) {
    for p in batch {
        let _ = p.verdict.send(Err(error.clone()));
    }
}

/// A call started by the sender: one batch sent and its verdicts delivered.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The lane's sender: keep up to [`WINDOW`] calls in flight until the queue is empty and every
/// call has returned, then let the next request start a sender again.
async fn drain(mut task: Draining) {
    let mut calls: Vec<Call> = Vec::with_capacity(WINDOW);
    loop {
        loop {
            // (A statement of its own: the lane's lock must end before the first poll.)
            let next = task.inner.lanes.get(task.lane).next_batch(MAX_BATCH);
            match next {
                Next::Send(batch) => {
                    let inner = task.inner.clone();
                    let lane = task.lane;
                    let mut call: Call =
                        Box::pin(async move { inner.send_batch(lane, batch).await });
                    // The first poll hands the command to the connection (see the module
                    // documentation): now, before the next batch is taken. If the connection's
                    // channel is full, the call waits in its (first come, first served) queue
                    // and later calls wait behind it.
                    if poll_once(&mut call).await.is_ready() {
                        task.inner.lanes.get(task.lane).returned();
                    } else {
                        calls.push(call);
                    }
                }
                Next::Wait => break,
                Next::Idle => {
                    task.finished = true;
                    return;
                }
            }
        }
        tokio::select! {
            () = one_returns(&mut calls) => task.inner.lanes.get(task.lane).returned(),
            () = task.inner.lanes.bell(task.lane).notified() => {}
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
async fn one_returns(calls: &mut Vec<Call>) {
    std::future::poll_fn(|cx| {
        // In the order the calls started (`remove`, not `swap_remove`): a call that could not
        // hand its command over on its first poll (the connection's channel full) does so
        // before any later one.
        let done = calls
            .iter_mut()
            .position(|c| c.as_mut().poll(cx).is_ready());
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
struct Draining {
    inner: Arc<Inner>,
    lane: usize,
    finished: bool,
}

impl Drop for Draining {
    fn drop(&mut self) {
        if !self.finished {
            let orphans = self.inner.lanes.get(self.lane).release();
            drop(orphans);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::redis::{RedisNodes, RedisStore, RedisTarget};
    use std::time::Duration;

    /// A store that is never connected: these tests only touch its lane.
    fn store() -> RedisStore {
        let info = redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:1").unwrap();
        RedisStore::new(&RedisTarget {
            nodes: RedisNodes::Single(Box::new(info)),
            prefix: "t".into(),
            timeout: Duration::from_millis(50),
            tls: None,
        })
        .unwrap()
    }

    /// A decision that started its lane's sender, and one queued after it, as
    /// `check_coalesced` leaves them.
    fn queue_two(inner: &Inner) -> [oneshot::Receiver<Result<Verdict, StoreError>>; 2] {
        let mut lane = inner.lanes.get(0);
        let (first, rx1) = oneshot::channel();
        assert!(matches!(
            lane.arrive("r:a", &[], first, 0, Instant::now()),
            Arrival::Start
        ));
        let (tx, rx2) = oneshot::channel();
        assert!(matches!(
            lane.arrive("r:c", &[], tx, 0, Instant::now()),
            Arrival::Send
        ));
        [rx1, rx2]
    }

    #[test]
    fn a_draining_task_that_never_ran_releases_the_lane() {
        let store = store();
        let mut rx = queue_two(&store.inner);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let task = Draining {
            inner: store.inner.clone(),
            lane: 0,
            finished: false,
        };
        runtime.spawn(drain(task));
        // Shut down before the task was ever polled (as at process exit).
        drop(runtime);
        assert!(
            !store.inner.lanes.get(0).is_sending(),
            "later requests would queue forever"
        );
        // Answered by the drop (closed), not left waiting (empty): `is_err` would accept both.
        for rx in &mut rx {
            assert!(
                matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
                "the waiter is answered (batch dropped)"
            );
        }
    }

    #[test]
    fn a_finished_draining_task_leaves_the_lane_alone() {
        let store = store();
        let _rx = queue_two(&store.inner);
        let task = Draining {
            inner: store.inner.clone(),
            lane: 0,
            finished: true,
        };
        drop(task);
        // A finished task has handed `sending` on itself; its drop must not touch new waiters.
        assert!(store.inner.lanes.get(0).is_sending());
    }
}
