//! The smoothing layer: [`wait_for`]'s rule, and the waiting loop around a scripted layer on
//! paused time (a fake inner layer, a fake client; no real sleeping).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::limiter::{Buckets, DecidedBy, LimitState, StoreError, Verdict};

const SECOND: Duration = Duration::from_secs(1);

/// A verdict of two limits: the first full for `reset`, the second as given.
fn verdict(admitted: bool, reset: Duration, second: LimitState) -> Checked {
    Ok(Verdict {
        admitted,
        recorded_at: admitted.then_some(1),
        recorded_each: Vec::new(),
        states: vec![
            LimitState {
                remaining: u32::from(admitted),
                reset,
            },
            second,
        ],
    })
}

fn roomy() -> LimitState {
    LimitState {
        remaining: 5,
        reset: Duration::from_secs(50),
    }
}

#[test]
fn a_denial_whose_room_frees_in_time_waits_exactly_until_then() {
    let denied = verdict(false, Duration::from_millis(300), roomy());
    let p = Some(SECOND);
    assert_eq!(
        wait_for(p, &denied, Duration::ZERO, 1),
        Some(Duration::from_millis(300))
    );
    // The budget counts from the first denial: 700 ms used leaves exactly 300 ms.
    assert_eq!(
        wait_for(p, &denied, Duration::from_millis(700), 2),
        Some(Duration::from_millis(300))
    );
    assert_eq!(wait_for(p, &denied, Duration::from_millis(701), 2), None);
}

#[test]
fn the_wait_is_for_the_latest_full_limit() {
    // Both limits full: the request cannot be admitted before the later one frees.
    let full = LimitState {
        remaining: 0,
        reset: Duration::from_millis(900),
    };
    let denied = verdict(false, Duration::from_millis(100), full);
    assert_eq!(
        wait_for(Some(SECOND), &denied, Duration::ZERO, 1),
        Some(Duration::from_millis(900))
    );
    let short = Some(Duration::from_millis(500));
    assert_eq!(wait_for(short, &denied, Duration::ZERO, 1), None);
}

#[test]
fn admitted_errors_and_routes_without_max_delay_never_wait() {
    let soon = verdict(false, Duration::from_millis(10), roomy());
    let admitted = verdict(true, Duration::from_millis(10), roomy());
    let failed = Err(StoreError::Timeout(Duration::from_millis(50)));
    let on = Some(SECOND);
    assert_eq!(wait_for(on, &admitted, Duration::ZERO, 1), None);
    assert_eq!(wait_for(on, &failed, Duration::ZERO, 1), None);
    assert_eq!(wait_for(None, &soon, Duration::ZERO, 1), None);
}

#[test]
fn a_request_takes_at_most_max_decisions() {
    let soon = verdict(false, Duration::from_millis(1), roomy());
    let p = Some(SECOND);
    assert!(wait_for(p, &soon, Duration::ZERO, MAX_DECISIONS - 1).is_some());
    assert_eq!(wait_for(p, &soon, Duration::ZERO, MAX_DECISIONS), None);
}

/// A known denial (the deny cache's answer, its resets aged to now) waits until the cache's
/// deadline, so the decision after the wait goes to the store: the cache never answers a
/// waiter past the time room frees, and never makes it wait longer than that.
#[tokio::test]
async fn a_known_denial_waits_until_the_store_decides_again() {
    use crate::limiter::coalesce::fixture::Cached;
    use crate::limiter::fixtures::Counting;
    use crate::limiter::Limit;

    let store = Arc::new(Counting::default());
    let cache = Cached::new(store.clone(), Duration::from_secs(10));
    let limits = [Limit::log(1, Duration::from_millis(200))];
    let started = std::time::Instant::now();
    assert!(cache.check("b", &limits).await.unwrap().admitted);
    assert!(!cache.check("b", &limits).await.unwrap().admitted);
    let mut result = cache.check("b", &limits).await;
    assert_eq!(store.reached(), 2, "the third answer is the cache's");
    let waiting = std::time::Instant::now();
    let mut decisions = 1;
    while let Some(wait) = wait_for(Some(SECOND), &result, waiting.elapsed(), decisions) {
        tokio::time::sleep(wait).await;
        result = cache.check("b", &limits).await;
        decisions += 1;
    }
    assert!(
        result.unwrap().admitted,
        "admitted after {decisions} decisions"
    );
    assert_eq!(
        store.reached(),
        1 + decisions as usize,
        "every decision after a wait reached the store"
    );
    // A wake a few microseconds before the eviction costs one more decision at most.
    assert!(decisions <= 3, "{decisions} decisions");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "admitted before room freed"
    );
    assert!(took < Duration::from_millis(300), "{took:?}");
}

/// A layer that answers from a script, in order, and counts the decisions asked of it.
#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Checked>>,
    asked: AtomicUsize,
}

impl Script {
    fn of(answers: impl IntoIterator<Item = Checked>) -> Script {
        Script {
            answers: Mutex::new(answers.into_iter().collect()),
            asked: AtomicUsize::new(0),
        }
    }
}

impl Decide for Script {
    async fn decide(&self, _ask: Ask<'_>) -> Decided {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let next = self.answers.lock().unwrap().pop_front();
        Decided {
            result: next.expect("a scripted answer"),
            by: DecidedBy::Store,
        }
    }
}

/// A client that stays, or leaves after a while.
struct Leaves(Option<Duration>);

impl Client for Leaves {
    type Gone = &'static str;
    async fn gone(&mut self) -> &'static str {
        match self.0 {
            Some(after) => {
                tokio::time::sleep(after).await;
                "left"
            }
            None => std::future::pending().await,
        }
    }
}

const BUDGET: Budget = Budget {
    max_delay: SECOND,
    max_queue: 8,
    max_delayed: 100,
};

async fn smoothed(
    layer: &Smoothing<Script>,
    budget: Option<Budget>,
    client: Leaves,
) -> Smoothed<&'static str> {
    let buckets = Buckets::one("r:c");
    let ask = Ask {
        route: "r",
        buckets: &buckets,
        limits: &[],
        local: false,
    };
    let mut client = client;
    layer.decide(ask, budget, &mut client).await
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn a_denial_waits_for_its_room_and_is_decided_again() {
    let script = Script::of([
        verdict(false, ms(300), roomy()),
        verdict(true, ms(300), roomy()),
    ]);
    let layer = Smoothing::new(script, QueueMetrics::unregistered());
    let Smoothed::Decided { decided, waited } = smoothed(&layer, Some(BUDGET), Leaves(None)).await
    else {
        panic!("the client stayed");
    };
    assert!(decided.result.unwrap().admitted);
    assert_eq!(waited, Some(ms(300)), "exactly until room freed");
    assert_eq!(layer.inner().asked.load(Ordering::Relaxed), 2);
    assert_eq!(layer.queues().buckets(), 0, "its place given back");
}

#[tokio::test(start_paused = true)]
async fn a_wait_ends_when_the_budget_is_spent_or_the_client_leaves() {
    // Room frees at 300 ms, is taken by another waiter, then frees only past the budget.
    let script = Script::of([
        verdict(false, ms(300), roomy()),
        verdict(false, ms(800), roomy()),
    ]);
    let layer = Smoothing::new(script, QueueMetrics::unregistered());
    let Smoothed::Decided { decided, waited } = smoothed(&layer, Some(BUDGET), Leaves(None)).await
    else {
        panic!("the client stayed");
    };
    assert!(!decided.result.unwrap().admitted, "denied after the wait");
    assert_eq!(waited, Some(ms(300)));
    // A client gone mid-wait: no further decision.
    let script = Script::of([verdict(false, ms(300), roomy())]);
    let layer = Smoothing::new(script, QueueMetrics::unregistered());
    let gone = smoothed(&layer, Some(BUDGET), Leaves(Some(ms(100)))).await;
    assert!(
        matches!(gone, Smoothed::ClientGone { why: "left", waited } if waited == ms(100)),
        "{gone:?}"
    );
    assert_eq!(layer.inner().asked.load(Ordering::Relaxed), 1);
    assert_eq!(layer.queues().total(), 0, "its place given back");
}

#[tokio::test(start_paused = true)]
async fn no_budget_or_no_place_answers_at_once() {
    for budget in [
        None,
        Some(Budget {
            max_delayed: 0,
            ..BUDGET
        }),
    ] {
        let script = Script::of([verdict(false, ms(300), roomy())]);
        let layer = Smoothing::new(script, QueueMetrics::unregistered());
        let out = smoothed(&layer, budget, Leaves(None)).await;
        assert!(
            matches!(out, Smoothed::Decided { waited: None, .. }),
            "{budget:?}: {out:?}"
        );
    }
}
