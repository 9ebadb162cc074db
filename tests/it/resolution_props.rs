//! Property tests of the slotted limit (`resolution`) against a brute-force checker: for random
//! arrival sequences, the slot counters both stores share ([`SlotCounts`], the rules
//! `lua/kinds/slots/` implements too) never admit more than `requests` in any window, refuse
//! only where the exact log of a window one slot longer would refuse as well, keep at most
//! window/resolution + 1 counters, and report a `reset` that is exact: the limit is still full
//! a microsecond before it and admits at it.

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use slidegate::limiter::algo::slots::{SlotCounts, SlotShape};

/// A limit and a sequence of arrival gaps, in µs.
#[derive(Debug, Clone)]
struct Case {
    requests: u32,
    shape: SlotShape,
    gaps: Vec<u64>,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..=12, 1u64..=5, 1u64..=12).prop_flat_map(|(requests, res_ms, slots)| {
        let shape = SlotShape {
            window_us: res_ms * slots * 1000,
            resolution_us: res_ms * 1000,
        };
        // Bursts (0 gaps), gaps within a slot, and idle spells longer than the window.
        let gap = prop_oneof![
            3 => Just(0u64),
            6 => 0..shape.resolution_us,
            2 => 0..2 * shape.window_us,
        ];
        proptest::collection::vec(gap, 1..300).prop_map(move |gaps| Case {
            requests,
            shape,
            gaps,
        })
    })
}

/// Admissions of the exact log in `(to - len, to]`.
fn in_window(admitted: &[u64], to: u64, len: u64) -> usize {
    admitted
        .iter()
        .filter(|&&t| t <= to && t + len > to)
        .count()
}

/// Would the counters admit at `now`, recording nothing?
fn admits(slots: &SlotCounts, case: &Case, now: u64) -> bool {
    let mut probe = slots.clone();
    probe.evict(case.shape, now);
    probe.count() < u64::from(case.requests)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn never_more_than_requests_in_any_window_and_at_most_one_slot_early(case in case()) {
        let (w, r) = (case.shape.window_us, case.shape.resolution_us);
        let max_bytes = ((w / r + 1) * 4).next_multiple_of(16) as usize;
        let mut slots = SlotCounts::default();
        let mut admitted: Vec<u64> = Vec::new();
        // Start well past 0 so that `now - window - resolution` never saturates.
        let mut now = 10 * w;
        for gap in &case.gaps {
            now += gap;
            slots.evict(case.shape, now);
            if slots.count() < u64::from(case.requests) {
                slots.push(case.shape, now, 1);
                admitted.push(now);
                // The window that ends at an admission is where a window's count peaks.
                prop_assert!(in_window(&admitted, now, w) <= case.requests as usize,
                    "{} admitted in the window ending at {now}", in_window(&admitted, now, w));
            } else {
                // Refused: the exact log one slot longer holds `requests` already.
                prop_assert!(in_window(&admitted, now, w + r) >= case.requests as usize,
                    "refused at {now} with only {} in (now - window - resolution, now]",
                    in_window(&admitted, now, w + r));
                // The reset is exact: still full just before it, room at it, never past w + r.
                let reset = slots.reset_us(case.shape, case.requests, now);
                prop_assert!(reset >= 1 && reset <= w + r, "reset {reset}");
                prop_assert!(!admits(&slots, &case, now + reset - 1), "free before reset {reset}");
                prop_assert!(admits(&slots, &case, now + reset), "still full at reset {reset}");
            }
            prop_assert!(slots.heap_bytes() <= max_bytes);
            // What the counters hold lies between the log's window and one slot more.
            let counted = slots.count() as usize;
            prop_assert!(in_window(&admitted, now, w) <= counted);
            prop_assert!(counted <= in_window(&admitted, now, w + r));
        }
    }

    #[test]
    fn the_exact_log_refuses_only_what_the_counters_refuse(case in case()) {
        // Run the exact log; at each of its refusals the counters, fed the same admissions,
        // refuse too (they count a superset of the log's window).
        let w = case.shape.window_us;
        let mut slots = SlotCounts::default();
        let mut admitted: Vec<u64> = Vec::new();
        let mut now = 10 * w;
        for gap in &case.gaps {
            now += gap;
            slots.evict(case.shape, now);
            let log_admits = in_window(&admitted, now, w) < case.requests as usize;
            let slots_admit = slots.count() < u64::from(case.requests);
            prop_assert!(log_admits || !slots_admit, "the counters admit where the log refuses at {now}");
            if slots_admit {
                slots.push(case.shape, now, 1);
                admitted.push(now);
            }
        }
    }
}
