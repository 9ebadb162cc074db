//! The store over its arenas: shares, isolation between routes, the bound under floods.

use super::summary::Summary;
use super::*;
use std::time::Duration;

fn one(requests: u32, ms: u64) -> [Limit; 1] {
    [Limit::log(requests, Duration::from_millis(ms))]
}

/// Each of `keys` made-up clients of `route` sends exactly its quota of 2.
fn rotate_keys(store: &MemoryStore, route: &str, keys: usize, limits: &[Limit]) {
    for i in 0..keys {
        let k = format!("{route}:h:made-up-{i}");
        store.check_now_in(route, &k, limits);
        store.check_now_in(route, &k, limits);
    }
}

/// Issue 32 replaces "never evict a client at its limit" with "evict anyone into the summary":
/// clients at their limit may now go, but none gets a fresh quota.
#[test]
fn full_store_evicts_yet_no_client_at_its_limit_gets_a_fresh_quota() {
    // 1 MiB: 16 KiB per shard, about 100 buckets each.
    let store = MemoryStore::with_max_memory(1 << 20);
    let limits = one(2, 60_000);
    // 500 clients at their limit (2 of 2).
    for i in 0..500 {
        let k = format!("full-{i}");
        assert!(store.check_now(&k, &limits).unwrap().admitted);
        assert!(store.check_now(&k, &limits).unwrap().admitted);
    }
    // A flood of made-up keys at their limit too (a lighter bucket is evicted first, and
    // these must compete): they evict each other and the idle clients.
    for i in 0..50_000 {
        let k = format!("junk-{i}");
        store.check_now(&k, &limits).unwrap();
        store.check_now(&k, &limits).unwrap();
    }
    assert!(store.accounted_bytes() + store.summary_bytes() <= 1 << 20);
    assert!(store.evictions() > 45_000, "{}", store.evictions());
    // Every client at its limit, held or evicted, is still denied.
    for i in 0..500 {
        let v = store.check_now(&format!("full-{i}"), &limits).unwrap();
        assert!(!v.admitted, "full-{i} was evicted and got a fresh quota");
    }
    assert_eq!(store.overflows(UNROUTED), 0);
}

#[test]
fn shares_are_equal_and_a_route_first_seen_later_shrinks_them() {
    let store = MemoryStore::with_max_memory(1 << 20).with_routes(["a", "b"]);
    let budgets = |s: &MemoryStore| {
        let mut v: Vec<_> = s
            .arenas
            .load()
            .iter()
            .map(|(n, r)| (n.to_string(), r.budget()))
            .collect();
        v.sort();
        v
    };
    // Each share less its summaries (half).
    let half = (1 << 20) / 2 / SHARDS / 2 * SHARDS;
    assert_eq!(budgets(&store), [("a".into(), half), ("b".into(), half)]);
    store.check_now_in("c", "c:ip:1", &one(1, 1000));
    // A third, less its summaries: a power of two of cells, at most half of it.
    let third = (1 << 20) / 3 / SHARDS;
    let third = (third - Summary::sized_for(third).bytes()) * SHARDS;
    assert!(
        budgets(&store).iter().all(|(_, b)| *b == third),
        "{:?}",
        budgets(&store)
    );
    assert_eq!(share(1000, 0), 1000);
}

#[test]
fn a_flood_on_one_route_leaves_another_routes_arena_and_is_still_limited() {
    let store = MemoryStore::with_max_memory(1 << 20).with_routes(["keys", "login"]);
    let hour = one(2, 3_600_000);
    // 20k made-up keys at their quota: far more than the half MiB arena holds.
    rotate_keys(&store, "keys", 20_000, &hour);
    let evicted = store.evictions();
    assert!(evicted > 10_000, "{evicted} evictions");
    assert_eq!(
        store.overflows("keys"),
        0,
        "every key had a bucket of its own"
    );
    assert!(store.accounted_bytes() + store.summary_bytes() <= 1 << 20);
    // Another route: every fresh client gets exactly its limit, in its own bucket.
    for i in 0..500 {
        let k = format!("login:ip:10.0.0.{i}");
        assert!(store.check_now_in("login", &k, &hour).admitted);
        assert!(store.check_now_in("login", &k, &hour).admitted);
        assert!(!store.check_now_in("login", &k, &hour).admitted, "{k}");
    }
    assert_eq!(store.overflows("login"), 0);
    // The flooded route: every flood key, held or evicted, is still at its limit, and a
    // fresh key gets at most its limit (less where its summary cells collide with the flood's).
    let again = (0..20_000)
        .filter(|i| {
            let k = format!("keys:h:made-up-{i}");
            store.check_now_in("keys", &k, &hour).admitted
        })
        .count();
    assert_eq!(again, 0, "flood keys admitted again");
    let mut admitted = 0;
    for i in 0..100 {
        let k = format!("keys:h:fresh-{i}");
        let got = (0..3)
            .filter(|_| store.check_now_in("keys", &k, &hour).admitted)
            .count();
        assert!(got <= 2, "{k}: {got} admitted");
        admitted += got;
    }
    println!(
        "{evicted} evictions; 100 fresh keys on the flooded route: {admitted} of 200 admitted"
    );
}

/// Accounted bytes of one client that sent `n` requests in one burst against `limits`.
fn bytes_of_one_client(limits: &[Limit], n: usize) -> usize {
    let store = MemoryStore::new();
    for _ in 0..n {
        store.check_now("one", limits).unwrap();
    }
    store.accounted_bytes()
}

#[test]
fn a_slotted_limit_keeps_a_client_at_full_rate_in_a_few_dozen_bytes() {
    let second = Duration::from_secs(1);
    let log = bytes_of_one_client(&[Limit::log(10_000, second)], 10_000);
    let slotted = Limit::slotted(10_000, second, Duration::from_millis(100));
    let slots = bytes_of_one_client(&[slotted], 10_000);
    // The log: 10,000 timestamps (a VecDeque of 16,384 u64); the counters: 11 u32 (48 bytes).
    assert_eq!(log, BUCKET_COST + 16_384 * 8);
    assert_eq!(slots, BUCKET_COST + 48);
    // And the burst was decided as the log decides it: 10,000 admitted, the next refused.
    let store = MemoryStore::new();
    let admitted = (0..10_001)
        .filter(|_| store.check_now("one", &[slotted]).unwrap().admitted)
        .count();
    assert_eq!(admitted, 10_000);
}

#[test]
fn a_route_mixing_log_and_slotted_limits_records_in_all_or_none() {
    let store = MemoryStore::new();
    let limits = [
        Limit::log(3, Duration::from_secs(60)),
        Limit::slotted(2, Duration::from_secs(60), Duration::from_secs(1)),
    ];
    let got: Vec<_> = (0..4)
        .map(|_| {
            let v = store.check_now("mix", &limits).unwrap();
            (v.admitted, v.states[0].remaining, v.states[1].remaining)
        })
        .collect();
    // The slotted limit fills first; the log then records nothing more (all or none).
    assert_eq!(
        got,
        [(true, 2, 1), (true, 1, 0), (false, 1, 0), (false, 1, 0)]
    );
    assert_eq!(store.entries(), 4);
}

/// Of `fresh` new clients of `route`, each sending `requests` at once after the flood, how
/// many requests were admitted.
fn fresh_admitted(store: &MemoryStore, route: &str, fresh: usize, limits: &[Limit]) -> usize {
    (0..fresh)
        .map(|i| {
            let k = format!("{route}:h:honest-{i}");
            (0..limits[0].requests)
                .filter(|_| store.check_now_in(route, &k, limits).admitted)
                .count()
        })
        .sum()
}

/// What colliding in the summary costs honest new clients, measured (docs/hardening.md):
/// after key-rotation floods of growing size (each made-up key sends its whole quota of 10,
/// the worst case; or one request), 1,000 new clients each send 10 at once. The filter of
/// evicted keys keeps new clients out of the cells: even a flood of 200,000 keys through a
/// 1 MB store leaves them at least 90 % of their quota (before it: 8.5 % after 64,000 keys
/// at their quota, 54 % after 200,000 one-request keys).
#[test]
fn collisions_over_count_new_clients_in_proportion_to_the_flood() {
    let limits = one(10, 60_000);
    let mut figures = Vec::new();
    for (per_key, keys) in [
        (10, 4_000),
        (10, 8_000),
        (10, 16_000),
        (10, 64_000),
        (1, 64_000),
        (1, 200_000),
    ] {
        let store = MemoryStore::with_max_memory(1 << 20).with_routes(["api"]);
        for i in 0..keys {
            let k = format!("api:h:made-up-{i}");
            for _ in 0..per_key {
                store.check_now_in("api", &k, &limits);
            }
        }
        let got = fresh_admitted(&store, "api", 1000, &limits);
        assert!(store.accounted_bytes() + store.summary_bytes() <= 1 << 20);
        figures.push((per_key, keys, store.evictions(), got));
    }
    for (per_key, keys, evicted, got) in &figures {
        println!(
            "flood of {keys} keys x {per_key}: {evicted} evicted; 1,000 new clients got \
             {got} of 10,000"
        );
        assert!(*got >= 9_000, "after {keys} x {per_key}: {got} of 10,000");
    }
}

#[test]
fn a_client_of_one_limit_costs_at_most_a_hundred_bytes_of_bucket_and_index() {
    // What every tracked client costs before its entries (docs/hardening.md): the bucket
    // (key, newest activity, one limit's record inline; 88 bytes before smallvec's `union`)
    // and its index entry at the lowest load factor (28 bytes more before the index held
    // positions only).
    assert!(
        std::mem::size_of::<shard::Bucket>() <= 80,
        "{}",
        std::mem::size_of::<shard::Bucket>()
    );
    const { assert!(BUCKET_COST <= 92) };
    // One entry: its allocation (one u64, in a 16-byte class) on top.
    assert_eq!(bytes_of_one_client(&one(10, 60_000), 1), BUCKET_COST + 16);
}

/// Issue 32 row 6 in numbers: a route's arena (1 MB shared by 4 routes) filled with made-up
/// keys at their quota of 10, then one-request keys rotating while new clients send one
/// request a "second" (2,000 rotating keys between two of theirs, so each new client is idle
/// longer than any of them). A new client is refused only where all four of its cells hold a
/// quota key's count. When eviction took the bucket idle longest whatever it counted, a new
/// client went at its first request, and 17 and 31 of 800 were short of their quota in two
/// runs (most got 1 of 10); now a one-request bucket goes first and one that came back
/// stays: 2-9 of 800 in four runs.
#[test]
fn a_one_request_rotation_flood_evicts_its_own_keys_before_new_clients() {
    let limits = one(10, 60_000);
    let (trials, newcomers) = (25, 32);
    let mut short = 0;
    for trial in 0..trials {
        let store = MemoryStore::with_max_memory(1 << 20).with_routes(["r", "i0", "i1", "i2"]);
        for i in 0..1_000 {
            let k = format!("r:h:quota-{i}");
            for _ in 0..10 {
                store.check_now_in("r", &k, &limits);
            }
        }
        let mut got = vec![0; newcomers];
        let mut rotated = 0;
        for _second in 0..10 {
            for (n, g) in got.iter_mut().enumerate() {
                let k = format!("r:h:new-{trial}-{n}");
                *g += usize::from(store.check_now_in("r", &k, &limits).admitted);
            }
            for _ in 0..2_000 {
                store.check_now_in("r", &format!("r:h:rotating-{rotated}"), &limits);
                rotated += 1;
            }
        }
        short += got.iter().filter(|&&g| g < 10).count();
        assert!(store.evictions() >= 20_000, "{}", store.evictions());
    }
    println!(
        "{short} of {} new clients short of their quota",
        trials * newcomers
    );
    assert!(
        short <= 16,
        "{short} of {} new clients short",
        trials * newcomers
    );
}
