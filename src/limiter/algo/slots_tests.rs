//! Unit tests of `slots.rs`.

use super::*;

/// 1 s in slots of 100 ms.
const SHAPE: SlotShape = SlotShape {
    window_us: 1_000_000,
    resolution_us: 100_000,
};

#[test]
fn counts_every_slot_overlapping_the_window_and_at_most_n_plus_one() {
    let mut s = SlotCounts::default();
    for t in (0..30).map(|i| i * 100_000 + 50_000) {
        s.evict(SHAPE, t);
        s.push(SHAPE, t, 1);
        assert!(s.counts.len() <= 11);
    }
    // At 2.95 s the slots of 1.9 s ..= 2.9 s overlap (1.95 s, 2.95 s]: 11 of them.
    assert_eq!((s.count(), s.counts.capacity() >= 11), (11, true));
    assert_eq!(s.heap_bytes(), 48);
}

#[test]
fn a_full_limit_resets_when_enough_slots_leave() {
    let mut s = SlotCounts::default();
    for t in [0, 10, 150_000, 150_001] {
        s.evict(SHAPE, t);
        s.push(SHAPE, t, 1);
    }
    // 4 counted, limit 4: slot 0 (2 requests) must leave, at 0.1 s + 1 s.
    assert_eq!(s.reset_us(SHAPE, 4, 200_000), 900_000);
    // Limit 3: one request must go, still slot 0. Limit 5: not full, oldest slot too.
    assert_eq!(s.reset_us(SHAPE, 3, 200_000), 900_000);
    assert_eq!(s.reset_us(SHAPE, 5, 200_000), 900_000);
    // Limit 2 (lowered on a reload): slot 1 must leave too, at 0.2 s + 1 s.
    assert_eq!(s.reset_us(SHAPE, 2, 200_000), 1_000_000);
    // Slot 0 leaves at exactly 1.1 s.
    s.evict(SHAPE, 1_099_999);
    assert_eq!(s.count(), 4);
    s.evict(SHAPE, 1_100_000);
    assert_eq!(s.count(), 2);
    assert_eq!(s.reset_us(SHAPE, 2, 1_100_000), 100_000);
}

#[test]
fn an_idle_client_comes_back_to_nothing() {
    let mut s = SlotCounts::default();
    s.push(SHAPE, 5, 1);
    s.evict(SHAPE, 60_000_000);
    assert!(s.is_empty());
    assert_eq!(s.reset_us(SHAPE, 1, 60_000_000), 1_000_000);
    s.push(SHAPE, 60_000_000, 1);
    assert_eq!(s.slots(SHAPE).collect::<Vec<_>>(), [(60_000_000, 1)]);
}
