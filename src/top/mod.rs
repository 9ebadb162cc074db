//! The top limited clients of each route (issue 54): who is denied most, by which limits,
//! and how much they were admitted beside that.
//!
//! On the request path a decision is one [`RouteTop::record`]: a lock held for an O(1)
//! Space-Saving update (`summary.rs`) of the route's summary of the current fold period. Every
//! [`FOLD_EVERY`] the fold task (`fold.rs`) takes each summary whole (a fresh one in its place)
//! and, off the request path, files its counts in this proxy's minutes (`window.rs`) and, on a
//! shared store, adds them to the store's counts ([`crate::limiter::Store::fold_top`]), so any
//! proxy's `GET /api/v1/top` answers for the fleet.
//!
//! Memory is fixed by `server.top_clients` (`k`): per route, one summary of `k` counters and
//! at most `k` clients in each of 16 minutes. Counts are lower bounds (a counter's count less
//! its error): over a span, a client's `denied` is short of its true denials by at most `N /
//! k`, `N` being the route's denials in that span (on a shared store: by every proxy), and
//! every client with more than that is listed.

pub mod fold;
pub mod summary;
pub mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::limiter::top::TopCount;
use summary::SpaceSaving;
use window::Minutes;

/// `server.top_clients`' default.
pub const DEFAULT_TOP_CLIENTS: usize = 100;

/// How often each summary is folded.
pub const FOLD_EVERY: Duration = Duration::from_secs(2);

/// Most clients an answer lists.
pub const MAX_LISTED: usize = 50;

/// Counters per route (`server.top_clients`), read when a route's summary is first made.
static CAPACITY: AtomicUsize = AtomicUsize::new(DEFAULT_TOP_CLIENTS);

/// Every route's summaries, by route name: a reload keeps a route's counts.
pub static BOARD: LazyLock<Board> = LazyLock::new(Board::default);

/// Set `server.top_clients` before the first rules are built.
pub fn init(top_clients: usize) {
    CAPACITY.store(top_clients.max(1), Ordering::Relaxed);
}

/// One route's summaries.
pub struct RouteTop {
    /// The current fold period's Space-Saving summary.
    period: Mutex<SpaceSaving>,
    /// This proxy's counts per minute, filed at each fold.
    minutes: Mutex<Minutes>,
    /// The route's policy names, as the current rules give them (bit `i` of a count's
    /// `refused` is `limits[i]`).
    limits: ArcSwap<Vec<String>>,
    hasher: ahash::RandomState,
}

impl RouteTop {
    fn new(capacity: usize, limits: Vec<String>) -> RouteTop {
        let hasher = ahash::RandomState::new();
        RouteTop {
            period: Mutex::new(SpaceSaving::new(capacity, hasher.clone())),
            minutes: Mutex::new(Minutes::new(capacity)),
            limits: ArcSwap::from_pointee(limits),
            hasher,
        }
    }

    /// Count one decision of the client of `bucket`: a denial by the limits of `refused` (one
    /// bit each, in the route's order), or an admission.
    pub fn record(&self, bucket: &str, denied: bool, refused: u64) {
        let mut period = self.period.lock().unwrap_or_else(|e| e.into_inner());
        period.record(bucket, denied, refused);
    }

    /// The route's policy names.
    pub fn limits(&self) -> Arc<Vec<String>> {
        self.limits.load_full()
    }

    /// Take the current period's counts (lower bounds: a counter less its error), leaving an
    /// empty summary in its place.
    fn take_period(&self) -> Vec<TopCount> {
        // An idle route's period is left in place: no summary made for nothing.
        if self
            .period
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return Vec::new();
        }
        let fresh = SpaceSaving::new(self.capacity(), self.hasher.clone());
        let taken = {
            let mut period = self.period.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *period, fresh)
        };
        lower_bounds(&taken)
    }

    /// The current period's counts, not taken.
    fn peek_period(&self) -> Vec<TopCount> {
        let period = self.period.lock().unwrap_or_else(|e| e.into_inner());
        lower_bounds(&period)
    }

    fn capacity(&self) -> usize {
        let minutes = self.minutes.lock().unwrap_or_else(|e| e.into_inner());
        minutes.capacity()
    }

    /// This proxy's own counts over the `span` minutes up to `now` (the period not folded yet
    /// included), most denied first, at most `max`.
    pub fn local_top(&self, now: u64, span: u64, max: usize) -> Vec<TopCount> {
        let extra = self.peek_period();
        let minutes = self.minutes.lock().unwrap_or_else(|e| e.into_inner());
        minutes.top(now, span, extra, max)
    }
}

/// A summary's counts as lower bounds, those with anything to say.
fn lower_bounds(summary: &SpaceSaving) -> Vec<TopCount> {
    (summary.entries())
        .map(|s| TopCount {
            bucket: s.key.clone(),
            denied: s.denied - s.error,
            allowed: s.allowed,
            refused: s.refused,
        })
        .filter(|c| c.denied > 0 || c.allowed > 0)
        .collect()
}

/// Every route's [`RouteTop`], by name.
#[derive(Default)]
pub struct Board {
    routes: Mutex<HashMap<String, Arc<RouteTop>>>,
}

impl Board {
    /// The summaries of the route `name` with `limits` (made on its first rules; later rules
    /// update its policy names).
    pub fn route(&self, name: &str, limits: &[String]) -> Arc<RouteTop> {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(top) = routes.get(name) {
            if **top.limits.load() != limits {
                top.limits.store(Arc::new(limits.to_vec()));
            }
            return top.clone();
        }
        let top = Arc::new(RouteTop::new(
            CAPACITY.load(Ordering::Relaxed),
            limits.to_vec(),
        ));
        routes.insert(name.to_owned(), top.clone());
        top
    }

    /// The summaries of the routes some rules still hold (a route gone from every rule set is
    /// forgotten).
    fn current(&self) -> Vec<(String, Arc<RouteTop>)> {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.retain(|_, top| Arc::strong_count(top) > 1);
        (routes.iter())
            .map(|(name, top)| (name.clone(), top.clone()))
            .collect()
    }
}

/// Minutes since the Unix epoch, on this proxy's clock.
pub fn minute_now() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.unwrap_or_default().as_secs() / 60
}
