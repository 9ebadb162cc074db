//! What a policy layer is. The [`Store`](super::Store) decides; the layers around it add the
//! route's policies, each a wrapper of its own, statically dispatched (a generic, no boxed
//! future of its own), as tower's layers wrap a service:
//!
//! - [`fallback`](super::fallback): this proxy's own log decides while the shared store cannot
//!   (`on_error = "local"`), from what it last learned of each bucket;
//! - [`smoothing`](super::smoothing): a denial whose room frees within `max_delay` waits for it
//!   and is decided again;
//! - [`settle`](super::settle): an admission given back (`count_status`) or its cost corrected
//!   (`settle`) once the response has ended;
//! - [`lease`](super::lease): a concurrency limit's lease renewed while its request runs and
//!   given back when it ends.
//!
//! A layer that decides implements [`Decide`]: [`Fallback`](super::fallback::Fallback) around
//! the store, [`Smoothing`](super::smoothing::Smoothing) around any [`Decide`]. What a layer
//! measures it reports to an [`Observe`] passed in: the metrics live above the limiter.

use std::future::Future;
use std::time::Duration;

use super::{Buckets, Checked, Limit, StoreError};

/// One decision asked of a layer.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    /// The route's name (a store may keep routes apart by it).
    pub route: &'a str,
    /// The bucket of each limit.
    pub buckets: &'a Buckets<'a>,
    /// The limits, each weighing what the request weighs there.
    pub limits: &'a [Limit],
    /// The route's `on_error` is `"local"`: this proxy's own log may decide when the shared
    /// store cannot.
    pub local: bool,
}

/// Who gave a decision its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The route's store.
    Store,
    /// This proxy's local log, because the shared store could not decide.
    Local,
}

/// A decision and who made it.
#[derive(Debug)]
pub struct Decided {
    /// The verdict, or why there is none.
    pub result: Checked,
    /// Who decided.
    pub by: DecidedBy,
}

/// A layer that decides one request.
pub trait Decide: Send + Sync {
    /// The verdict for `ask`, and who gave it.
    fn decide(&self, ask: Ask<'_>) -> impl Future<Output = Decided> + Send;
}

/// What a layer tells the metrics kept above the limiter. `()` observes nothing.
pub trait Observe: Send + Sync {
    /// The shared store answered a decision after `took`.
    fn answered(&self, _took: Duration) {}

    /// The shared store could not decide (the proxy's own overload is no failure: not told).
    fn failed(&self, _error: &StoreError) {}
}

impl Observe for () {}
