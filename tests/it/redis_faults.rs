//! Store-level fault tests: `RedisStore` against a Redis that is killed, frozen (SIGSTOP),
//! restarted empty, absent at startup, or answering errors. The store must answer within its
//! timeout (never the client library's multi-second reconnect backoff), report readiness
//! truthfully, and recover through `maintain()` without being recreated.

use crate::common;

use std::time::{Duration, Instant};

use common::redis::{wait_ready, RedisCluster, RedisServer};
use common::store::ROUTE;
use slidegate::limiter::redis::RedisStore;
use slidegate::limiter::{Buckets, Limit, Store, StoreError, Verdict};

/// The proxy's default `store.timeout`.
const TIMEOUT: Duration = Duration::from_millis(50);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(250);

const LIMITS: [Limit; 1] = [Limit::log(10, Duration::from_secs(60))];

/// One check wrapped the way the proxy wraps it; returns the outcome and how long it took.
/// `Err(None)` means the outer timeout fired (the store itself did not answer).
async fn bounded_check(
    store: &RedisStore,
    bucket: &str,
) -> (Result<Verdict, Option<StoreError>>, Duration) {
    bounded_check_within(store, bucket, TIMEOUT).await
}

/// [`bounded_check`] with another timeout (the store's own must match).
async fn bounded_check_within(
    store: &RedisStore,
    bucket: &str,
    timeout: Duration,
) -> (Result<Verdict, Option<StoreError>>, Duration) {
    let start = Instant::now();
    let result =
        match tokio::time::timeout(timeout, store.check(ROUTE, &Buckets::one(bucket), &LIMITS))
            .await
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Some(e)),
            Err(_) => Err(None),
        };
    (result, start.elapsed())
}

/// `maintain()` must come back promptly whatever Redis does.
async fn timed_maintain(store: &RedisStore) -> Duration {
    let start = Instant::now();
    store.maintain().await;
    let took = start.elapsed();
    assert!(took < Duration::from_millis(1500), "maintain took {took:?}");
    took
}

async fn connected_store(server: &RedisServer) -> RedisStore {
    let store = RedisStore::new(&server.redis_target(TIMEOUT)).unwrap();
    wait_ready(&store, Duration::from_secs(10)).await;
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_within_timeout_and_reports_not_ready() {
    let mut server = RedisServer::start();
    let store = connected_store(&server).await;
    assert!(
        store
            .check(ROUTE, &Buckets::one("kill:c"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );

    server.kill();
    for i in 0..30 {
        let (result, took) = bounded_check(&store, "kill:c").await;
        assert!(result.is_err(), "check {i} succeeded against a dead Redis");
        assert!(took <= TIMEOUT + SLACK, "check {i} took {took:?}");
        if i % 10 == 9 {
            timed_maintain(&store).await;
            assert!(!store.is_ready());
        }
    }
    // Once the outage is known, checks do not even wait for the timeout.
    let (result, took) = bounded_check(&store, "kill:c").await;
    assert!(
        matches!(result, Err(Some(StoreError::Unavailable(_)))),
        "{result:?}"
    );
    assert!(took < TIMEOUT, "fail-fast check took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_times_out_then_fails_fast_then_recovers() {
    let server = RedisServer::start();
    let store = connected_store(&server).await;
    assert!(
        store
            .check(ROUTE, &Buckets::one("freeze:c"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );

    server.freeze();
    for i in 0..10 {
        let (result, took) = bounded_check(&store, "freeze:c").await;
        assert!(
            result.is_err(),
            "check {i} succeeded against a frozen Redis"
        );
        assert!(took <= TIMEOUT + SLACK, "check {i} took {took:?}");
    }
    // After a few timeouts in a row the store stops sending and fails at once.
    let (result, took) = bounded_check(&store, "freeze:c").await;
    assert!(
        matches!(result, Err(Some(StoreError::Unavailable(_)))),
        "{result:?}"
    );
    assert!(took < TIMEOUT, "fail-fast check took {took:?}");
    timed_maintain(&store).await;
    assert!(!store.is_ready());

    server.thaw();
    wait_ready(&store, Duration::from_secs(10)).await;
    let (result, _) = bounded_check(&store, "freeze:c").await;
    assert!(result.unwrap().admitted);
}

/// With the deny cache on (the proxy's default), a bucket Redis said was full stays denied
/// while a frozen Redis makes calls fail fast, and for no longer than Redis said; any other
/// bucket gets the store's error (the route's `on_error` decides it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_denial_still_answers_while_calls_fail_fast() {
    const ONE: [Limit; 1] = [Limit::log(1, Duration::from_secs(2))];
    let server = RedisServer::start();
    let store = connected_store(&server)
        .await
        .with_deny_cache(Duration::from_secs(60));
    let check = |bucket: &'static str| {
        let store = &store;
        async move { store.check(ROUTE, &Buckets::one(bucket), &ONE).await }
    };
    assert!(check("full:c").await.unwrap().admitted);
    let denied = check("full:c").await.unwrap();
    assert!(!denied.admitted);
    let learned = Instant::now();

    server.freeze();
    // Calls of other buckets run out their deadline (or fail with the call they queued behind)
    // until a few timeouts in a row close the gate: then the store fails fast, `Unavailable`.
    let mut failing_fast = false;
    for _ in 0..20 {
        match bounded_check(&store, "other:c").await.0 {
            Ok(_) => panic!("a frozen Redis admitted"),
            Err(Some(StoreError::Unavailable(_))) => {
                failing_fast = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(failing_fast, "never failed fast");
    assert!(
        matches!(check("other:c").await, Err(StoreError::Unavailable(_))),
        "another bucket: the store's error"
    );
    let cached = check("full:c").await.expect("the known denial answers");
    assert!(!cached.admitted);
    assert!(cached.states[0].reset <= denied.states[0].reset);
    // Past what Redis said, the memory answers no more: the store's error again.
    let deadline = denied.retry_after().unwrap();
    tokio::time::sleep(deadline.saturating_sub(learned.elapsed()) + Duration::from_millis(20))
        .await;
    assert!(
        matches!(check("full:c").await, Err(StoreError::Unavailable(_))),
        "a denial outlived its deadline"
    );
    server.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_same_port_recovers_through_maintain() {
    let mut server = RedisServer::start();
    let store = connected_store(&server).await;
    let first = store
        .check(ROUTE, &Buckets::one("restart:c"), &LIMITS)
        .await
        .unwrap();
    assert_eq!(first.states[0].remaining, 9);

    server.restart();
    // Drive maintain like the proxy's 1 s task would, never recreating the store.
    let mut maintains = 0;
    let verdict = loop {
        let (result, took) = bounded_check(&store, "restart:c").await;
        assert!(took <= TIMEOUT + SLACK, "check took {took:?}");
        if let Ok(v) = result {
            break v;
        }
        assert!(
            maintains < 10,
            "no recovery after {maintains} maintains: {result:?}"
        );
        timed_maintain(&store).await;
        maintains += 1;
    };
    // The first check finds the old connection dead; the next maintain reconnects.
    assert!(
        maintains <= 2,
        "took {maintains} maintain() calls to recover"
    );
    assert!(store.is_ready());
    // The new Redis is empty: this is the bucket's first entry again.
    assert!(verdict.admitted);
    assert_eq!(verdict.states[0].remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_started_before_redis_connects_once_it_is_up() {
    let mut server = RedisServer::start();
    server.kill();
    let store = RedisStore::new(&server.redis_target(TIMEOUT)).unwrap();
    assert!(!store.is_ready());

    // Nothing listens: maintain fails quickly, check fails at once.
    timed_maintain(&store).await;
    assert!(!store.is_ready());
    let (result, took) = bounded_check(&store, "late:c").await;
    assert!(
        matches!(result, Err(Some(StoreError::Unavailable(_)))),
        "{result:?}"
    );
    assert!(took < TIMEOUT, "check took {took:?}");

    server.restart();
    wait_ready(&store, Duration::from_secs(10)).await;
    assert!(
        store
            .check(ROUTE, &Buckets::one("late:c"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_before_first_maintain_is_unavailable() {
    let server = RedisServer::start();
    let store = RedisStore::new(&server.redis_target(TIMEOUT)).unwrap();
    let (result, _) = bounded_check(&store, "early:c").await;
    assert!(
        matches!(result, Err(Some(StoreError::Unavailable(_)))),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_error_reply_is_a_backend_error_and_keeps_the_store_ready() {
    let server = RedisServer::start();
    let store = connected_store(&server).await;
    // Someone else's string value where a limit log should be: WRONGTYPE from the script.
    let mut conn = server.connection();
    let key = store.key("wrongtype:c", &LIMITS[0]);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("x")
        .query(&mut conn)
        .unwrap();

    let result = store
        .check(ROUTE, &Buckets::one("wrongtype:c"), &LIMITS)
        .await;
    assert!(matches!(result, Err(StoreError::Backend(_))), "{result:?}");
    assert!(store.is_ready());
    assert!(
        store
            .check(ROUTE, &Buckets::one("other:c"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_a_dead_master_keeps_serving_the_other_shards() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3))
        .await
        .unwrap();
    // A roomier timeout than the proxy's default: this test is about shard isolation, and a
    // live shard must not miss 50 ms just because the test machine is busy.
    let timeout = Duration::from_millis(150);
    let store = RedisStore::new(&cluster.redis_target(timeout)).unwrap();
    wait_ready(&store, Duration::from_secs(20)).await;
    let buckets: Vec<String> = (0..24).map(|i| format!("cluster:c{i}")).collect();
    for b in &buckets {
        assert!(
            store
                .check(ROUTE, &Buckets::one(b), &LIMITS)
                .await
                .unwrap()
                .admitted
        );
    }
    // Which buckets live on node 0? It answers MOVED for keys it does not own.
    let mut node0 = cluster.nodes()[0].connection();
    let on_node0: Vec<bool> = buckets
        .iter()
        .map(|b| {
            redis::cmd("EXISTS")
                .arg(store.key(b, &LIMITS[0]))
                .query::<i64>(&mut node0)
                .is_ok()
        })
        .collect();
    let lost = on_node0.iter().filter(|x| **x).count();
    assert!(
        lost > 0 && lost < buckets.len(),
        "{lost} of {} buckets on node 0",
        buckets.len()
    );

    cluster.nodes_mut()[0].kill();
    // Well within cluster-node-timeout (5 s): the other masters still serve their slots.
    for round in 0..3 {
        for (b, dead) in buckets.iter().zip(&on_node0) {
            let (result, took) = bounded_check_within(&store, b, timeout).await;
            assert!(
                took <= timeout + SLACK,
                "round {round}, {b}: check took {took:?}"
            );
            if *dead {
                assert!(
                    result.is_err(),
                    "round {round}, {b}: answered by a dead node"
                );
            } else {
                let v = result.unwrap_or_else(|e| panic!("round {round}, {b} (live shard): {e:?}"));
                assert_eq!(v.states[0].remaining, 8 - round);
            }
        }
        timed_maintain(&store).await;
        assert!(
            store.is_ready(),
            "one dead master made the whole cluster store unready"
        );
    }
}
