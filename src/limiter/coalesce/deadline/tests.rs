//! The deadline rules on given instants: no clock, no sleeps.

use super::*;

const T: Duration = Duration::from_millis(50);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_timer_is_due_at_the_oldest_calls_deadline() {
    let t0 = Instant::now();
    let mut d = Deadlines::new(T, t0);
    assert_eq!(d.due(Some(t0 + ms(3))), t0 + ms(3) + T);
    // Later calls are due later: the timer only moves later while calls are in flight.
    assert!(d.due(Some(t0 + ms(4))) > d.due(Some(t0 + ms(3))));
}

#[test]
fn a_silent_store_runs_out_on_time() {
    let t0 = Instant::now();
    let mut d = Deadlines::new(T, t0);
    let due = d.due(Some(t0));
    assert_eq!(d.fired(due, due, Some(t0)), Fired::Expired(t0));
    // Up to the tolerance late is still on time; the calls sent by `now - T` are the ones out.
    let now = due + LAG_TOLERANCE;
    assert_eq!(d.fired(now, due, Some(t0)), Fired::Expired(now - T));
}

#[test]
fn a_late_timer_gives_the_calls_in_flight_a_grace_as_long_as_it_was_late() {
    let t0 = Instant::now();
    let mut d = Deadlines::new(T, t0);
    let due = d.due(Some(t0));
    let fired = due + ms(30);
    assert_eq!(d.fired(fired, due, Some(t0)), Fired::Late);
    assert_eq!(d.due(Some(t0)), fired + ms(30));
    // At most one timeout at a time.
    let due = d.due(Some(t0));
    let very_late = due + ms(500);
    assert_eq!(d.fired(very_late, due, Some(t0)), Fired::Late);
    assert_eq!(d.due(Some(t0)), very_late + T);
    // On time at the end of the grace: out.
    let end = d.due(Some(t0));
    assert_eq!(d.fired(end, end, Some(t0)), Fired::Expired(end - T));
}

#[test]
fn a_grace_ends_with_the_calls_it_was_given_to() {
    let t0 = Instant::now();
    let mut d = Deadlines::new(T, t0);
    let due = d.due(Some(t0));
    assert_eq!(d.fired(due + ms(40), due, Some(t0)), Fired::Late);
    // Nothing in flight: the grace is dropped, and a call sent now is due a timeout from now.
    d.activity(due + ms(41));
    assert_eq!(d.due(None), due + ms(41) + T);
    assert_eq!(d.due(Some(due + ms(42))), due + ms(42) + T);
}

#[test]
fn an_idle_sender_ends_a_timeout_after_its_last_call() {
    let t0 = Instant::now();
    let mut d = Deadlines::new(T, t0);
    d.activity(t0 + ms(7));
    // Activity never moves back.
    d.activity(t0 + ms(2));
    let due = d.due(None);
    assert_eq!(due, t0 + ms(7) + T);
    // However late the timer, nothing in flight means idle (no grace to give).
    assert_eq!(d.fired(due + ms(900), due, None), Fired::Idle);
}
