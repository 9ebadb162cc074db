//! The folds on a frozen Redis (bounded, counted, never a request's wait) and on a Redis
//! Cluster (one slot per route).

use super::*;

/// Redis frozen: requests are decided locally (`on_error = "local"`) at once, the folds fail,
/// each counted and logged, and `/api/v1/top` answers 503 promptly; thawed, both come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_costs_the_folds_never_a_request() {
    let (up, ca, redis) = (Upstream::start(), TestCa::new("ca"), RedisServer::start());
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"100ms\"\non_error = \"local\"",
        redis.url()
    );
    let (proxy, _log) = proxy(&up, &ca, &store, dir.path(), 0);
    let folds =
        |result: &str| proxy.counter(&format!("slidegate_top_folds_total{{result=\"{result}\"}}"));
    let calls: Vec<_> = (PROTOCOLS.iter())
        .flat_map(|p| std::iter::repeat_n((0, *p, "noisy"), 3))
        .collect();
    send(&[&proxy], &ca, &calls).await;
    let waited = common::control::poll_until(Duration::from_secs(10), || folds("ok") >= 1);
    assert!(waited.is_some(), "a fold within 10 s");

    redis.freeze();
    let started = Instant::now();
    let sent = send(&[&proxy], &ca, &calls).await;
    let took = started.elapsed();
    assert!(
        sent.iter().all(|s| matches!(s.seen.status, 200 | 429)),
        "decided locally"
    );
    assert!(took < Duration::from_secs(3), "9 requests took {took:?}");
    let failed = common::control::poll_until(Duration::from_secs(10), || folds("failed") >= 1);
    assert!(failed.is_some(), "a failed fold counted within 10 s");
    let started = Instant::now();
    let (status, body) = top(&proxy, "route=api", &[]).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        proxy.log().contains("top limited clients: "),
        "a WARN line names the failed folds"
    );

    redis.thaw();
    let ok_before = folds("ok");
    send(&[&proxy], &ca, &calls).await;
    let back = common::control::poll_until(Duration::from_secs(15), || folds("ok") > ok_before);
    assert!(back.is_some(), "folds again once Redis answers");
    let (status, body) = top(&proxy, "route=api", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["clients"][0]["key"], "noisy", "{body}");
}

/// On a Redis Cluster a route's top keys share one slot (`{<route>}`): two proxies fold, either
/// answers for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_answers_for_both_proxies() {
    let (up, ca, cluster) = (
        Upstream::start(),
        TestCa::new("ca"),
        common::redis::shared_cluster(),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = format!("{}\ntimeout = \"2s\"", cluster.own_store());
    let (a, _) = proxy(&up, &ca, &store, dir.path(), 0);
    let (b, _) = proxy(&up, &ca, &store, dir.path(), 1);
    let calls: Vec<_> = (0..2)
        .flat_map(|p| PROTOCOLS.map(|protocol| (p, protocol)))
        .flat_map(|(p, protocol)| std::iter::repeat_n((p, protocol, "noisy"), 3))
        .collect();
    let sent = send(&[&a, &b], &ca, &calls).await;
    let denied = sent.iter().filter(|s| s.seen.status == 429).count() as u64;
    assert_eq!(denied, 13, "18 sent, 5 admitted");
    for proxy in [&a, &b] {
        let started = Instant::now();
        loop {
            // Two minutes: a burst folded just before a minute's turn is in the minute before
            // it, which `minutes=1` (this minute only) no longer reads (one run under load read
            // `"clients":[]` for 10 s).
            let (status, body) = top(proxy, "route=api&minutes=2", &[]).await;
            assert_eq!(status, 200, "{body}");
            if body["clients"][0]["denied"] == denied {
                assert_eq!(body["clients"][0]["key"], "noisy", "{body}");
                assert_eq!(body["clients"][0]["allowed"].as_u64().unwrap(), 5, "{body}");
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A fold of more clients than a minute keeps: each set keeps its highest scores
/// (`KEEP_PER_MINUTE`), the read sums the minutes asked and names the refusing limits.
#[tokio::test]
async fn a_minute_keeps_its_most_denied_whatever_the_fleet_folds() {
    use slidegate::limiter::redis::RedisStore;
    use slidegate::limiter::top::{TopCount, TopFold, TopQuery, KEEP_PER_MINUTE};
    use slidegate::limiter::Store;
    let redis = RedisServer::start();
    let store = RedisStore::new(&redis.redis_target(Duration::from_secs(2))).unwrap();
    common::redis::wait_ready(&store, Duration::from_secs(10)).await;
    let limits = std::sync::Arc::new(vec!["api-10s".to_string(), "api-10s-global".to_string()]);
    let extra = 200u64;
    let counts: Vec<TopCount> = (0..KEEP_PER_MINUTE as u64 + extra)
        .map(|i| TopCount {
            bucket: format!("api:h.x-api-key:c{i}"),
            denied: i + 1,
            allowed: 1,
            refused: 1 << (i % 2),
        })
        .collect();
    for minute in [100, 101] {
        let fold = TopFold {
            route: "api".into(),
            minute,
            limits: limits.clone(),
            counts: counts.clone(),
        };
        store.fold_top(vec![fold]).await.unwrap();
    }
    let mut conn = redis.connection();
    let card: u64 = ::redis::cmd("ZCARD")
        .arg("sgtest:top:{api}:100:d")
        .query(&mut conn)
        .unwrap();
    assert_eq!(card, KEEP_PER_MINUTE as u64);
    let ttl: i64 = ::redis::cmd("TTL")
        .arg("sgtest:top:{api}:100:l:api-10s")
        .query(&mut conn)
        .unwrap();
    assert!((900..=960).contains(&ttl), "{ttl}");
    let query = TopQuery {
        route: "api".into(),
        minutes: vec![100, 101],
        limits: limits.to_vec(),
        max: 50,
    };
    let top = store.read_top(query).await.unwrap();
    assert_eq!(top.len(), 50);
    let last = KEEP_PER_MINUTE as u64 + extra - 1;
    assert_eq!(top[0].bucket, format!("api:h.x-api-key:c{last}"));
    assert_eq!((top[0].denied, top[0].allowed), (2 * (last + 1), 2));
    assert_eq!(top[0].refused, 1 << (last % 2));
    assert!(top.windows(2).all(|w| w[0].denied > w[1].denied));
}
