//! What a store is given and gives back for the top limited clients (the summary itself is
//! `crate::top`'s): a proxy's counts of one route's clients over a few seconds, folded into a
//! shared store so that any proxy answers for the fleet ([`super::Store::fold_top`]), and the
//! counts read back over some minutes ([`super::Store::read_top`]).

use std::sync::Arc;
use std::time::Duration;

/// How long a minute's counts stay in a shared store: the longest span asked (15 minutes)
/// and the minute in progress.
pub const TOP_TTL: Duration = Duration::from_secs(16 * 60);

/// The bound on one fold's call (a fold that runs out is dropped, never sent again: counts
/// added twice would be worse than counts missing).
pub const FOLD_TIMEOUT: Duration = Duration::from_secs(1);

/// Most clients each of a minute's sorted sets keeps in a shared store (the most denied, the
/// most admitted, the most often refused by a limit): however many proxies fold however many
/// clients, a route's keys hold at most this many members per minute and set.
pub const KEEP_PER_MINUTE: usize = 1000;

/// Most clients read per minute from a shared store: twice the answer, so that a client near
/// the top over several minutes but not in each is still found.
pub const READ_PER_MINUTE: usize = 100;

/// One client's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopCount {
    /// The client's bucket key (the route's key).
    pub bucket: String,
    /// Denials.
    pub denied: u64,
    /// Admissions.
    pub allowed: u64,
    /// The limits that refused it, one bit per limit in the order of the route's policy names.
    pub refused: u64,
}

/// One route's counts of one proxy since its last fold, all in `minute`.
#[derive(Debug, Clone)]
pub struct TopFold {
    /// The route's name.
    pub route: String,
    /// Minutes since the Unix epoch (the proxy's clock) the counts are filed under.
    pub minute: u64,
    /// The route's policy names: bit `i` of `refused` is `limits[i]`.
    pub limits: Arc<Vec<String>>,
    /// The clients with something to add.
    pub counts: Vec<TopCount>,
}

/// A read of one route's clients over some minutes.
#[derive(Debug, Clone)]
pub struct TopQuery {
    /// The route's name.
    pub route: String,
    /// The minutes (since the Unix epoch) to sum.
    pub minutes: Vec<u64>,
    /// The route's policy names, for `refused`.
    pub limits: Vec<String>,
    /// Most clients to return, most denied first.
    pub max: usize,
}
