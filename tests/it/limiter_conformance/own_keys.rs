//! The cases of limits with keys of their own (`limits[].key`): one decision over limits in
//! different buckets is all-or-nothing on every store, a shared (`global`) bucket counts every
//! client exactly, and a refund gives back every limit in its own bucket.

use std::sync::Arc;
use std::time::Duration;

use crate::common::store::{inspect, limit, ROUTE};
use futures::future::join_all;
use slidegate::limiter::{Admission, Buckets, Limit, Store, Verdict};

const WINDOW: Duration = Duration::from_secs(60);

/// Every limit counts in its own bucket: limit 0 in `client`'s, limit 1 in `global`.
async fn decide(
    store: &Arc<dyn Store>,
    client: &str,
    global: &[String],
    limits: &[Limit],
) -> Verdict {
    let buckets = Buckets::stacked(client, global, &[0, 1]);
    let verdict = store.check(ROUTE, &buckets, limits).await;
    verdict.unwrap_or_else(|e| panic!("{} check failed: {e}", store.backend()))
}

/// Per-client 3 + a shared 4: a client's fourth request is denied by its own limit and takes
/// nothing of the shared one; another client's request denied by the shared limit takes
/// nothing of its own. Inspected afterwards, each bucket holds only admissions.
pub async fn limits_in_two_buckets_all_or_nothing(store: Arc<dyn Store>) {
    let limits = [limit(3, WINDOW), limit(4, WINDOW)];
    let global = vec!["own2:global".to_string()];
    for _ in 0..3 {
        assert!(decide(&store, "own2:ip:a", &global, &limits).await.admitted);
    }
    let a = decide(&store, "own2:ip:a", &global, &limits).await;
    assert!(!a.admitted);
    assert_eq!(a.violated().collect::<Vec<_>>(), [0], "{a:?}");
    assert!(decide(&store, "own2:ip:b", &global, &limits).await.admitted);
    let b = decide(&store, "own2:ip:b", &global, &limits).await;
    assert!(!b.admitted);
    assert_eq!(b.violated().collect::<Vec<_>>(), [1], "{b:?}");
    assert_eq!(
        b.states[0].remaining, 2,
        "b's own limit: one admission, {b:?}"
    );
    let counts = |views: Vec<slidegate::limiter::LimitView>| views[0].count;
    assert_eq!(
        counts(inspect(&store, "own2:global", &limits[1..]).await),
        4
    );
    assert_eq!(counts(inspect(&store, "own2:ip:a", &limits[..1]).await), 3);
    assert_eq!(counts(inspect(&store, "own2:ip:b", &limits[..1]).await), 1);
}

/// Three clients, eight concurrent requests each, per-client 5 + a shared 8: exactly 8
/// admitted in all, at most 5 per client, and the buckets hold exactly the admissions.
pub async fn a_global_bucket_is_shared_by_concurrent_clients(store: Arc<dyn Store>) {
    let limits = [limit(5, WINDOW), limit(8, WINDOW)];
    let global = vec!["shared:global".to_string()];
    let clients = ["shared:ip:a", "shared:ip:b", "shared:ip:c"];
    let calls = (0..8).flat_map(|_| clients).map(|client| {
        let (store, global) = (store.clone(), global.clone());
        tokio::spawn(async move {
            let v = decide(&store, client, &global, &limits).await;
            (client, v.admitted)
        })
    });
    let results: Vec<(&str, bool)> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let admitted = |c: &str| results.iter().filter(|(x, a)| *a && *x == c).count();
    let total: usize = clients.iter().map(|c| admitted(c)).sum();
    assert_eq!(total, 8, "{results:?}");
    for c in clients {
        assert!(admitted(c) <= 5, "{c}: {}", admitted(c));
        let held = inspect(&store, c, &limits[..1]).await[0].count;
        assert_eq!(held, admitted(c) as u64, "{c} holds only its admissions");
    }
    assert_eq!(
        inspect(&store, "shared:global", &limits[1..]).await[0].count,
        8
    );
}

/// A refund of an admission over two buckets gives back both entries.
pub async fn refund_gives_back_in_every_bucket(store: Arc<dyn Store>) {
    let limits = [limit(1, WINDOW), limit(1, WINDOW)];
    let global = vec!["back:global".to_string()];
    let v = decide(&store, "back:ip:a", &global, &limits).await;
    let times = v
        .recorded_times()
        .expect("an admission has its times")
        .to_vec();
    assert!(!decide(&store, "back:ip:a", &global, &limits).await.admitted);
    let buckets = Buckets::stacked("back:ip:a", &global, &[0, 1]);
    store
        .refund(Admission::new(ROUTE, &buckets, &limits, &times))
        .await
        .expect("refund");
    assert_eq!(inspect(&store, "back:ip:a", &limits[..1]).await[0].count, 0);
    assert_eq!(
        inspect(&store, "back:global", &limits[1..]).await[0].count,
        0
    );
    assert!(decide(&store, "back:ip:b", &global, &limits).await.admitted);
}
