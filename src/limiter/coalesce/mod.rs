//! Coalescing: decisions pending for one lane go out as few calls, with a small window of calls
//! in flight, and a bucket known to be full is answered without a call.
//!
//! Generic over what a call is (`sender::Backend::send`: a batch in, one verdict per decision
//! out): the Redis store plugs its `EVALSHA` in, and nothing here knows of Redis.
//!
//! - `lane`: one lane's state machine (queue, calls in flight, idleness), pure;
//! - `known`: the one memory of provable denials the lanes answer from
//!   (`known::KnownDenials`: the local deny cache when `local_deny_cache` is on), pure;
//! - `deadline`: when a sender gives up on a call, and when an idle one ends (pure);
//! - `sender`: the front a request meets (`sender::decide`) and the task per lane that sends
//!   its batches and delivers the verdicts.
//!
//! Files import this one for the shared types below, and each other only downwards (sender →
//! lane → known, sender → deadline), never back.

pub(crate) mod deadline;
#[cfg(test)]
pub(crate) mod fixture;
pub(crate) mod known;
pub(crate) mod lane;
pub(crate) mod sender;

use std::future::Future;
use std::pin::Pin;

use tokio::sync::oneshot;

use crate::limiter::{Checked, Limit, Verdict};

impl Pending {
    /// The bucket limit `i` counts in.
    pub(crate) fn bucket_of(&self, i: usize) -> &str {
        match &self.per_limit {
            Some(each) => each.get(i).unwrap_or(&self.bucket),
            None => &self.bucket,
        }
    }
}

/// Where a verdict goes.
pub(crate) type Answer = oneshot::Sender<Checked>;

/// The bounds of a lane, handed to it by whoever sizes the calls (the sender), so that the lane
/// needs nothing of the sender.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Most decisions in one call.
    pub(crate) max_batch: usize,
    /// Most decisions waiting on one lane; past it a decision is answered `Overloaded`.
    pub(crate) max_pending: usize,
    /// Most calls in flight per lane.
    pub(crate) window: usize,
}

/// One queued decision and where its verdict goes.
pub(crate) struct Pending {
    /// The bucket decided (route and client).
    pub(crate) bucket: Box<str>,
    /// Each limit's bucket when they are not all `bucket` (`limits[].key`). Such a decision is
    /// neither answered from nor taught to the memory of denials: on a store that reserves
    /// in parts (a Cluster), a full limit may be another request's reservation about to be
    /// given back, which proves nothing.
    pub(crate) per_limit: Option<Box<[Box<str>]>>,
    /// The limits it is decided under.
    pub(crate) limits: Box<[Limit]>,
    /// Its waiter.
    pub(crate) verdict: Answer,
}

/// What a decision arriving at a lane does next.
pub(crate) enum Arrival {
    /// The bucket is known to be full: this is the verdict.
    Known(Verdict),
    /// Queued on an idle lane: the caller starts the lane's sender.
    Start,
    /// Queued while the sender runs, nothing is in flight and the window has room: the caller
    /// rings the lane's bell, so the sender sends it now.
    Send,
    /// Queued while calls are in flight and the window has room, and no ring is deferred yet:
    /// the caller rings the bell once its worker has run the other tasks it had ready
    /// ([`sender::decide`]), so what arrives in one pass of the worker goes as one call.
    Defer,
    /// Queued while the window is full (it goes in the next call, when one returns), or while
    /// a ring is deferred (it goes with that ring). The verdict comes through the channel.
    Queued,
    /// The queue is full: answer at once.
    Overloaded,
}

/// What the sender does next (see [`lane::Lane::next_batch`]).
pub(crate) enum Next {
    /// Send this batch now (it counts as in flight until [`lane::Lane::returned`]).
    Send(Vec<Pending>),
    /// Nothing to send now: wait for a call to return or the bell to ring.
    Wait,
    /// Nothing queued and nothing in flight: the lane is idle again; the sender waits for the
    /// bell, and ends when none rings for a while ([`lane::Lane::retire`]).
    Idle,
}

/// A call started by the sender: one batch sent and its verdicts delivered.
pub(crate) type Call = Pin<Box<dyn Future<Output = ()> + Send>>;
