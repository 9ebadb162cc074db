//! The summary's pure rules, with time passed in.

use super::*;
use crate::limiter::Limit;
use std::time::Duration;

fn id(window_s: u64) -> LimitId {
    Limit::log(3, Duration::from_secs(window_s)).id()
}

const S: u64 = 1_000_000;

#[test]
fn a_recorded_step_reads_back_until_it_frees_then_nothing() {
    let mut s = Summary::sized_for(16 << 10);
    let held = Held {
        count: 3,
        frees_us: 10 * S,
    };
    s.record(7, id(3600), held, S);
    assert_eq!(s.held(7, id(3600), 2 * S), held);
    assert_eq!(s.held(7, id(3600), 10 * S - 1), held);
    assert_eq!(s.held(7, id(3600), 10 * S), Held::default());
    // Another limit of the same bucket is another cell.
    assert_eq!(s.held(7, id(60), 2 * S), Held::default());
}

#[test]
fn merging_keeps_the_larger_count_and_the_later_time() {
    let mut s = Summary::sized_for(16 << 10);
    let (k, l) = (42, id(3600));
    s.record(
        k,
        l,
        Held {
            count: 5,
            frees_us: 4 * S,
        },
        S,
    );
    s.record(
        k,
        l,
        Held {
            count: 2,
            frees_us: 9 * S,
        },
        S,
    );
    assert_eq!(
        s.held(k, l, 2 * S),
        Held {
            count: 5,
            frees_us: 9 * S
        }
    );
    // An expired cell is replaced, not merged: its count no longer holds.
    s.record(
        k,
        l,
        Held {
            count: 1,
            frees_us: 20 * S,
        },
        10 * S,
    );
    assert_eq!(
        s.held(k, l, 10 * S),
        Held {
            count: 1,
            frees_us: 20 * S
        }
    );
}

#[test]
fn times_round_up_to_the_millisecond_never_down() {
    let mut s = Summary::sized_for(16 << 10);
    s.record(
        1,
        id(60),
        Held {
            count: 1,
            frees_us: 5_000_001,
        },
        0,
    );
    assert_eq!(s.held(1, id(60), 5_000_001).frees_us, 5_001_000);
}

#[test]
fn a_one_cell_summary_over_counts_every_key_but_under_counts_none() {
    // Every key collides in every row: each reads the largest count recorded.
    let mut s = Summary::sized_for(0);
    // One cell per row, and the smallest filter (64 bits a generation).
    assert_eq!(s.bytes(), ROWS * CELL_BYTES + 16);
    for key in 0..100u64 {
        let held = Held {
            count: key % 7 + 1,
            frees_us: (key + 10) * S,
        };
        s.record(key, id(60), held, S);
    }
    for key in 0..100u64 {
        let got = s.held(key, id(60), 2 * S);
        assert!(
            got.count > key % 7 && got.frees_us >= (key + 10) * S,
            "{key}: {got:?}"
        );
    }
}

/// Never under-counts, whatever collides: each recorded key reads back at least its own step
/// while it lasts, on a summary far too small for the keys recorded.
#[test]
fn random_keys_on_a_small_summary_read_back_at_least_their_own_step() {
    let mut s = Summary::sized_for(256);
    let mut rng = fastrand::Rng::with_seed(5);
    let mut own = Vec::new();
    for i in 0..2000u64 {
        let now = i * 1000;
        let held = Held {
            count: rng.u64(1..10),
            frees_us: now + rng.u64(1..60 * S),
        };
        let key = rng.u64(..);
        s.record(key, id(60), held, now);
        own.push((key, held));
    }
    let now = 2000 * 1000;
    for (key, held) in own {
        let got = s.held(key, id(60), now);
        if held.frees_us > now {
            assert!(got.count >= held.count && got.frees_us >= held.frees_us);
        }
    }
}

#[test]
fn sized_for_half_of_the_shard_in_whole_rows() {
    // Half of the shard: the cells in half of that, the filter in the other half.
    assert_eq!(Summary::sized_for(16 << 10).bytes(), 8 << 10);
    assert_eq!(Summary::sized_for(20 << 10).bytes(), (4 << 10) + (4 << 10));
    assert_eq!(
        Summary::sized_for(1 << 30).bytes(),
        2 * ROWS * MAX_WIDTH * CELL_BYTES
    );
}

#[test]
fn shrinking_a_summary_in_use_folds_it_and_still_bounds_every_key() {
    let mut s = Summary::sized_for(64 << 10);
    let mut rng = fastrand::Rng::with_seed(9);
    let keys: Vec<(u64, Held)> = (0..500)
        .map(|_| {
            (
                rng.u64(..),
                Held {
                    count: rng.u64(1..20),
                    frees_us: rng.u64(2 * S..90 * S),
                },
            )
        })
        .collect();
    for &(k, h) in &keys {
        s.record(k, id(60), h, S);
    }
    s.resize_for(4 << 10);
    assert_eq!(s.bytes(), 2 << 10);
    for (k, h) in keys {
        let got = s.held(k, id(60), S);
        assert!(
            got.count >= h.count && got.frees_us >= h.frees_us,
            "{got:?} < {h:?}"
        );
    }
    // Unused, it takes any new size; in use, it never grows (it cannot unfold).
    s.resize_for(64 << 10);
    assert_eq!(s.bytes(), 2 << 10);
    let mut empty = Summary::sized_for(4 << 10);
    empty.resize_for(64 << 10);
    assert_eq!(empty.bytes(), 32 << 10);
}
