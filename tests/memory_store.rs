//! The memory store stays bounded: buckets whose logs have all slid out of their windows are
//! swept away, both by a direct `sweep()` and by `Store::sweep_expired()` (what the proxy's
//! once-a-second background task calls).

use std::time::{Duration, Instant};

use slidegate::limiter::memory::MemoryStore;
use slidegate::limiter::{Limit, Store};

const KEYS: usize = 100_000;

fn limit(requests: u32, window: Duration) -> [Limit; 1] {
    [Limit { requests, window }]
}

/// Admit one request for each of `keys`, asserting each is admitted.
async fn fill(store: &MemoryStore, prefix: &str, keys: usize, limits: &[Limit]) {
    let mut key = String::new();
    for i in 0..keys {
        key.clear();
        key.push_str(prefix);
        key.push_str(&i.to_string());
        let v = store
            .check(&key, limits)
            .await
            .expect("memory store decides");
        assert!(v.admitted, "{key} denied on its first request");
    }
}

#[tokio::test]
async fn hundred_thousand_one_off_clients_are_swept() {
    let store = MemoryStore::new();
    // Short, yet long enough that filling (~0.2 s in a debug build) fits well inside it.
    let window = Duration::from_secs(1);
    let started = Instant::now();
    fill(&store, "route:ip:", KEYS, &limit(5, window)).await;
    let filled_in = started.elapsed();
    assert_eq!(store.len(), KEYS);
    assert_eq!(store.entries(), KEYS);

    // Nothing has expired yet (unless a very loaded machine took longer than the window to
    // fill): a sweep now must keep what is still inside its window.
    let live_sweep_checked = filled_in < window / 2;
    if live_sweep_checked {
        store.sweep();
        assert_eq!(store.len(), KEYS, "sweep dropped live buckets");
    }

    tokio::time::sleep(window + Duration::from_millis(50)).await;
    store.sweep();
    assert_eq!(store.len(), 0, "expired buckets survived the sweep");
    assert_eq!(store.entries(), 0);
    assert!(store.is_empty());
    println!(
        "filled {KEYS} keys in {filled_in:?} (live sweep checked: {live_sweep_checked}); \
         all swept after the window"
    );
}

#[tokio::test]
async fn maintain_sweeps_expired_buckets_and_keeps_live_ones() {
    let store = MemoryStore::new();
    let short = Duration::from_millis(200);
    let long = Duration::from_secs(60);
    fill(&store, "short:", KEYS, &limit(3, short)).await;
    fill(&store, "long:", 10, &limit(3, long)).await;
    // One bucket with both a short and a long limit: after the sweep only its long log stays.
    let stacked = [
        Limit {
            requests: 2,
            window: short,
        },
        Limit {
            requests: 2,
            window: long,
        },
    ];
    assert!(store.check("both", &stacked).await.unwrap().admitted);
    assert_eq!(store.len(), KEYS + 11);
    assert_eq!(store.entries(), KEYS + 10 + 2);

    tokio::time::sleep(short + Duration::from_millis(50)).await;
    // The background path: the proxy's sweeper calls `sweep_expired()` about once a second.
    store.sweep_expired();
    assert_eq!(
        store.len(),
        11,
        "expected only the long-window buckets to remain"
    );
    assert_eq!(store.entries(), 10 + 1);

    // The kept state is still enforced: the long limit of "both" has one slot left.
    let v = store.check("both", &stacked).await.unwrap();
    assert!(v.admitted);
    assert_eq!(v.states[1].remaining, 0);
    assert!(!store.check("both", &stacked).await.unwrap().admitted);
    // And a swept key starts from scratch.
    let v = store.check("short:0", &limit(3, short)).await.unwrap();
    assert!(v.admitted);
    assert_eq!(v.states[0].remaining, 2);
}
