//! The smoothing layer (`max_delay`, `max_queue`; nginx `limit_req burst=.. delay=..`): a
//! denial whose limit has room again soon waits for that room and is decided again, around any
//! layer that decides ([`Decide`]).
//!
//! Three parts: [`wait_for`], the pure decision (should this answer wait, and how long); the
//! per-bucket [`Queues`] of waiters ([`queues`]); and [`Smoothing::decide`], the waiting loop,
//! which also watches the request's [`Client`] so a client that leaves ends its wait.
//!
//! A waiter holds no store resources: no connection, no seat in a lane, only a timer and its
//! place. The promise stays the store's: a request is admitted only by a store decision, so
//! never more than `requests` are admitted in any window, however many waited.

pub mod queues;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

pub use queues::{Place, QueueMetrics, Queues};

use super::layer::{Ask, Decide, Decided};
use super::Checked;

/// Decisions one request may take while it waits, the first included. Waiters of one bucket
/// wake together when room frees and only one takes it; the others wait for the next room
/// within their `max_delay`, but each at most this many times, so a long `max_delay` on a busy
/// bucket costs the store a bounded number of calls per request.
pub const MAX_DECISIONS: u32 = 8;

/// How long a request should wait before it is decided again, or `None` when its answer is
/// final: it was admitted; the store could not decide (`on_error` answers, waiting would not
/// help); the route has no `max_delay` (`None`: a shadow route never delays either); room
/// frees only after `max_delay` from the first denial; or the request already took
/// [`MAX_DECISIONS`] decisions.
///
/// `waited` runs from the first denial's answer to when this decision was asked. Both ends
/// bracket the store's own instants (the first denial was decided before its answer came; this
/// decision is decided after it was asked), so `waited` never exceeds the time between the two
/// decisions on the store's clock, whatever the answers' latency: room that frees within
/// `max_delay` of the first denial always fits, however late answers arrive under load (a
/// waiter may then wait longer than `max_delay` by at most one decision's round trip).
///
/// Waiting until `max_delay` is used up, not once: a waiter that loses freed room to another
/// waiter, or that woke on a known denial's deadline just before Redis evicted the entry, is
/// still served if room frees again within its budget.
pub fn wait_for(
    max_delay: Option<Duration>,
    result: &Checked,
    waited: Duration,
    decisions: u32,
) -> Option<Duration> {
    let max_delay = max_delay?;
    // The time until every full limit has room again: before it, no decision can admit.
    let reset = result.as_ref().ok()?.retry_after()?;
    let fits = waited.checked_add(reset)? <= max_delay;
    (fits && decisions < MAX_DECISIONS).then_some(reset)
}

/// How long a route's denials may wait: `max_delay` from the first denial, `max_queue` waiters
/// per bucket, `max_delayed` over the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The longest a request waits, from its first denial.
    pub max_delay: Duration,
    /// Requests of one bucket waiting at once.
    pub max_queue: u32,
    /// Requests waiting at once over the process (`store.max_delayed`).
    pub max_delayed: u32,
}

/// The client of a request that may wait: its leaving ends the wait.
pub trait Client: Send {
    /// Why the client is gone.
    type Gone: Send;

    /// Resolves when the client is gone (pending for as long as it stays).
    fn gone(&mut self) -> impl Future<Output = Self::Gone> + Send;
}

/// What a smoothed decision came to.
#[derive(Debug)]
pub enum Smoothed<G> {
    /// The decision, the one taken after the wait if the request waited.
    Decided {
        /// The verdict, and who gave it.
        decided: Decided,
        /// How long the request waited (`None`: it did not).
        waited: Option<Duration>,
    },
    /// The client left while its request waited: nothing is sent.
    ClientGone {
        /// Why it is gone.
        why: G,
        /// How long it had waited.
        waited: Duration,
    },
}

/// Waits for room around `D`, with the [`Queues`] of its waiters.
pub struct Smoothing<D> {
    inner: D,
    queues: Queues,
}

impl<D: Decide> Smoothing<D> {
    /// Smoothing around `inner`, its waiters counted in `metrics`.
    pub fn new(inner: D, metrics: QueueMetrics) -> Smoothing<D> {
        Smoothing {
            inner,
            queues: Queues::new(metrics),
        }
    }

    /// The layer inside.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The layer inside, to change.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// The queues of the waiters (for tests).
    #[cfg(test)]
    pub(crate) fn queues(&self) -> &Queues {
        &self.queues
    }

    /// What the limits say of `ask`. A denial whose room frees within `budget`'s `max_delay`
    /// waits for it, with a place in the queue of the client's own bucket (the route's key,
    /// also when a limit of its own denied) and one of the process's `max_delayed` (none left:
    /// answered at once), and is decided again until admitted or out of budget (see
    /// [`wait_for`]); a `client` that leaves meanwhile ends it with [`Smoothed::ClientGone`].
    /// `budget` is `None` on a route that never waits (no `max_delay`, or a shadow route).
    pub async fn decide<C: Client>(
        &self,
        ask: Ask<'_>,
        budget: Option<Budget>,
        client: &mut C,
    ) -> Smoothed<C::Gone> {
        let max_delay = budget.map(|b| b.max_delay);
        let mut decided = self.inner.decide(ask).await;
        let first = wait_for(max_delay, &decided.result, Duration::ZERO, 1);
        let (Some(mut wait), Some(budget)) = (first, budget) else {
            return Smoothed::Decided {
                decided,
                waited: None,
            };
        };
        let bucket = ask.buckets.first();
        let joined = self
            .queues
            .join(bucket, budget.max_queue, budget.max_delayed);
        let Some(_place) = joined else {
            return Smoothed::Decided {
                decided,
                waited: None,
            };
        };
        let started = Instant::now();
        let mut decisions = 1;
        loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                why = client.gone() => {
                    let waited = started.elapsed();
                    return Smoothed::ClientGone { why, waited };
                }
            }
            // The store measures `reset` from when it decides, which is after this instant and
            // before its answer arrives: timed from here, how long an answer took on its way
            // back never counts against the budget (see `wait_for`).
            let asked = started.elapsed();
            decided = self.inner.decide(ask).await;
            decisions += 1;
            match wait_for(max_delay, &decided.result, asked, decisions) {
                Some(next) => wait = next,
                None => break,
            }
        }
        Smoothed::Decided {
            decided,
            waited: Some(started.elapsed()),
        }
    }
}
