//! One conformance suite for every store: the memory store, `RedisStore` on one Redis, on a
//! master found through three Redis Sentinels, and on a 3-master Redis Cluster must give the
//! same answers, and so must one Redis and the Cluster with the local deny cache on (which
//! answers denials locally and must never change a verdict).
//!
//! Each case is a plain `async fn(Arc<dyn Store>)`, in `limiter_conformance/decide.rs`
//! (deciding, refunds), `limiter_conformance/own_keys.rs` (limits in different buckets) or
//! `limiter_conformance/admin.rs` (`inspect`, `reset`); the
//! `conformance!` macro instantiates every case once per backend, each test with its own fresh
//! store: on Redis, its own key prefix on the servers all cases of that backend share.

mod admin;
mod calendar;
use crate::common;
mod cost;
mod decide;
mod lease;
mod own_keys;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use admin::*;
use calendar::*;
use common::redis::{shared_cluster, wait_ready, RedisCluster, RedisServer};
use common::sentinel::SentinelSet;
use common::shared::{unique_prefix, Shared};
use cost::*;
use decide::*;
use lease::*;
use own_keys::*;
use slidegate::limiter::memory::MemoryStore;
use slidegate::limiter::redis::{RedisStore, RedisTarget};
use slidegate::limiter::Store;

/// Generous store timeout: this suite checks semantics, not latency (see `redis_faults.rs`).
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// A store plus whatever must outlive it (the Redis processes).
type Fixture = (Arc<dyn Store>, Box<dyn Any + Send>);

async fn memory() -> Fixture {
    (Arc::new(MemoryStore::new()), Box::new(()))
}

/// A Redis store, typed (a deny cache reads its memory of denials), and what keeps its server.
type RedisFixture = (RedisStore, Box<dyn Any + Send>);

/// The servers every case of one backend shares, each case under a key prefix of its own
/// (a store sees only its prefix, so the cases stay independent): starting a server, a
/// Cluster or a Sentinel set per case was most of this suite's time. The Cluster is the run's
/// one ([`shared_cluster`]), which the proxies of other tests use under prefixes of their own:
/// no case here stops, freezes or reconfigures a node.
static SINGLE: Shared<RedisServer> = Shared::new();
static CLUSTER: Shared<Arc<RedisCluster>> = Shared::new();
static SENTINELS: Shared<SentinelSet> = Shared::new();

/// A store on a shared fixture: the target it gives, under a fresh prefix.
async fn shared_store<T: Send + 'static>(
    fixture: &'static Shared<T>,
    start: fn() -> T,
    target: fn(&T) -> RedisTarget,
    backend: &str,
    ready_within: Duration,
) -> RedisFixture {
    let mut target = tokio::task::spawn_blocking(move || fixture.with(start, target))
        .await
        .unwrap();
    target.prefix = unique_prefix(backend);
    let store = RedisStore::new(&target).unwrap();
    assert_eq!(store.backend(), backend);
    wait_ready(&store, ready_within).await;
    (store, Box::new(()))
}

async fn redis_single_store() -> RedisFixture {
    let target = |s: &RedisServer| s.redis_target(STORE_TIMEOUT);
    shared_store(
        &SINGLE,
        RedisServer::start,
        target,
        "redis",
        Duration::from_secs(10),
    )
    .await
}

async fn redis_cluster_store() -> RedisFixture {
    let (start, target) = (shared_cluster, |c: &Arc<RedisCluster>| {
        c.redis_target(STORE_TIMEOUT)
    });
    shared_store(
        &CLUSTER,
        start,
        target,
        "redis_cluster",
        Duration::from_secs(20),
    )
    .await
}

/// A store following the master three Sentinels name (the set keeps a replica too).
async fn redis_sentinel_store() -> RedisFixture {
    let target = |s: &SentinelSet| s.redis_target(STORE_TIMEOUT);
    shared_store(
        &SENTINELS,
        SentinelSet::start,
        target,
        "redis_sentinel",
        Duration::from_secs(20),
    )
    .await
}

async fn redis_single() -> Fixture {
    let (store, guard) = redis_single_store().await;
    (Arc::new(store), guard)
}

async fn redis_sentinel() -> Fixture {
    let (store, guard) = redis_sentinel_store().await;
    (Arc::new(store), guard)
}

async fn redis_cluster() -> Fixture {
    let (store, guard) = redis_cluster_store().await;
    (Arc::new(store), guard)
}

/// `fixture`'s Redis store with the local deny cache on, as the proxy runs a shared store by
/// default.
async fn deny_cached(fixture: impl std::future::Future<Output = RedisFixture>) -> Fixture {
    let (store, guard) = fixture.await;
    let store = store.with_deny_cache(Duration::from_secs(10));
    (Arc::new(store), guard)
}

async fn deny_cache_redis() -> Fixture {
    deny_cached(redis_single_store()).await
}

async fn deny_cache_redis_cluster() -> Fixture {
    deny_cached(redis_cluster_store()).await
}

// ---------------------------------------------------------------------------------------------
// Instantiation: every case for every backend.

macro_rules! conformance {
    ($backend:ident, $fixture:ident, [$($case:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (store, _guard) = super::$fixture().await;
                    super::$case(store).await;
                }
            )*
        }
    };
    ($backend:ident, $fixture:ident) => {
        conformance!(
            $backend,
            $fixture,
            [
                exact_count_under_concurrency,
                boundary_burst,
                stacked_limits_all_or_nothing,
                reset_and_remaining,
                buckets_are_independent,
                logs_are_keyed_by_window,
                no_limits_admits,
                slotted_exact_under_concurrency,
                slotted_burst_and_reset,
                slotted_and_log_all_or_nothing,
                refund_gives_back_its_own_entry,
                inspect_log_after_admissions,
                inspect_slotted_after_admissions,
                reset_log_admits_the_full_limit_again,
                reset_slotted_admits_the_full_limit_again,
                limits_in_two_buckets_all_or_nothing,
                a_global_bucket_is_shared_by_concurrent_clients,
                refund_gives_back_in_every_bucket,
                leases_held_released_and_expired,
                a_renewed_lease_outlives_its_first_deadline,
                cost_exact_under_concurrency,
                cost_and_requests_all_or_nothing,
                settle_charges_into_debt_and_gives_back,
                a_charge_outlives_its_admissions_slot,
                calendar_exact_under_concurrency,
                calendar_cost_and_log_all_or_nothing,
            ]
        );
    };
}

conformance!(memory, memory);
conformance!(redis, redis_single);
conformance!(redis_sentinel, redis_sentinel);
conformance!(redis_cluster, redis_cluster);
conformance!(deny_cache_redis, deny_cache_redis);
// The deny cache is the same on every Redis deployment; with it, Sentinel would repeat the
// single Redis run at the cost of 15 more five-process Sentinel sets (about 45 s of CI).
conformance!(deny_cache_redis_cluster, deny_cache_redis_cluster);
