//! The memory of denials: what a denial answers, for how long, under which state of the store
//! and busy period (`LearnedUnder`) and limits, and what forgets it. Every instant is given,
//! none is slept for.

use super::*;
use crate::limiter::LimitState;

fn limit(requests: u32, window: Duration) -> Limit {
    Limit::log(requests, window)
}

/// A one-limit denial that frees room in `reset`.
pub(crate) fn denial(reset: Duration) -> Verdict {
    Verdict {
        admitted: false,
        recorded_at: None,
        recorded_each: Vec::new(),
        states: vec![LimitState {
            remaining: 0,
            reset,
        }],
    }
}

const UNDER: LearnedUnder = LearnedUnder {
    generation: 3,
    epoch: 1,
};

/// A memory that learned, at `sent`, that `b` is full for 300 ms under `limits`.
fn learned(limits: &[Limit], sent: Instant) -> KnownDenials {
    let known = KnownDenials::new(Duration::from_secs(10));
    known.learn(
        "b",
        limits,
        &denial(Duration::from_millis(300)),
        sent,
        UNDER,
    );
    known
}

#[test]
fn a_denial_answers_until_the_bucket_has_room_with_its_reset_aged() {
    let limits = [limit(2, Duration::from_millis(300))];
    let sent = Instant::now();
    let known = learned(&limits, sent);
    let at = |ms| known.verdict("b", &limits, UNDER, sent + Duration::from_millis(ms));
    let answer = at(100).expect("still full");
    assert!(!answer.admitted);
    assert_eq!(answer.states[0].reset, Duration::from_millis(200));
    assert!(at(299).is_some());
    assert!(
        at(300).is_none(),
        "room again at the deadline: the store decides"
    );
}

#[test]
fn a_denial_only_binds_the_limits_it_was_decided_under() {
    // A request that began before a reload may teach its old-limit denial after the reload
    // cleared the memory: requests under the new limits must not see it.
    let sent = Instant::now();
    let known = learned(&[limit(1, Duration::from_secs(60))], sent);
    let raised = [limit(2, Duration::from_secs(60))];
    assert!(known.verdict("b", &raised, UNDER, sent).is_none());
    assert!(known
        .verdict("b", &[limit(1, Duration::from_secs(60))], UNDER, sent)
        .is_some());
}

#[test]
fn clear_and_forget_drop_what_was_learned() {
    let limits = [limit(1, Duration::from_secs(60))];
    let sent = Instant::now();
    let known = learned(&limits, sent);
    known.forget("b");
    assert!(known.verdict("b", &limits, UNDER, sent).is_none(), "forget");
    let known = learned(&limits, sent);
    known.clear();
    assert!(known.verdict("b", &limits, UNDER, sent).is_none(), "clear");
}

#[test]
fn the_count_beside_the_map_follows_learn_forget_clear_and_sweep() {
    // The count decides whether a decision looks at all: it must never stay at 0 while a
    // denial is held past the next sweep, nor keep a forgotten one.
    let limits = [limit(1, Duration::from_secs(60))];
    let sent = Instant::now();
    let full = denial(Duration::from_secs(30));
    let known = KnownDenials::new(Duration::from_secs(10));
    known.forget("unknown");
    assert_eq!(known.held.load(Ordering::Relaxed), 0, "nothing to forget");
    for bucket in ["a", "b", "b"] {
        known.learn(bucket, &limits, &full, sent, UNDER);
    }
    assert_eq!(
        known.held.load(Ordering::Relaxed),
        2,
        "b learned twice is one"
    );
    known.forget("a");
    assert_eq!(known.held.load(Ordering::Relaxed), 1);
    assert!(known.verdict("b", &limits, UNDER, sent).is_some());
    known.clear();
    known.learn("c", &limits, &full, sent, UNDER);
    assert!(
        known.verdict("c", &limits, UNDER, sent).is_some(),
        "learned after clear"
    );
    // A race that left the count low (here: set by hand) hides denials until a sweep recounts.
    known.held.store(0, Ordering::Relaxed);
    assert!(known.verdict("c", &limits, UNDER, sent).is_none());
    known.sweep(sent, UNDER.generation);
    assert!(
        known.verdict("c", &limits, UNDER, sent).is_some(),
        "recounted"
    );
}

#[test]
fn a_denial_answers_only_under_what_it_was_learned_under() {
    let known = KnownDenials::new(Duration::from_secs(1));
    let limits = [limit(1, Duration::from_secs(60))];
    let now = Instant::now();
    known.learn("b", &limits, &denial(Duration::from_secs(30)), now, UNDER);
    assert!(known.verdict("b", &limits, UNDER, now).is_some());
    let next_generation = LearnedUnder {
        generation: 4,
        ..UNDER
    };
    assert!(known.verdict("b", &limits, next_generation, now).is_none());
    let next_epoch = LearnedUnder { epoch: 2, ..UNDER };
    assert!(known.verdict("b", &limits, next_epoch, now).is_none());
}

#[test]
fn a_denial_is_trusted_for_max_age_at_most_and_then_swept() {
    let known = KnownDenials::new(Duration::from_secs(1));
    let limits = [limit(1, Duration::from_secs(60))];
    let sent = Instant::now();
    known.learn("b", &limits, &denial(Duration::from_secs(30)), sent, UNDER);
    let aged = known.verdict("b", &limits, UNDER, sent + Duration::from_millis(400));
    assert_eq!(aged.unwrap().states[0].reset, Duration::from_millis(29_600));
    let late = sent + Duration::from_secs(1);
    assert!(known.verdict("b", &limits, UNDER, late).is_none());
    known.sweep(late, UNDER.generation);
    assert!(known.denied.is_empty());
}

#[test]
fn serving_the_cache_sets_its_max_age_and_keeps_denials_past_a_busy_period() {
    let known = KnownDenials::new(Duration::from_secs(1));
    assert!(!known.outlives_lanes());
    known.serve_cache(Duration::from_secs(5));
    assert!(known.outlives_lanes());
    let limits = [limit(1, Duration::from_secs(60))];
    let sent = Instant::now();
    known.learn("b", &limits, &denial(Duration::from_secs(30)), sent, UNDER);
    let at = |s| known.verdict("b", &limits, UNDER, sent + Duration::from_secs(s));
    assert!(
        at(4).is_some() && at(5).is_none(),
        "trusted for the cache's max age"
    );
}

#[test]
fn an_admission_teaches_nothing() {
    let known = KnownDenials::new(Duration::from_secs(1));
    let admitted = Verdict {
        admitted: true,
        recorded_at: Some(1),
        recorded_each: Vec::new(),
        states: vec![LimitState {
            remaining: 0,
            reset: Duration::from_secs(60),
        }],
    };
    known.learn("b", &[], &admitted, Instant::now(), UNDER);
    assert!(known.denied.is_empty());
}
