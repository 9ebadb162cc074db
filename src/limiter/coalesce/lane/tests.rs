//! The lane state machine, unit by unit: window, order, idleness, denials, overload.

use std::time::Duration;

use tokio::sync::oneshot::error::TryRecvError;

use super::*;
use crate::limiter::{Checked, Verdict};

const LIMITS: [Limit; 1] = [Limit::log(1, Duration::from_secs(60))];

/// Small bounds, so that the tests reach them quickly.
const BOUNDS: Bounds = Bounds {
    max_batch: 64,
    max_pending: 256,
    window: 4,
};

const GENERATION: u64 = 7;

fn lane() -> Lane {
    Lane::new(BOUNDS)
}

/// A memory of denials no deny cache reads (denials bound to the lane's busy period).
fn known() -> KnownDenials {
    KnownDenials::new(Duration::from_secs(1))
}

fn denial() -> Verdict {
    crate::limiter::coalesce::known::tests::denial(Duration::from_secs(30))
}

fn arrive(lane: &mut Lane, known: &KnownDenials, bucket: &str, limits: &[Limit]) -> Arrival {
    let (tx, _rx) = oneshot::channel();
    lane.arrive(
        (bucket, None),
        limits,
        tx,
        known,
        GENERATION,
        Instant::now(),
    )
}

fn queue(lane: &mut Lane, bucket: &str) -> oneshot::Receiver<Checked> {
    let (tx, rx) = oneshot::channel();
    lane.arrive(
        (bucket, None),
        &LIMITS,
        tx,
        &known(),
        GENERATION,
        Instant::now(),
    );
    rx
}

/// `bucket` found full by a call of `lane`, just now.
fn learn(lane: &Lane, known: &KnownDenials, bucket: &str) {
    let under = lane.learned_under(known, GENERATION);
    known.learn(bucket, &LIMITS, &denial(), Instant::now(), under);
}

#[test]
fn a_denial_answers_the_queued_decisions_of_its_bucket_only() {
    let (mut lane, known) = (lane(), known());
    let mut hot: Vec<_> = (0..5).map(|_| queue(&mut lane, "r:hot")).collect();
    let mut cold = queue(&mut lane, "r:cold");
    learn(&lane, &known, "r:hot");
    lane.answer_known(&known, lane.learned_under(&known, GENERATION));
    for rx in &mut hot {
        let v = rx.try_recv().expect("answered at once").unwrap();
        assert!(!v.admitted && v.states[0].reset <= Duration::from_secs(30));
    }
    assert!(
        matches!(cold.try_recv(), Err(TryRecvError::Empty)),
        "another bucket still waits, unanswered"
    );
    assert_eq!(lane.pending.len(), 1);
    // A later arrival is answered without queueing.
    assert!(matches!(
        arrive(&mut lane, &known, "r:hot", &LIMITS),
        Arrival::Known(_)
    ));
}

#[test]
fn a_denial_binds_only_its_limits_and_generation() {
    let (mut lane, known) = (lane(), known());
    learn(&lane, &known, "r:hot");
    let (tx, _rx) = oneshot::channel();
    let later = GENERATION + 1;
    assert!(matches!(
        lane.arrive(("r:hot", None), &LIMITS, tx, &known, later, Instant::now()),
        Arrival::Start
    ));
    let other = [Limit::log(5, Duration::from_secs(60))];
    assert!(matches!(
        arrive(&mut lane, &known, "r:hot", &other),
        Arrival::Send
    ));
}

#[test]
fn a_full_queue_answers_overloaded() {
    let mut lane = lane();
    let kept: Vec<_> = (0..BOUNDS.max_pending)
        .map(|i| queue(&mut lane, &format!("r:{i}")))
        .collect();
    assert!(matches!(
        arrive(&mut lane, &known(), "r:one-more", &LIMITS),
        Arrival::Overloaded
    ));
    assert_eq!(kept.len(), BOUNDS.max_pending);
}

/// Go through one busy period: one decision sent and returned, then idle.
fn one_busy_period(lane: &mut Lane) {
    let _rx = queue(lane, "r:a");
    assert!(matches!(lane.next_batch(), Next::Send(_)));
    assert!(
        matches!(lane.next_batch(), Next::Wait),
        "a call is in flight"
    );
    lane.returned();
    assert!(matches!(lane.next_batch(), Next::Idle));
    assert!(lane.is_idle());
}

#[test]
fn an_idle_lane_forgets_its_denials() {
    let (mut lane, known) = (lane(), known());
    learn(&lane, &known, "r:hot");
    one_busy_period(&mut lane);
    // The sender still waits for the bell: it sends this one.
    assert!(
        matches!(arrive(&mut lane, &known, "r:hot", &LIMITS), Arrival::Send),
        "asked again"
    );
}

#[test]
fn an_idle_lane_forgets_its_denials_however_often_its_sender_looks() {
    let (mut lane, known) = (lane(), known());
    one_busy_period(&mut lane);
    // Learned after the busy period ended, while the sender waits: a later look at the idle
    // lane (a bell with nothing queued) starts no new busy period and forgets nothing.
    learn(&lane, &known, "r:hot");
    assert!(matches!(lane.next_batch(), Next::Idle));
    assert!(matches!(
        arrive(&mut lane, &known, "r:hot", &LIMITS),
        Arrival::Known(_)
    ));
}

#[test]
fn with_a_deny_cache_denials_outlive_the_busy_period() {
    let (mut lane, known) = (lane(), known());
    // What turning the deny cache on does to the store's memory.
    known.serve_cache(Duration::from_secs(1));
    learn(&lane, &known, "r:hot");
    one_busy_period(&mut lane);
    assert!(matches!(
        arrive(&mut lane, &known, "r:hot", &LIMITS),
        Arrival::Known(_)
    ));
}

/// Buckets of a batch, in order.
fn buckets(next: Next) -> Vec<String> {
    match next {
        Next::Send(batch) => batch.iter().map(|p| p.bucket.to_string()).collect(),
        Next::Wait => panic!("expected a batch, got Wait"),
        Next::Idle => panic!("expected a batch, got Idle"),
    }
}

#[test]
fn a_decision_is_sent_at_once_while_the_window_has_room() {
    let (mut lane, known) = (lane(), known());
    let _rx = queue(&mut lane, "r:0");
    assert_eq!(buckets(lane.next_batch()), ["r:0"]);
    lane.returned();
    assert!(matches!(lane.next_batch(), Next::Idle));
    // Nothing in flight: the arrival rings at once.
    assert!(matches!(
        arrive(&mut lane, &known, "r:1", &LIMITS),
        Arrival::Send
    ));
    assert_eq!(buckets(lane.next_batch()), ["r:1"]);
    // Calls in flight and room in the window: the first arrival defers the ring, the others
    // ride on it, and all go in one call when it rings.
    for round in 2..=BOUNDS.window {
        let first = format!("r:{round}-0");
        assert!(matches!(
            arrive(&mut lane, &known, &first, &LIMITS),
            Arrival::Defer
        ));
        let riders = [format!("r:{round}-1"), format!("r:{round}-2")];
        for bucket in &riders {
            assert!(matches!(
                arrive(&mut lane, &known, bucket, &LIMITS),
                Arrival::Queued
            ));
        }
        assert!(lane.ring_now(), "the deferred ring is due");
        assert!(!lane.ring_now(), "once");
        assert_eq!(
            buckets(lane.next_batch()),
            [first, riders[0].clone(), riders[1].clone()]
        );
    }
    assert_eq!(lane.in_flight(), BOUNDS.window);
    // A full window: the next ones queue without a ring, and go out together when one call
    // returns.
    for bucket in ["r:a", "r:b", "r:c"] {
        assert!(matches!(
            arrive(&mut lane, &known, bucket, &LIMITS),
            Arrival::Queued
        ));
    }
    assert!(!lane.ring_now());
    assert!(matches!(lane.next_batch(), Next::Wait));
    lane.returned();
    assert_eq!(buckets(lane.next_batch()), ["r:a", "r:b", "r:c"]);
    assert_eq!(lane.in_flight(), BOUNDS.window);
}

#[test]
fn a_deferred_ring_is_not_due_once_a_batch_took_what_it_was_for() {
    let (mut lane, known) = (lane(), known());
    let _rx = queue(&mut lane, "r:0");
    assert_eq!(buckets(lane.next_batch()), ["r:0"]);
    assert!(matches!(
        arrive(&mut lane, &known, "r:1", &LIMITS),
        Arrival::Defer
    ));
    // A call returned before the ring: the sender sends what queued.
    lane.returned();
    assert_eq!(buckets(lane.next_batch()), ["r:1"]);
    assert!(!lane.ring_now(), "nothing left for the ring to send");
    // The next arrival with a call in flight defers a ring of its own.
    assert!(matches!(
        arrive(&mut lane, &known, "r:2", &LIMITS),
        Arrival::Defer
    ));
    // Failing the queue (a call ran out its deadline) cancels the ring too.
    assert_eq!(lane.take_queued().len(), 1);
    assert!(!lane.ring_now());
}

#[test]
fn batches_leave_in_arrival_order_and_at_most_max_at_a_time() {
    let mut lane = Lane::new(Bounds {
        max_batch: 2,
        ..BOUNDS
    });
    let _rx: Vec<_> = (0..5)
        .map(|i| queue(&mut lane, &format!("r:{i}")))
        .collect();
    assert_eq!(buckets(lane.next_batch()), ["r:0", "r:1"]);
    assert_eq!(buckets(lane.next_batch()), ["r:2", "r:3"]);
    assert_eq!(buckets(lane.next_batch()), ["r:4"]);
    assert_eq!(lane.in_flight(), 3);
    assert!(matches!(lane.next_batch(), Next::Wait));
}

#[test]
fn the_lane_is_idle_only_when_every_call_has_returned() {
    let mut lane = Lane::new(Bounds {
        max_batch: 1,
        ..BOUNDS
    });
    let _rx: Vec<_> = (0..2)
        .map(|i| queue(&mut lane, &format!("r:{i}")))
        .collect();
    assert!(matches!(lane.next_batch(), Next::Send(_)));
    assert!(matches!(lane.next_batch(), Next::Send(_)));
    lane.returned();
    assert!(matches!(lane.next_batch(), Next::Wait));
    assert!(lane.is_sending());
    lane.returned();
    assert!(matches!(lane.next_batch(), Next::Idle));
    assert!(lane.is_idle());
    // The sender waits for the bell a while: the next decision rings it.
    let _x = queue(&mut lane, "r:x");
    assert!(!lane.is_idle());
    assert!(
        !lane.retire(),
        "a decision queued: the sender stays and sends it"
    );
    assert!(matches!(lane.next_batch(), Next::Send(_)));
    assert!(!lane.retire(), "a call in flight: the sender stays");
    lane.returned();
    assert!(matches!(lane.next_batch(), Next::Idle));
    assert!(lane.retire(), "idle: the sender ends");
    assert!(!lane.is_sending());
    // The next decision starts a sender again.
    assert!(matches!(
        arrive(&mut lane, &known(), "r:y", &LIMITS),
        Arrival::Start
    ));
}

#[test]
fn a_denial_from_one_call_answers_what_queued_behind_the_others() {
    // A full window; the first call returns a denial for r:hot, so the decisions for r:hot
    // queued behind the full window are answered at once and never sent.
    let (mut lane, known) = (
        Lane::new(Bounds {
            max_batch: 1,
            ..BOUNDS
        }),
        known(),
    );
    let _sent: Vec<_> = (0..BOUNDS.window)
        .map(|_| queue(&mut lane, "r:hot"))
        .collect();
    for _ in 0..BOUNDS.window {
        assert!(matches!(lane.next_batch(), Next::Send(_)));
    }
    let mut hot: Vec<_> = (0..3).map(|_| queue(&mut lane, "r:hot")).collect();
    let _cold = queue(&mut lane, "r:cold");
    lane.returned();
    learn(&lane, &known, "r:hot");
    lane.answer_known(&known, lane.learned_under(&known, GENERATION));
    for rx in &mut hot {
        assert!(!rx.try_recv().expect("answered at once").unwrap().admitted);
    }
    assert_eq!(buckets(lane.next_batch()), ["r:cold"]);
}
