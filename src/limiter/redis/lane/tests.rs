//! The lane state machine, unit by unit: window, order, idleness, denials, overload.

use super::*;
use crate::limiter::LimitState;

const LIMITS: [Limit; 1] = [Limit::log(1, Duration::from_secs(60))];

fn denial() -> Verdict {
    Verdict {
        admitted: false,
        recorded_at: None,
        states: vec![LimitState {
            remaining: 0,
            reset: Duration::from_secs(30),
        }],
    }
}

fn queue(lane: &mut Lane, bucket: &str) -> oneshot::Receiver<Result<Verdict, StoreError>> {
    let (tx, rx) = oneshot::channel();
    lane.arrive(bucket, &LIMITS, tx, 7, Instant::now());
    rx
}

#[test]
fn a_denial_answers_the_queued_decisions_of_its_bucket_only() {
    let mut lane = Lane::default();
    let mut hot: Vec<_> = (0..5).map(|_| queue(&mut lane, "r:hot")).collect();
    let mut cold = queue(&mut lane, "r:cold");
    lane.learn("r:hot", &LIMITS, &denial(), Instant::now(), 7);
    lane.answer_known(7);
    for rx in &mut hot {
        let v = rx.try_recv().expect("answered at once").unwrap();
        assert!(!v.admitted && v.states[0].reset <= Duration::from_secs(30));
    }
    assert!(cold.try_recv().is_err(), "another bucket still waits");
    assert_eq!(lane.pending.len(), 1);
    // A later arrival is answered without queueing.
    let (tx, _rx) = oneshot::channel();
    assert!(matches!(
        lane.arrive("r:hot", &LIMITS, tx, 7, Instant::now()),
        Arrival::Known(_)
    ));
}

#[test]
fn a_denial_binds_only_its_limits_and_generation() {
    let mut lane = Lane::default();
    lane.learn("r:hot", &LIMITS, &denial(), Instant::now(), 7);
    let (tx, _rx) = oneshot::channel();
    assert!(matches!(
        lane.arrive("r:hot", &LIMITS, tx, 8, Instant::now()),
        Arrival::Start
    ));
    let other = [Limit::log(5, Duration::from_secs(60))];
    let (tx, _rx) = oneshot::channel();
    assert!(matches!(
        lane.arrive("r:hot", &other, tx, 7, Instant::now()),
        Arrival::Send
    ));
}

#[test]
fn an_admission_teaches_nothing() {
    let mut lane = Lane::default();
    let admitted = Verdict {
        admitted: true,
        recorded_at: Some(1),
        states: vec![LimitState {
            remaining: 0,
            reset: Duration::from_secs(60),
        }],
    };
    lane.learn("r:hot", &LIMITS, &admitted, Instant::now(), 7);
    assert!(lane.denied.is_empty());
}

#[test]
fn a_full_queue_answers_overloaded() {
    let mut lane = Lane::default();
    let kept: Vec<_> = (0..MAX_PENDING)
        .map(|i| queue(&mut lane, &format!("r:{i}")))
        .collect();
    let (tx, _rx) = oneshot::channel();
    assert!(matches!(
        lane.arrive("r:one-more", &LIMITS, tx, 7, Instant::now()),
        Arrival::Overloaded
    ));
    assert_eq!(kept.len(), MAX_PENDING);
}

#[test]
fn an_idle_lane_forgets_its_denials() {
    let mut lane = Lane::default();
    let _rx = queue(&mut lane, "r:a");
    lane.learn("r:a", &LIMITS, &denial(), Instant::now(), 7);
    assert!(matches!(lane.next_batch(64), Next::Send(_)));
    assert!(
        matches!(lane.next_batch(64), Next::Wait),
        "a call is in flight"
    );
    lane.returned();
    assert!(matches!(lane.next_batch(64), Next::Idle));
    assert!(lane.denied.is_empty() && !lane.sending);
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
    let mut lane = Lane::default();
    let mut rx = vec![queue(&mut lane, "r:0")];
    assert_eq!(buckets(lane.next_batch(64)), ["r:0"]);
    // Every later arrival finds room until WINDOW calls are in flight.
    for i in 1..WINDOW {
        let (tx, r) = oneshot::channel();
        rx.push(r);
        let bucket = format!("r:{i}");
        assert!(matches!(
            lane.arrive(&bucket, &LIMITS, tx, 7, Instant::now()),
            Arrival::Send
        ));
        assert_eq!(buckets(lane.next_batch(64)), [bucket]);
    }
    assert_eq!(lane.in_flight(), WINDOW);
    // A full window: the next ones queue, and go out together when one call returns.
    for bucket in ["r:a", "r:b", "r:c"] {
        let (tx, r) = oneshot::channel();
        rx.push(r);
        assert!(matches!(
            lane.arrive(bucket, &LIMITS, tx, 7, Instant::now()),
            Arrival::Queued
        ));
    }
    assert!(matches!(lane.next_batch(64), Next::Wait));
    lane.returned();
    assert_eq!(buckets(lane.next_batch(64)), ["r:a", "r:b", "r:c"]);
    assert_eq!(lane.in_flight(), WINDOW);
}

#[test]
fn batches_leave_in_arrival_order_and_at_most_max_at_a_time() {
    let mut lane = Lane::default();
    let _rx: Vec<_> = (0..5)
        .map(|i| queue(&mut lane, &format!("r:{i}")))
        .collect();
    assert_eq!(buckets(lane.next_batch(2)), ["r:0", "r:1"]);
    assert_eq!(buckets(lane.next_batch(2)), ["r:2", "r:3"]);
    assert_eq!(buckets(lane.next_batch(2)), ["r:4"]);
    assert_eq!(lane.in_flight(), 3);
    assert!(matches!(lane.next_batch(2), Next::Wait));
}

#[test]
fn the_lane_is_idle_only_when_every_call_has_returned() {
    let mut lane = Lane::default();
    let _rx: Vec<_> = (0..2)
        .map(|i| queue(&mut lane, &format!("r:{i}")))
        .collect();
    assert!(matches!(lane.next_batch(1), Next::Send(_)));
    assert!(matches!(lane.next_batch(1), Next::Send(_)));
    lane.returned();
    assert!(matches!(lane.next_batch(1), Next::Wait));
    assert!(lane.is_sending());
    lane.returned();
    assert!(matches!(lane.next_batch(1), Next::Idle));
    assert!(!lane.is_sending());
    // The next decision starts a sender again.
    let (tx, _r) = oneshot::channel();
    assert!(matches!(
        lane.arrive("r:x", &LIMITS, tx, 7, Instant::now()),
        Arrival::Start
    ));
}

#[test]
fn a_denial_from_one_call_answers_what_queued_behind_the_others() {
    // Two calls in flight; the first returns a denial for r:hot, so the decisions for
    // r:hot queued behind the full window are answered at once and never sent.
    let mut lane = Lane::default();
    let _sent: Vec<_> = (0..WINDOW).map(|_| queue(&mut lane, "r:hot")).collect();
    for _ in 0..WINDOW {
        assert!(matches!(lane.next_batch(1), Next::Send(_)));
    }
    let mut hot: Vec<_> = (0..3).map(|_| queue(&mut lane, "r:hot")).collect();
    let _cold = queue(&mut lane, "r:cold");
    lane.returned();
    lane.learn("r:hot", &LIMITS, &denial(), Instant::now(), 7);
    lane.answer_known(7);
    for rx in &mut hot {
        assert!(!rx.try_recv().expect("answered at once").unwrap().admitted);
    }
    assert_eq!(buckets(lane.next_batch(64)), ["r:cold"]);
}
