//! Customer plans: which `[plans.<name>]` a client of a route with `plan` is counted under,
//! read after its key and before the limiter decides.
//!
//! The route is held once per plan in the rules (the same name, key and buckets, each with its
//! plan's limits), so the choice is only which of them decides. Buckets are the route's and
//! a limit's store key is its window and kind, not its amount: a client whose plan changes
//! keeps what it used in every window the two plans share, counted against the new amount (an
//! upgrade gets the difference at once, a downgrade is refused until the window frees enough).
//!
//! 1. [`mod@file`]: a plan file, read with the rules (start, reload, `--watch`).
//! 2. [`mod@cache`]: plans read from the store's hash `<prefix>:plans`, kept for `refresh`.

pub mod cache;
pub mod file;

use std::time::Instant;

use prometheus::IntCounter;

use crate::config::{PlanSource, RoutePlans};
use crate::limiter::Store;
use crate::logs::limit::{Throttled, EVENT_INTERVAL};
use crate::metrics::METRICS;
use cache::{Cached, PlanCache};
use file::{PlanFileError, PlanTable};

/// The hash a billing system writes each client's plan to: `<prefix>:plans`.
pub const PLANS_HASH: &str = "plans";

/// Where a route's clients' plans are looked up.
enum Lookup {
    /// A plan file, read when the rules were built.
    File(PlanTable),
    /// The store's hash, each entry kept for `refresh`.
    Store(PlanCache),
}

/// A route's plans: where each client's is read, and what is counted of the choice.
pub struct PlanDirectory {
    route: String,
    names: Vec<String>,
    default: u16,
    lookup: Lookup,
    /// `slidegate_plan_requests_total{route,plan}`, per plan.
    requests: Vec<IntCounter>,
    /// `slidegate_plan_fallbacks_total{route,reason}`: `unknown_plan`, `store_error`.
    unknown_plan: IntCounter,
    store_error: IntCounter,
    /// One WARN line per interval about plans that could not be used.
    log: Throttled,
}

impl PlanDirectory {
    /// The directory of route `route`'s `plans`, reading its plan file if it has one.
    pub fn build(route: &str, plans: &RoutePlans) -> Result<PlanDirectory, PlanFileError> {
        let names: Vec<String> = plans.each.iter().map(|p| p.name.clone()).collect();
        let lookup = match &plans.source {
            PlanSource::File(path) => {
                let named: Vec<&str> = names.iter().map(String::as_str).collect();
                Lookup::File(file::read(path, &named)?)
            }
            PlanSource::Redis { refresh } => {
                Lookup::Store(PlanCache::new(*refresh, PlanCache::CAPACITY))
            }
        };
        let fallbacks = &METRICS.plan_fallbacks;
        Ok(PlanDirectory {
            requests: (names.iter())
                .map(|plan| METRICS.plan_requests.with_label_values(&[route, plan]))
                .collect(),
            unknown_plan: fallbacks.with_label_values(&[route, "unknown_plan"]),
            store_error: fallbacks.with_label_values(&[route, "store_error"]),
            route: route.to_string(),
            names,
            default: u16::try_from(plans.default).unwrap_or(0),
            lookup,
            log: Throttled::default(),
        })
    }

    /// The plan names, in index order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of the plan of the client whose key value is `client` (`None`: the request
    /// carried none, and is keyed by its address): from the file, or from `store` (read again
    /// after `refresh`); the default plan for a client neither names, for a plan name the
    /// config lacks, and when the store cannot answer and nothing was read before.
    pub async fn plan_of(&self, client: Option<&[u8]>, store: &dyn Store) -> usize {
        let plan = match (client, &self.lookup) {
            (None, _) => self.default,
            (Some(key), Lookup::File(table)) => table.get(key).unwrap_or(self.default),
            (Some(key), Lookup::Store(cache)) => self.read(key, cache, store).await,
        };
        usize::from(plan)
    }

    /// Count a limited request decided under `plan` (`slidegate_plan_requests_total`).
    pub fn count(&self, plan: usize) {
        if let Some(counter) = self.requests.get(plan) {
            counter.inc();
        }
    }

    /// A client's plan by the store's hash, through the cache.
    async fn read(&self, key: &[u8], cache: &PlanCache, store: &dyn Store) -> u16 {
        let now = Instant::now();
        let before = match cache.get(key, now) {
            Cached::Fresh(plan) => return plan.unwrap_or(self.default),
            Cached::Stale(plan) => Some(plan),
            Cached::Unknown => None,
        };
        match store.read_shared(PLANS_HASH, key).await {
            Ok(value) => {
                let plan = value.and_then(|name| self.index_of(&name));
                cache.put(key, plan, now);
                plan.unwrap_or(self.default)
            }
            Err(e) => {
                self.store_error.inc();
                if let Some(n) = self.log.note(EVENT_INTERVAL) {
                    log::warn!(
                        "route {}: {n} client plan(s) could not be read ({e}); kept the last \
                         read or gave the default plan {:?}",
                        self.route,
                        self.names[usize::from(self.default)]
                    );
                }
                before.flatten().unwrap_or(self.default)
            }
        }
    }

    /// The index of the plan named `name` (as the store holds it); `None`, counted and logged,
    /// for a name the config lacks.
    fn index_of(&self, name: &[u8]) -> Option<u16> {
        let text = std::str::from_utf8(name).unwrap_or("").trim();
        if let Some(i) = self.names.iter().position(|n| n == text) {
            return u16::try_from(i).ok();
        }
        self.unknown_plan.inc();
        if let Some(n) = self.log.note(EVENT_INTERVAL) {
            // The name is the billing system's, not a client's: safe to show, but bounded.
            let shown: String = String::from_utf8_lossy(name).chars().take(64).collect();
            log::warn!(
                "route {}: {n} client(s) on an unknown plan (latest {shown:?}): given the \
                 default plan {:?}; add [plans.{shown}] or fix the entry",
                self.route,
                self.names[usize::from(self.default)]
            );
        }
        None
    }
}
