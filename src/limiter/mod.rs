//! The rate limiter: a [`Store`] decides, atomically, whether one request fits every sliding-window
//! limit of its route, and records it in all of them or in none.
//!
//! The algorithm is a sliding-window **log**: each limit keeps the timestamps of the requests it
//! admitted. A decision evicts the timestamps older than `now - window`, counts what is left, and
//! admits only if every limit has `count < requests`. Denied requests are never recorded, so a
//! flood does not eat the quota of the legitimate traffic that follows it.
//!
//! Two stores implement the same contract and pass the same conformance suite
//! (`tests/limiter_conformance.rs`): [`memory::MemoryStore`] (one process) and
//! [`redis::RedisStore`] (any number of proxies sharing Redis or a Redis Cluster).

pub mod deny_cache;
pub mod memory;
pub mod redis;
mod view;

pub use view::{LimitView, WindowView, MAX_VIEW_ENTRIES};

use std::time::Duration;

use async_trait::async_trait;

/// One sliding-window limit: at most `requests` admitted requests in any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Maximum number of requests admitted in any window (≥ 1).
    pub requests: u32,
    /// Window length (≥ 1 ms).
    pub window: Duration,
}

impl Limit {
    /// The window in microseconds (windows are validated to whole milliseconds of at most 30
    /// days, so this is exact).
    pub fn window_us(&self) -> u64 {
        self.window.as_micros().min(u128::from(u64::MAX)) as u64
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window.as_millis().min(u128::from(u64::MAX)) as u64
    }

    /// What this limit is, apart from how many requests it admits: see [`LimitId`].
    pub fn id(&self) -> LimitId {
        LimitId {
            // Windows are validated to at most 30 days, well under 2^32 ms.
            window_ms: self.window_ms().min(u64::from(u32::MAX)) as u32,
        }
    }
}

/// The identity of a limit within its route: the Redis key suffix, the `RateLimit-Policy`
/// name's suffix, the memory store's log and the config's duplicate check all use it, so two
/// limits of one route share a log exactly when their ids are equal. `requests` is not part of
/// it: a reload that only changes `requests` keeps the recorded entries.
///
/// Today every limit is an exact log named by its window. A limit of another kind with the same
/// window must get a different id (a new field here, and a new suffix), never the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitId {
    window_ms: u32,
}

impl LimitId {
    /// The window in milliseconds.
    pub fn window_ms(self) -> u32 {
        self.window_ms
    }

    /// The window in microseconds.
    pub fn window_us(self) -> u64 {
        u64::from(self.window_ms) * 1000
    }

    /// Append the Redis key suffix (`<window ms>`), as [`Display`](std::fmt::Display) writes it
    /// but without the formatting machinery: this runs for every limit of every decision.
    pub fn push_key_suffix(self, out: &mut Vec<u8>) {
        out.extend_from_slice(itoa::Buffer::new().format(self.window_ms).as_bytes());
    }

    /// The suffix of the policy name `<route>-<suffix>`: whole seconds as `60s`, otherwise
    /// milliseconds as `1500ms`.
    pub fn policy_suffix(self) -> String {
        let ms = self.window_ms;
        if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }
}

/// The Redis key suffix: `<window ms>`.
impl std::fmt::Display for LimitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.window_ms)
    }
}

/// The state of one limit after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Requests still admissible in the current window, after this decision.
    pub remaining: u32,
    /// Time until the oldest entry in the window leaves it, i.e. until one more slot frees.
    /// When the log is empty this is the full window.
    pub reset: Duration,
}

/// The outcome of one decision over all limits of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// True when every limit admitted the request (and it was recorded in every limit).
    pub admitted: bool,
    /// One state per limit, in the order the limits were given.
    pub states: Vec<LimitState>,
}

impl Verdict {
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
    /// by `elapsed`, never to 0 (as far as we know the slot has not freed yet).
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
    /// A store could not track this client for lack of room. The memory store no longer
    /// answers it (a full route's new clients share its overflow bucket); kept so the metric
    /// label stays and a store with a hard bound can say so.
    #[error("memory store full (max_memory) with clients at their limit")]
    Full,
    /// More decisions are waiting for the shared store than the proxy queues (the store is
    /// answering, but this proxy is asking faster than it can): answered at once, not queued.
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
    /// [`StoreError::Full`].
    Full,
    /// [`StoreError::Overloaded`].
    Overload,
}

impl StoreErrorKind {
    /// Every kind, in discriminant order (metric handles are resolved for each at start).
    pub const ALL: [StoreErrorKind; 5] = [
        StoreErrorKind::Timeout,
        StoreErrorKind::Unavailable,
        StoreErrorKind::Backend,
        StoreErrorKind::Full,
        StoreErrorKind::Overload,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Backend => "backend",
            StoreErrorKind::Full => "full",
            StoreErrorKind::Overload => "overload",
        }
    }
}

impl StoreError {
    /// Which kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Timeout(_) => StoreErrorKind::Timeout,
            StoreError::Unavailable(_) => StoreErrorKind::Unavailable,
            StoreError::Backend(_) => StoreErrorKind::Backend,
            StoreError::Full => StoreErrorKind::Full,
            StoreError::Overloaded(_) => StoreErrorKind::Overload,
        }
    }
}

/// What a decision comes to: the verdict, or why the store could not give one.
pub type Checked = Result<Verdict, StoreError>;

/// A limit store. `check` must be atomic per bucket: concurrent calls for the same bucket,
/// from any number of tasks (or, for shared stores, processes), never admit more than
/// `requests` in any window.
///
/// The store owns its deadline: `check` returns within the timeout it was built with
/// ([`StoreError::Timeout`] when that runs out), so callers need no timer of their own.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decide one request for `bucket` (route and client, already bounded in size and free of
    /// `{`, `}`) against `limits`; record it in every limit if and only if all admit.
    async fn check(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError>;

    /// [`Store::check`] for a bucket of `route` (the route's name), so that a store can keep
    /// routes apart without parsing the bucket text (the memory store gives each route its own
    /// room). By default the route is ignored.
    async fn check_in(&self, route: &str, bucket: &str, limits: &[Limit]) -> Checked {
        let _ = route;
        self.check(bucket, limits).await
    }

    /// The backend name used as a metric label (`memory`, `redis`, `redis_cluster`).
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

    /// Read the current window of every limit of `bucket`, recording nothing (a read-only
    /// script or read commands, never the deciding step). For the admin inspector.
    async fn inspect(&self, _bucket: &str, _limits: &[Limit]) -> Result<WindowView, StoreError> {
        Err(StoreError::Backend(format!(
            "the {} store cannot be inspected",
            self.backend()
        )))
    }

    /// Forget every recorded entry of `bucket` (all its limits): the admin "reset bucket".
    async fn reset(&self, _bucket: &str, _limits: &[Limit]) -> Result<(), StoreError> {
        Err(StoreError::Backend(format!(
            "the {} store cannot reset a bucket",
            self.backend()
        )))
    }

    /// Called after a reload swapped in new rules: drop anything derived from the old limits.
    fn rules_changed(&self) {}

    /// A number that changes whenever the store may have lost its state (a shared store's
    /// connection dropped or was rebuilt: the server may have restarted empty). Anything derived
    /// from earlier decisions, like the deny cache, is void once it changes.
    fn generation(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(requests: u32, ms: u64) -> Limit {
        Limit {
            requests,
            window: Duration::from_millis(ms),
        }
    }

    #[test]
    fn windows_in_us_and_ms() {
        let l = limit(1, 1500);
        assert_eq!((l.window_us(), l.window_ms()), (1_500_000, 1500));
        assert_eq!(l.id().window_us(), 1_500_000);
    }

    #[test]
    fn id_is_the_window_and_leaves_requests_out() {
        assert_eq!(limit(5, 60_000).id(), limit(100, 60_000).id());
        assert_ne!(limit(5, 60_000).id(), limit(5, 1_000).id());
    }

    #[test]
    fn id_texts_are_todays_key_suffix_and_policy_suffix() {
        for (ms, key, policy) in [(60_000, "60000", "60s"), (250, "250", "250ms")] {
            let id = limit(1, ms).id();
            let mut out = b"p:{b}:".to_vec();
            id.push_key_suffix(&mut out);
            assert_eq!(out, format!("p:{{b}}:{key}").into_bytes());
            assert_eq!(id.to_string(), key);
            assert_eq!(id.policy_suffix(), policy);
        }
    }
}

/// Fixtures shared by the unit tests of the modules that render verdicts.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A denial by the first of two limits (full, a slot frees in 1.2 s); the second has 40
    /// left and frees one in 30 s.
    pub(crate) fn denied_by_the_first_of_two() -> Verdict {
        Verdict {
            admitted: false,
            states: vec![
                LimitState {
                    remaining: 0,
                    reset: Duration::from_millis(1200),
                },
                LimitState {
                    remaining: 40,
                    reset: Duration::from_secs(30),
                },
            ],
        }
    }
}
