//! Coalescing: decisions pending for one Redis at the same instant go out as one `EVALSHA`.
//!
//! Most of a one-limit decision's cost in Redis is the `EVALSHA` itself and its `TIME`, and
//! most of its cost in the proxy is the client library's per-command machinery (channel hops,
//! framing, reply parsing). A batch pays both once. The script takes any number of decisions
//! and runs them in order, atomically (see `lua/sliding_window.lua`), so a batch decides
//! exactly what the same decisions sent one by one would.
//!
//! The rule is group commit, with at most one call in flight per store:
//! - no call in flight: the request sends its own decision at once, so a lone client pays
//!   nothing extra (no queue, no task, no timer beyond the store deadline);
//! - a call in flight: the request queues its decision and waits (bounded by the store
//!   deadline). When the call in flight returns, whoever sent it hands the queue to a task that
//!   sends it as one call, then the decisions queued meanwhile, until the queue is empty.
//!
//! Under load a batch therefore holds what arrived during one round trip. Its size is capped
//! at [`MAX_BATCH`] decisions, so one script run stays short. A Cluster does not batch: its
//! buckets live in different slots.

use std::sync::{Arc, MutexGuard};

use tokio::sync::oneshot;

use super::conn::Conn;
use super::Inner;
use crate::limiter::{Limit, StoreError, Verdict};

/// Most decisions in one call. A batch this size runs in Redis for a few hundred µs.
pub(super) const MAX_BATCH: usize = 64;

/// The store's send state: is a call in flight, and what waits for it.
#[derive(Default)]
pub(super) struct Queue {
    /// A call to Redis is in flight; whoever sends it hands `pending` on when it returns.
    sending: bool,
    /// Decisions waiting for the next call, in arrival order.
    pending: Vec<Pending>,
}

/// One queued decision and where its verdict goes.
struct Pending {
    bucket: Box<str>,
    limits: Box<[Limit]>,
    verdict: oneshot::Sender<Result<Verdict, StoreError>>,
}

impl Inner {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // The lock guards a flag and a Vec: a panic while holding it leaves both usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decide one request on one Redis: at once when no call is in flight, else in the next
    /// batch.
    pub(super) async fn check_coalesced(
        self: &Arc<Self>,
        conn: &Conn,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<Verdict, StoreError> {
        // (A block, not `drop`: the guard must visibly end before any await.)
        let queued = {
            let mut queue = self.queue();
            if queue.sending {
                let (tx, rx) = oneshot::channel();
                queue.pending.push(Pending {
                    bucket: bucket.into(),
                    limits: limits.into(),
                    verdict: tx,
                });
                Some(rx)
            } else {
                queue.sending = true;
                None
            }
        };
        if let Some(rx) = queued {
            return match tokio::time::timeout(self.timeout, rx).await {
                Ok(Ok(verdict)) => verdict,
                // The runtime is shutting down and dropped the batch.
                Ok(Err(_)) => Err(StoreError::Unavailable("batch dropped".into())),
                Err(_) => Err(StoreError::Timeout(self.timeout)),
            };
        }
        // Hands the queue on even if this request is dropped (client gone) mid-call.
        let _handover = Handover(self);
        self.decide_now(conn, bucket, limits).await
    }

    /// Send one batch and deliver its verdicts.
    async fn send_batch(&self, mut batch: Vec<Pending>) {
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
        let evalsha = self.evalsha(batch.iter().map(|p| (&*p.bucket, &*p.limits)));
        let mut reply = match self.call(&conn, &evalsha).await {
            Ok(reply) => reply,
            Err(error) => return fail_all(batch, &error),
        };
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
            // The waiter may have given up in the meantime; nothing to do then.
            let _ = p.verdict.send(verdict);
        }
    }
}

/// Give every decision of a batch the same error.
fn fail_all(batch: Vec<Pending>, error: &StoreError) {
    for p in batch {
        let _ = p.verdict.send(Err(error.clone()));
    }
}

/// Take the next batch off a non-empty queue.
fn next_batch(queue: &mut Queue) -> Vec<Pending> {
    if queue.pending.len() <= MAX_BATCH {
        std::mem::take(&mut queue.pending)
    } else {
        queue.pending.drain(..MAX_BATCH).collect()
    }
}

/// Held by the request whose call is in flight. On drop (the call returned, or the request
/// was dropped), the decisions queued meanwhile go to a task that sends them; with none, the
/// next request sends its own again.
struct Handover<'a>(&'a Arc<Inner>);

impl Drop for Handover<'_> {
    fn drop(&mut self) {
        let mut queue = self.0.queue();
        if queue.pending.is_empty() {
            queue.sending = false;
            return;
        }
        let batch = next_batch(&mut queue);
        drop(queue);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (process exit): the waiters see their batch dropped.
            self.0.queue().sending = false;
            return;
        };
        // The guard exists before the task first runs: a task dropped unpolled releases too.
        runtime.spawn(drain(Draining::new(self.0.clone()), batch));
    }
}

/// Send batches until the queue is empty, then let requests send their own again.
async fn drain(mut task: Draining, mut batch: Vec<Pending>) {
    loop {
        task.inner.send_batch(batch).await;
        let mut queue = task.inner.queue();
        if queue.pending.is_empty() {
            queue.sending = false;
            drop(queue);
            task.finished = true;
            return;
        }
        batch = next_batch(&mut queue);
        drop(queue);
    }
}

/// The draining task's hold on the queue. If the task ends any other way than by emptying the
/// queue (a panic, the runtime dropping it), `sending` would stay set and every later request
/// would queue behind a task that no longer exists: on drop it answers the waiters (their batch
/// was dropped) and lets the next request send its own call again.
struct Draining {
    inner: Arc<Inner>,
    finished: bool,
}

impl Draining {
    fn new(inner: Arc<Inner>) -> Draining {
        Draining {
            inner,
            finished: false,
        }
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let orphans = {
            let mut queue = self.inner.queue();
            queue.sending = false;
            std::mem::take(&mut queue.pending)
        };
        drop(orphans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::redis::{RedisNodes, RedisStore, RedisTarget};
    use std::time::Duration;

    /// A store that is never connected: these tests only touch its queue.
    fn store() -> RedisStore {
        let info = redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1:1").unwrap();
        RedisStore::new(&RedisTarget {
            nodes: RedisNodes::Single(Box::new(info)),
            prefix: "t".into(),
            timeout: Duration::from_millis(50),
        })
        .unwrap()
    }

    /// A queued decision, as `check_coalesced` leaves it.
    fn queue_one(inner: &Inner) -> oneshot::Receiver<Result<Verdict, StoreError>> {
        let (tx, rx) = oneshot::channel();
        let mut queue = inner.queue();
        queue.sending = true;
        queue.pending.push(Pending {
            bucket: "r:c".into(),
            limits: Box::new([]),
            verdict: tx,
        });
        rx
    }

    #[test]
    fn a_draining_task_that_never_ran_releases_the_queue() {
        let store = store();
        let mut rx = queue_one(&store.inner);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.spawn(drain(Draining::new(store.inner.clone()), Vec::new()));
        // Shut down before the task was ever polled (as at process exit).
        drop(runtime);
        assert!(
            !store.inner.queue().sending,
            "later requests would queue forever"
        );
        assert!(store.inner.queue().pending.is_empty());
        assert!(
            rx.try_recv().is_err(),
            "the waiter is answered (batch dropped)"
        );
    }

    #[test]
    fn a_finished_draining_task_leaves_the_queue_alone() {
        let store = store();
        let _rx = queue_one(&store.inner);
        let mut task = Draining::new(store.inner.clone());
        task.finished = true;
        drop(task);
        // A finished task has handed `sending` on itself; its drop must not touch new waiters.
        assert!(store.inner.queue().sending);
        assert_eq!(store.inner.queue().pending.len(), 1);
    }
}
