//! Coalescing on one Redis: decisions pending at the same instant share one `EVALSHA`
//! (`src/limiter/redis/batch.rs`), and a batch decides exactly what the same decisions sent one
//! by one would. Against a real `redis-server`.
//!
//! The runtime is tokio's current-thread one, so the interleaving is fixed: the first check
//! sends its own call, and every check started while it is in flight queues behind it.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::redis::{wait_ready, RedisServer};
use common::store::{limit, ROUTE};
use slidegate::limiter::redis::RedisStore;
use slidegate::limiter::{Buckets, Limit, Store, StoreError, Verdict};

/// Roomy: this file is about batching, not deadlines, and debug builds on a busy machine are slow.
const TIMEOUT: Duration = Duration::from_secs(2);

/// `calls` of EVALSHA in INFO commandstats.
fn evalsha_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
        .map_or(0, |v| v.parse().unwrap())
}

async fn connected(server: &RedisServer, timeout: Duration) -> Arc<RedisStore> {
    let store = Arc::new(RedisStore::new(&server.redis_target(timeout)).unwrap());
    wait_ready(store.as_ref(), Duration::from_secs(10)).await;
    store
}

/// `n` checks started at once, one bucket each; every outcome with how long it took.
async fn concurrent_checks(
    store: &Arc<RedisStore>,
    n: usize,
    limits: [Limit; 1],
) -> Vec<(Result<Verdict, StoreError>, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let start = std::time::Instant::now();
                let result = store
                    .check(ROUTE, &Buckets::one(&format!("r:c{i}")), &limits)
                    .await;
                (result, start.elapsed())
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    outcomes
}

/// 400 concurrent decisions, checked for exactness; returns the `EVALSHA` calls they took.
async fn four_hundred_concurrent_decisions(server: &RedisServer) -> u64 {
    let store = connected(server, TIMEOUT).await;
    let mut conn = server.connection();
    let before = evalsha_calls(&mut conn);

    // 300 concurrent requests of one client against 100/min and 1000/hour, plus 100 of other
    // clients: exactly 100 of the first kind fit, and every other one does.
    let limits = [
        limit(100, Duration::from_secs(60)),
        limit(1000, Duration::from_secs(3600)),
    ];
    let mut tasks = Vec::new();
    for i in 0..400 {
        let store = store.clone();
        let bucket = if i % 4 == 3 {
            format!("r:other{i}")
        } else {
            "r:hot".to_string()
        };
        tasks.push(tokio::spawn(async move {
            let verdict = store
                .check(ROUTE, &Buckets::one(&bucket), &limits)
                .await
                .expect("check");
            (bucket, verdict)
        }));
    }
    let (mut hot_admitted, mut others_admitted) = (0, 0);
    for task in tasks {
        let (bucket, verdict) = task.await.unwrap();
        match (bucket.as_str(), verdict.admitted) {
            ("r:hot", true) => hot_admitted += 1,
            ("r:hot", false) => {
                assert_eq!(verdict.states[0].remaining, 0, "{verdict:?}");
                assert!(verdict.retry_after().unwrap() <= Duration::from_secs(60));
            }
            (_, true) => others_admitted += 1,
            (_, false) => panic!("{bucket} denied: {verdict:?}"),
        }
    }
    assert_eq!(hot_admitted, 100);
    assert_eq!(others_admitted, 100);
    let hot_key = store.key("r:hot", &limits[0]);
    let len: usize = redis::cmd("LLEN").arg(&hot_key).query(&mut conn).unwrap();
    assert_eq!(len, 100, "one entry per admitted request");

    let calls = evalsha_calls(&mut conn) - before;
    println!("400 decisions in {calls} EVALSHA calls");
    calls
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_decisions_share_calls_and_stay_exact() {
    let server = RedisServer::start();
    let calls = four_hundred_concurrent_decisions(&server).await;
    // Batches of at most 64; once the hot bucket is found full, its queued decisions are
    // answered from that denial. At least the 100 others, the 100 admitted and one denial
    // reach Redis: at least 4 calls, far fewer than 400.
    assert!(
        (4..=40).contains(&calls),
        "{calls} calls for 400 concurrent decisions"
    );
}

/// The same across threads: decisions queue from one worker and are answered from the other
/// (`threads = 2` in the proxy). How many calls they share depends on scheduling; exactness
/// must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_stay_exact_across_threads() {
    let server = RedisServer::start();
    let calls = four_hundred_concurrent_decisions(&server).await;
    assert!(
        (1..=400).contains(&calls),
        "{calls} calls for 400 decisions"
    );
}

/// Five decisions sent at once, one of them on a key Redis cannot run the script on: it fails
/// with its own error, the others in the same call are decided, in order. Whether the five
/// share a call depends on when the store's I/O thread wakes (one call if all queued before it
/// sent the first, two if the first went out alone; up to five when this test's thread lost
/// its core between spawns, as at 8 test threads on 2 cores): so every round is checked and
/// at least one round of five must have shared its calls.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_decision_fails_alone_in_its_batch() {
    let server = RedisServer::start();
    let store = connected(&server, TIMEOUT).await;
    let limits = [limit(5, Duration::from_secs(60))];
    let mut conn = server.connection();
    let mut calls_per_round = Vec::new();
    for round in 0..5 {
        let bucket = |name: &str| format!("r:{name}-{round}");
        // Someone else's string where one client's log should be: WRONGTYPE inside the script.
        let _: () = redis::cmd("SET")
            .arg(store.key(&bucket("broken"), &limits[0]))
            .arg("x")
            .query(&mut conn)
            .unwrap();
        let before = evalsha_calls(&mut conn);
        let mut tasks = Vec::new();
        for name in ["first", "a", "broken", "b", "a"] {
            let (store, bucket) = (store.clone(), bucket(name));
            tasks.push(tokio::spawn(async move {
                let result = store.check(ROUTE, &Buckets::one(&bucket), &limits).await;
                (name, result)
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        calls_per_round.push(evalsha_calls(&mut conn) - before);
        for (name, result) in &results {
            match *name {
                "broken" => match result {
                    Err(StoreError::Backend(msg)) => assert!(msg.contains("WRONGTYPE"), "{msg}"),
                    other => panic!("round {round}: r:broken: {other:?}"),
                },
                _ => assert!(
                    result.as_ref().unwrap().admitted,
                    "round {round}: {name}: {result:?}"
                ),
            }
        }
        // The second `r:a` saw the first one's entry: decisions in a batch run in order.
        let a: Vec<u32> = results
            .iter()
            .filter(|(name, _)| *name == "a")
            .map(|(_, r)| r.as_ref().unwrap().states[0].remaining)
            .collect();
        assert_eq!(a, [4, 3], "round {round}");
        assert!(store.is_ready(), "an error reply is not an outage");
        if calls_per_round[round] <= 2 {
            return;
        }
    }
    panic!("the five decisions never shared their calls: {calls_per_round:?} calls per round");
}

#[tokio::test(flavor = "current_thread")]
async fn queued_decisions_fail_fast_when_redis_is_gone() {
    let mut server = RedisServer::start();
    let store = connected(&server, TIMEOUT).await;
    let limits = [limit(5, Duration::from_secs(60))];
    server.kill();

    for (result, took) in concurrent_checks(&store, 20, limits).await {
        assert!(
            matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "{result:?}"
        );
        assert!(
            took <= TIMEOUT + Duration::from_millis(500),
            "took {took:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn queued_decisions_answer_by_their_deadline_when_redis_freezes() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let store = connected(&server, timeout).await;
    let limits = [limit(5, Duration::from_secs(60))];
    server.freeze();

    // The first check's own call hangs; the 19 behind it queue, then go out as one call that
    // hangs too. Every one must be answered `Timeout` within its deadline, not twice that
    // (a second full timeout for the queued batch would take 400 ms).
    let mut worst = Duration::ZERO;
    for (result, took) in concurrent_checks(&store, 20, limits).await {
        assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
        worst = worst.max(took);
    }
    server.thaw();
    println!("slowest answer with Redis frozen: {worst:?} (timeout {timeout:?})");
    assert!(
        worst <= timeout + Duration::from_millis(100),
        "slowest answer {worst:?} for a {timeout:?} timeout"
    );
}
