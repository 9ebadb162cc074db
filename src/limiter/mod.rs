//! The rate limiter: a [`Store`] decides, atomically, whether one request fits every sliding-window
//! limit of its route, and records it in all of them or in none.
//!
//! The algorithm is a sliding-window **log**: each limit keeps the timestamps of the requests it
//! admitted. A decision evicts the timestamps older than `now - window`, counts what is left, and
//! admits only if every limit has `count < requests`. Denied requests are never recorded, so a
//! flood does not eat the quota of the legitimate traffic that follows it.
//!
//! A limit with a `resolution` ([`LimitKind::Slotted`]) keeps one counter per slot of that
//! length instead of one entry per request: it counts every slot that overlaps
//! `(now - window, now]`, so it never admits more than `requests` in any window either, but it
//! may refuse early, up to one slot: a refusal at `now` means the exact log with a window one
//! `resolution` longer would refuse too. Its memory is bounded by `window / resolution + 1`
//! counters per client whatever the rate.
//!
//! Two stores implement the same contract and pass the same conformance suite
//! (`tests/it/limiter_conformance.rs`): [`memory::MemoryStore`] (one process) and
//! [`redis::RedisStore`] (any number of proxies sharing one Redis, a master found through
//! Redis Sentinel, or a Redis Cluster).

mod admission;
pub mod algo;
pub mod buckets;
pub mod coalesce;
pub mod fallback;
/// Fixtures shared by the unit tests of the modules that render verdicts or wrap stores.
#[cfg(test)]
pub(crate) mod fixtures;
pub mod layer;
pub mod lease;
pub mod memory;
pub mod redis;
pub mod settle;
pub mod smoothing;
pub mod top;
mod view;

pub use admission::{Admission, Change};
pub use algo::{Kind, Limit, LimitId, LimitKind, QuotaUnit, Unit, MAX_SLOTS};
pub use buckets::Buckets;
pub use layer::{Ask, Decide, Decided, DecidedBy, Observe};
pub use view::{LimitView, WindowView, MAX_VIEW_ENTRIES};

use std::time::Duration;

use async_trait::async_trait;

/// A hasher for map keys that already are hashes (of bucket keys, under a secret seed): the
/// map need not hash them again.
#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The state of one limit after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Requests still admissible in the current window, after this decision.
    pub remaining: u32,
    /// Time until the oldest entry in the window leaves it, i.e. until there is room for one
    /// more request (for a slotted limit: until its oldest non-empty time slot leaves). When
    /// nothing is recorded this is the full window. A full limit admits again exactly after
    /// `reset`.
    pub reset: Duration,
}

/// The outcome of one decision over all limits of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// True when every limit admitted the request (and it was recorded in every limit).
    pub admitted: bool,
    /// One state per limit, in the order the limits were given.
    pub states: Vec<LimitState>,
    /// For an admitted request: when the store recorded it, in µs on the store's clock (every
    /// entry of this admission carries that time). [`Store::refund`] names the admission by it.
    /// `None` for a denial, and for an admission with no limits.
    pub recorded_at: Option<u64>,
    /// One record time per limit when an admission's limits were recorded at different times
    /// (a Redis Cluster decision over buckets in several hash slots, each its own script call
    /// on its own node's clock); empty, allocating nothing, when `recorded_at` names them all.
    pub recorded_each: Vec<u64>,
}

impl Verdict {
    /// A verdict whose limits were decided in parts: `times` per limit (0: not recorded;
    /// any value for a denial). The record times are kept per limit only when they differ.
    pub fn combined(admitted: bool, states: Vec<LimitState>, times: Vec<u64>) -> Verdict {
        // A part decided without a record time (the memory store's summary alone) cannot be
        // given back: then neither is the whole, which only errs on the safe side.
        let recorded = admitted && times.iter().all(|&t| t > 0);
        let first = times.first().copied().filter(|_| recorded);
        let same = times.iter().all(|&t| Some(t) == first);
        Verdict {
            admitted,
            states,
            recorded_at: first,
            recorded_each: if first.is_some() && !same {
                times
            } else {
                Vec::new()
            },
        }
    }

    /// When an admission was recorded: one time for every limit, or one per limit (see
    /// [`Verdict::recorded_each`]); what [`Store::refund`] takes. `None` as for `recorded_at`.
    pub fn recorded_times(&self) -> Option<&[u64]> {
        let at = self.recorded_at.as_ref()?;
        Some(match self.recorded_each.is_empty() {
            true => std::slice::from_ref(at),
            false => &self.recorded_each,
        })
    }

    /// How long a denied client should wait: the largest `reset` among the limits that are
    /// full. `None` when the request was admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        if self.admitted {
            return None;
        }
        self.states
            .iter()
            .filter(|s| s.remaining == 0)
            .map(|s| s.reset)
            .max()
    }

    /// This verdict `elapsed` later, for answering from a known denial: every `reset` shortened
    /// by `elapsed`, never to 0 (as far as we know no room has freed yet).
    pub fn aged(&self, elapsed: Duration) -> Verdict {
        let states = self
            .states
            .iter()
            .map(|s| LimitState {
                remaining: s.remaining,
                reset: s
                    .reset
                    .saturating_sub(elapsed)
                    .max(Duration::from_micros(1)),
            })
            .collect();
        Verdict {
            admitted: self.admitted,
            states,
            recorded_at: self.recorded_at,
            recorded_each: self.recorded_each.clone(),
        }
    }

    /// Indexes of the limits that denied this request (empty when admitted).
    pub fn violated(&self) -> impl Iterator<Item = usize> + '_ {
        let admitted = self.admitted;
        self.states
            .iter()
            .enumerate()
            .filter(move |(_, s)| !admitted && s.remaining == 0)
            .map(|(i, _)| i)
    }
}

/// Why a store could not decide. The proxy then applies the route's `on_error` policy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The decision did not complete within `store.timeout`.
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    /// The store is not connected (never was, or the connection is being re-established).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error (script error, wrong type, cluster error, ...).
    #[error("store error: {0}")]
    Backend(String),
    /// More decisions are waiting for the shared store than the proxy queues (the store is
    /// answering, but this proxy is asking faster than it can): answered at once, not queued.
    /// This is the proxy's own overload, not a store failure: the request is shed (`503`),
    /// never decided by `on_error`, whose local log or fail-open would let a flood of other
    /// clients open a limit; and it is not a store error ([`StoreError::kind`] is `None`).
    #[error("store queue full: {0} decisions already waiting")]
    Overloaded(usize),
}

/// The kinds of [`StoreError`], as counted in `slidegate_store_errors_total{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// [`StoreError::Timeout`].
    Timeout,
    /// [`StoreError::Unavailable`].
    Unavailable,
    /// [`StoreError::Backend`].
    Backend,
}

impl StoreErrorKind {
    /// Every kind, in discriminant order (metric handles are resolved for each at start).
    pub const ALL: [StoreErrorKind; 3] = [
        StoreErrorKind::Timeout,
        StoreErrorKind::Unavailable,
        StoreErrorKind::Backend,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Backend => "backend",
        }
    }
}

impl StoreError {
    /// Which kind of store failure this is; `None` for the proxy's own overload, which is
    /// no failure of the store.
    pub fn kind(&self) -> Option<StoreErrorKind> {
        Some(match self {
            StoreError::Timeout(_) => StoreErrorKind::Timeout,
            StoreError::Unavailable(_) => StoreErrorKind::Unavailable,
            StoreError::Backend(_) => StoreErrorKind::Backend,
            StoreError::Overloaded(_) => return None,
        })
    }
}

/// What a decision comes to: the verdict, or why the store could not give one.
pub type Checked = Result<Verdict, StoreError>;

/// A limit store: every backend (memory, Redis single/Sentinel/Cluster, and wrappers such as
/// the deny cache) implements every method, and passes one conformance suite
/// (`tests/it/limiter_conformance.rs`) for each. There are no optional parts: a backend that
/// could not inspect, reset or refund would fail the admin API or `count_status` at run time.
///
/// `check` must be atomic per bucket: concurrent calls for the same bucket, from any number of
/// tasks (or, for shared stores, processes), never admit more than `requests` in any window.
///
/// The store owns its deadline: `check`, `inspect`, `reset` and `refund` return within the
/// timeout it was built with ([`StoreError::Timeout`] when that runs out), so callers need no
/// timer of their own.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decide one request of `route` against `limits`, each counted in its bucket of
    /// `buckets` (usually one for all: [`Buckets::one`]; bucket texts are already bounded in
    /// size and free of `{`, `}`); record it in every limit if and only if all admit. The
    /// route lets a store keep routes apart without parsing the bucket text (the memory store
    /// gives each route its own arena); a store may ignore it.
    ///
    /// Limits in different buckets are all-or-nothing too: a store that cannot decide them in
    /// one atomic step reserves them in a fixed order and gives back what it reserved when a
    /// later one denies ([`buckets::reserve_in_order`]): a brief over-count, never an
    /// admission past a limit.
    ///
    /// This is the hot path: the proxy calls it once per limited request. Stores that batch
    /// (Redis) gather concurrent calls themselves; one call is a batch of one.
    async fn check(&self, route: &str, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked;

    /// Read the current window of every limit of `bucket`, recording nothing (a read-only
    /// script or read commands, never the deciding step). For the admin inspector. A bucket
    /// the store does not know reads as empty: every limit with its full `requests` remaining.
    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError>;

    /// Forget every recorded entry of `bucket` (all its limits): the admin "reset bucket".
    /// Afterwards the bucket admits the full `requests` of every limit again. A no-op for a
    /// bucket the store does not know.
    async fn reset(&self, bucket: &str, limits: &[Limit]) -> Result<(), StoreError>;

    /// Give back `admission` (its route's request under its limits, each in its bucket,
    /// recorded at [`Verdict::recorded_times`]: one time for all, or one per limit): remove
    /// that request's own entry from every limit's log in its bucket (one counted in its time
    /// slot for a slotted limit), so it no longer counts (`count_status`). A no-op for an
    /// entry that has already left its window, or a bucket that is gone.
    ///
    /// With [`Change::Charge`] (a cost settled higher than charged), add each limit's weight
    /// in the slot of the store's now instead, with no room check: the bucket may go over its
    /// quota, and later requests wait until the window frees the debt, one window after the
    /// cost became known. Not in the admission's slot: a response that lasted longer than the
    /// window (a client reading slowly) would have seen it leave, and the charge with it. Only
    /// slotted limits take a charge (a log ignores it); a bucket gone meanwhile is created.
    async fn refund(&self, admission: Admission<'_>) -> Result<(), StoreError>;

    /// Renew the leases of `admission`: in each of its concurrency limits (each in its bucket),
    /// replace the entry recorded at its time (one time for all, or
    /// one per limit) by one stamped now, so its deadline moves one `lease_ttl` on, atomically.
    /// Returns the new time per limit, for the next renewal and the release (a
    /// [`Store::refund`]): 0 where the lease had already lapsed (left its window, or its bucket
    /// was reset), which renews nothing, so a lapsed lease never comes back.
    async fn renew(&self, admission: Admission<'_>) -> Result<Vec<u64>, StoreError>;

    /// The value of `field` in the hash `<prefix>:<hash>` that a system outside the proxy
    /// writes (a customer's plan: `HSET <prefix>:plans <key> <plan>`); `None` when absent. The
    /// memory store holds no such hash: always `None`.
    async fn read_shared(&self, hash: &str, field: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// The backend name used as a metric label (`memory`, `redis`, `redis_cluster`,
    /// `redis_sentinel`).
    fn backend(&self) -> &'static str;

    /// Called about once a second on the proxy's runtime: connect or reconnect, refresh
    /// readiness. Must return quickly: it shares the threads that serve requests.
    async fn maintain(&self) {}

    /// Called about once a second on a background thread of its own: drop expired state (idle
    /// buckets, stale cache entries). May take a while; it never runs on the proxy's workers.
    fn sweep_expired(&self) {}

    /// True when the store can currently answer (used by `/readyz`).
    fn is_ready(&self) -> bool {
        true
    }

    /// Called after a reload swapped in new rules: drop anything derived from the old limits.
    fn rules_changed(&self) {}

    /// A number that changes whenever the store may have lost its state (a shared store's
    /// connection dropped or was rebuilt: the server may have restarted empty). Anything derived
    /// from earlier decisions, like the deny cache, is void once it changes.
    fn generation(&self) -> u64 {
        0
    }

    /// True when [`Store::fold_top`] shares the top limited clients with every proxy of the
    /// store, and [`Store::read_top`] answers for all of them (a shared store); false: each
    /// proxy's own summary answers.
    fn shares_top(&self) -> bool {
        false
    }

    /// Add one fold of each route's top clients to the shared counts, in one bounded call per
    /// route (at most [`top::FOLD_TIMEOUT`]); a fold that fails is lost, never sent again.
    async fn fold_top(&self, _folds: Vec<top::TopFold>) -> Result<(), StoreError> {
        Ok(())
    }

    /// The shared counts of `query`'s route over its minutes, most denied first.
    async fn read_top(&self, _query: top::TopQuery) -> Result<Vec<top::TopCount>, StoreError> {
        Ok(Vec::new())
    }
}
