//! An arena's decisions with eviction into the summary, time passed in (no sleeps).

use super::*;
use crate::limiter::memory::BUCKET_COST;
use std::time::Duration;

const HOUR: u64 = 3_600_000_000;

fn hour(requests: u32) -> [Limit; 1] {
    [Limit::log(requests, Duration::from_secs(3600))]
}

/// An arena whose shards hold about `buckets` small buckets each (small keys all land in shard
/// 0), and its summary beside them.
fn arena(buckets: usize) -> Arena {
    let shard = buckets * (BUCKET_COST + 32) * 2;
    Arena::new("r", shard * SHARDS, None)
}

/// Decide for `key` at `t` µs.
fn at(arena: &Arena, key: u64, limits: &[Limit], t: u64) -> (bool, Placed, u64) {
    let (v, placed, evicted) = arena.decide(key, limits, || t, Admit::IfRoom);
    (v.admitted, placed, evicted)
}

/// Flood keys `from..from + n`, `per_key` requests each at `t`; how many buckets that
/// evicted. Eviction takes the bucket that leaves the least in the summary first
/// (`shard::Trace`): a flood evicts a client that counts more than one request only with keys
/// that do too.
fn flood(arena: &Arena, (from, n, per_key): (u64, u64, u32), limits: &[Limit], t: u64) -> u64 {
    (from..from + n)
        .map(|k| (0..per_key).map(|_| at(arena, k, limits, t).2).sum::<u64>())
        .sum()
}

#[test]
fn a_client_evicted_mid_window_comes_back_to_its_count_not_a_fresh_quota() {
    let arena = arena(64);
    let limits = hour(3);
    let mut admitted = 0;
    // The limited client sends now and then; between its requests a flood evicts it.
    for round in 0..8u64 {
        let t = 1 + round * 60_000_000;
        admitted += u32::from(at(&arena, 1, &limits, t).0);
        // Several times what the shard holds, so the flood evicts it whichever it samples;
        // its keys count as much as the client (the bucket that leaves the least goes first,
        // `shard::Trace`) and no more (a colliding heavier key would hold the client back).
        let per_key = (round as u32 + 1).min(2);
        assert!(flood(&arena, (1000 + round * 1000, 400, per_key), &limits, t + 1) > 0);
        assert!(
            arena.lock(0).position(1).is_none(),
            "round {round}: not evicted"
        );
    }
    assert_eq!(admitted, 3, "admitted {admitted} of 3");
    // Not before its window frees (one hour after its third admission); the flood's own
    // one-request keys, sharing its cells, may hold it until theirs free too (the summary's
    // times rounded up to the ms: the last flood's at 7 min + 2 µs free at 7 min + 1 ms), no
    // longer.
    let third = 1 + 2 * 60_000_000;
    assert!(!at(&arena, 1, &limits, third + HOUR - 1).0);
    assert!(at(&arena, 1, &limits, 7 * 60_000_000 + 1_000 + HOUR).0);
    assert_eq!(arena.overflows(), 0);
}

#[test]
fn a_slotted_client_evicted_at_its_limit_stays_at_it_until_its_slot_leaves() {
    let arena = arena(64);
    let limits = [Limit::slotted(
        2,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )];
    let t0 = 5_500_000;
    assert!(at(&arena, 1, &limits, t0).0);
    assert!(at(&arena, 1, &limits, t0 + 1).0);
    assert!(!at(&arena, 1, &limits, t0 + 2).0);
    flood(&arena, (1000, 200, 2), &limits, t0 + 3);
    assert!(arena.lock(0).position(1).is_none(), "not evicted");
    // Slot 5 (5 s ..6 s) leaves at 6 s + 60 s, exactly as if never evicted.
    assert!(!at(&arena, 1, &limits, 65_999_999).0);
    assert!(at(&arena, 1, &limits, 66_000_000).0);
}

#[test]
fn an_arena_full_of_clients_at_their_limit_still_takes_new_clients() {
    let arena = arena(64);
    let limits = hour(2);
    // A key-rotation flood: each made-up key sends its quota, more than the shard holds (its
    // summary is a power of two of cells, so the buckets' part is between 64 and 128 of them).
    let flood_keys = 1000..1000 + 2 * 64;
    for k in flood_keys.clone() {
        for i in 0..2 {
            assert!(at(&arena, k, &limits, 10 + i).0);
        }
    }
    // A new client gets its own bucket and all of its quota, evicting flood keys for room.
    let (ok, placed, first) = at(&arena, 1, &limits, 20);
    assert_eq!((ok, placed), (true, Placed::Own));
    let (ok, placed, second) = at(&arena, 1, &limits, 21);
    assert_eq!((ok, placed), (true, Placed::Own));
    assert!(first + second > 0, "the arena was full: the flood made way");
    assert!(!at(&arena, 1, &limits, 22).0);
    // Every flood key, held or evicted, is still at its limit.
    let again = flood_keys.filter(|&k| at(&arena, k, &limits, 30).0).count();
    assert_eq!(again, 0);
    assert_eq!(arena.overflows(), 0);
}

#[test]
fn a_shard_too_small_for_one_bucket_decides_in_the_summary_and_never_past_the_limit() {
    // No byte for buckets: every decision is the summary's.
    let arena = Arena::new("r", 0, None);
    let limits = hour(2);
    let got: Vec<_> = (0..4).map(|i| at(&arena, 1, &limits, 10 + i)).collect();
    assert_eq!(
        got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        [
            (true, Placed::Summary),
            (true, Placed::Summary),
            (false, Placed::Summary),
            (false, Placed::Summary)
        ]
    );
    // Another key was never recorded: the filter of evicted keys tells it apart, so it starts
    // from nothing. Once recorded, one cell per row makes it collide everywhere: it is
    // over-counted (key 1's 2), never under.
    assert!(at(&arena, 2, &limits, 20).0);
    assert!(!at(&arena, 2, &limits, 21).0);
    assert_eq!(arena.overflows(), 6);
    // Both free one hour after the last admission (the summary's times round up to the ms).
    assert!(!at(&arena, 2, &limits, 20 + HOUR - 1).0);
    assert!(at(&arena, 2, &limits, 1000 + HOUR).0);
}

#[test]
fn a_lone_client_that_cannot_grow_goes_into_the_summary_itself() {
    // An arena with room for one bucket with one entry, not for its log's growth.
    let shard = (BUCKET_COST..BUCKET_COST + 512)
        .find(|&s| s - Summary::sized_for(s).bytes() == BUCKET_COST + 24)
        .expect("a shard size leaving BUCKET_COST + 24 for buckets");
    let arena = Arena::new("r", shard * SHARDS, None);
    assert_eq!(arena.budget() / SHARDS, BUCKET_COST + 24);
    let limits = hour(3);
    assert_eq!(at(&arena, 1, &limits, 10), (true, Placed::Own, 0));
    assert_eq!(at(&arena, 1, &limits, 11), (true, Placed::Summary, 1));
    // A bucket seeded with its 2 does not fit either: the summary decides, and the third is
    // its last.
    assert_eq!(at(&arena, 1, &limits, 12), (true, Placed::Summary, 0));
    assert!(!at(&arena, 1, &limits, 13).0);
}

/// Issue 52 row 13: a bucket holding leases is never evicted, whatever a flood of keys (each
/// counting more than it) pushes through its shard (the summary keeps counts, not leases: an
/// evicted lease could not be renewed or given back, and lapsed while its request ran).
#[test]
fn a_bucket_holding_leases_is_never_evicted() {
    let arena = arena(64);
    let limits = [
        Limit::lease(3, Duration::from_secs(30)),
        Limit::log(1_000_000, Duration::from_secs(3600)),
    ];
    let mut times = Vec::new();
    for i in 0..3 {
        let (v, _, _) = arena.decide(1, &limits, || 1 + i, Admit::IfRoom);
        assert!(v.admitted);
        times.push(v.recorded_at.unwrap());
    }
    // The oldest bucket of its shard, and a flood many times the shard's size (of requests
    // whose leases were given back: only the request limit counts them).
    assert!(flood(&arena, (1000, 2000, 4), &limits[1..], 10) > 0);
    assert!(
        arena.lock(0).position(1).is_some(),
        "evicted while holding leases"
    );
    // Its leases are renewed in place, and still count.
    assert_eq!(arena.renew(1, &limits[0], times[0], || 20), 20);
    assert!(!at(&arena, 1, &limits, 21).0, "a 4th lease");
    // Given back, the bucket may go like any other.
    for (i, t) in times.iter().enumerate() {
        let t = if i == 0 { 20 } else { *t };
        arena.refund(1, &limits[..1], t);
    }
    assert!(flood(&arena, (5000, 2000, 4), &limits[1..], 30) > 0);
    assert!(
        arena.lock(0).position(1).is_none(),
        "a bucket without leases is evicted"
    );
}
