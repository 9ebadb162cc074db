//! The sender against a fake backend: what goes out in one call, what a denial answers, and
//! the sender's hold on its lane.

use std::sync::Mutex;

use tokio::sync::oneshot::error::TryRecvError;

use super::*;
use crate::limiter::{LimitState, Verdict};

const LIMITS: [Limit; 1] = [Limit::log(1, Duration::from_secs(60))];

/// One lane; buckets starting with `hot` are full, the others admit; a call whose first bucket
/// starts with `silent` runs out its deadline (the backend says so), with `frozen` is never
/// answered, with `gone` finds the connection lost. Records every call, and how many the
/// sender failed on its deadline.
struct Fake {
    coalescer: Coalescer,
    calls: Mutex<Vec<Vec<String>>>,
    deadline: Duration,
    timed_out: Mutex<usize>,
    spawned: Mutex<usize>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Fake::with_deadline(Duration::from_secs(5))
    }

    fn with_deadline(deadline: Duration) -> Arc<Fake> {
        Arc::new(Fake {
            coalescer: Coalescer::new(1),
            calls: Mutex::new(Vec::new()),
            deadline,
            timed_out: Mutex::new(0),
            spawned: Mutex::new(0),
        })
    }

    /// The buckets of every call so far, in order.
    fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }

    /// Let the lane's sender run until the lane is idle (its busy period over; the sender may
    /// still wait for the bell).
    async fn idle(&self) {
        while !self.coalescer.lanes.get(0).is_idle() {
            tokio::task::yield_now().await;
        }
    }
}

fn verdict(admitted: bool) -> Verdict {
    Verdict {
        admitted,
        recorded_at: admitted.then_some(1),
        recorded_each: Vec::new(),
        states: vec![LimitState {
            remaining: 0,
            reset: Duration::from_secs(30),
        }],
    }
}

impl Backend for Fake {
    fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    fn lane_of(&self, _bucket: &str) -> usize {
        0
    }

    fn generation(&self) -> u64 {
        0
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        *self.spawned.lock().unwrap() += 1;
        drop(tokio::spawn(task));
    }

    fn deadline(&self) -> Duration {
        self.deadline
    }

    fn timed_out(&self, _error: &StoreError) {
        *self.timed_out.lock().unwrap() += 1;
    }

    async fn send(&self, batch: &[Pending]) -> Result<Vec<Checked>, StoreError> {
        let buckets: Vec<String> = batch.iter().map(|p| p.bucket.to_string()).collect();
        let first = buckets[0].clone();
        self.calls.lock().unwrap().push(buckets);
        if first.starts_with("silent") {
            return Err(StoreError::Timeout(Duration::from_secs(5)));
        }
        if first.starts_with("frozen") {
            std::future::pending::<()>().await;
        }
        if first.starts_with("gone") {
            return Err(StoreError::Unavailable("connection lost".into()));
        }
        let admits = |p: &Pending| !p.bucket.starts_with("hot");
        Ok(batch.iter().map(|p| Ok(verdict(admits(p)))).collect())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn what_arrives_together_goes_in_one_call_and_a_denial_is_remembered_while_busy() {
    let fake = Fake::new();
    let (hot_bucket, cold_bucket) = (Buckets::one("hot"), Buckets::one("cold"));
    let (hot, cold, hot_again) = tokio::join!(
        decide(&fake, &hot_bucket, &LIMITS),
        decide(&fake, &cold_bucket, &LIMITS),
        decide(&fake, &hot_bucket, &LIMITS),
    );
    assert!(!hot.unwrap().admitted && cold.unwrap().admitted && !hot_again.unwrap().admitted);
    assert_eq!(fake.calls(), [["hot", "cold", "hot"]]);
    // No deny cache: once the lane is idle, the denial answers no more.
    fake.idle().await;
    assert!(
        !decide(&fake, &Buckets::one("hot"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(fake.calls().len(), 2, "asked the backend again");
}

#[tokio::test(flavor = "current_thread")]
async fn with_a_deny_cache_a_denial_answers_without_a_call() {
    let fake = Fake::new();
    fake.coalescer.known().serve_cache(Duration::from_secs(10));
    assert!(
        !decide(&fake, &Buckets::one("hot"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
    fake.idle().await;
    assert!(
        !decide(&fake, &Buckets::one("hot"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(fake.calls().len(), 1, "the second was answered from memory");
    // Other limits are another question.
    let other = [Limit::log(2, Duration::from_secs(60))];
    assert!(
        !decide(&fake, &Buckets::one("hot"), &other)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(fake.calls().len(), 2);
}

/// A decision that started its lane's sender, and one queued after it, as `decide` leaves them.
fn queue_two(fake: &Fake) -> [oneshot::Receiver<Checked>; 2] {
    let mut lane = fake.coalescer.lanes.get(0);
    let known = &fake.coalescer.known;
    let (first, rx1) = oneshot::channel();
    assert!(matches!(
        lane.arrive(("r:a", None), &[], first, known, 0, Instant::now()),
        Arrival::Start
    ));
    let (tx, rx2) = oneshot::channel();
    assert!(matches!(
        lane.arrive(("r:c", None), &[], tx, known, 0, Instant::now()),
        Arrival::Send
    ));
    [rx1, rx2]
}

#[test]
fn a_draining_task_that_never_ran_releases_the_lane() {
    let fake = Fake::new();
    let mut rx = queue_two(&fake);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let task = Draining {
        backend: fake.clone(),
        lane: 0,
        finished: false,
    };
    runtime.spawn(drain(task));
    // Shut down before the task was ever polled (as at process exit).
    drop(runtime);
    assert!(
        !fake.coalescer.lanes.get(0).is_sending(),
        "later requests would queue forever"
    );
    // Answered by the drop (closed), not left waiting (empty).
    for rx in &mut rx {
        assert!(
            matches!(rx.try_recv(), Err(TryRecvError::Closed)),
            "the waiter is answered (batch dropped)"
        );
    }
    assert!(fake.calls().is_empty());
}

#[test]
fn a_finished_draining_task_leaves_the_lane_alone() {
    let fake = Fake::new();
    let mut rx = queue_two(&fake);
    let task = Draining {
        backend: fake.clone(),
        lane: 0,
        finished: true,
    };
    drop(task);
    // A finished task has handed `sending` on itself; its drop must not touch new waiters.
    assert!(fake.coalescer.lanes.get(0).is_sending());
    for rx in &mut rx {
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    }
}

/// A decision sent alone in a call (taken from the lane as the sender takes it) and one queued
/// behind that call, with their waiters.
fn one_sent_one_queued(fake: &Fake, sent: &str) -> (Vec<Pending>, [oneshot::Receiver<Checked>; 2]) {
    let mut lane = fake.coalescer.lanes.get(0);
    let known = &fake.coalescer.known;
    let (tx, rx1) = oneshot::channel();
    lane.arrive((sent, None), &LIMITS, tx, known, 0, Instant::now());
    let Next::Send(batch) = lane.next_batch() else {
        panic!("the first decision is sent")
    };
    let (tx, rx2) = oneshot::channel();
    lane.arrive(("queued", None), &LIMITS, tx, known, 0, Instant::now());
    (batch, [rx1, rx2])
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_that_runs_out_its_deadline_fails_what_queued_behind_it_at_once() {
    let fake = Fake::new();
    let (batch, [mut sent, mut queued]) = one_sent_one_queued(&fake, "silent");
    send_batch(&*fake, 0, batch, (0, Instant::now())).await;
    for rx in [&mut sent, &mut queued] {
        assert!(matches!(rx.try_recv(), Ok(Err(StoreError::Timeout(_)))));
    }
    assert_eq!(fake.calls(), [["silent"]], "the queued one was never sent");
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_that_fails_otherwise_leaves_the_queue_to_its_own_call() {
    let fake = Fake::new();
    let (batch, [mut sent, mut queued]) = one_sent_one_queued(&fake, "gone");
    send_batch(&*fake, 0, batch, (0, Instant::now())).await;
    assert!(matches!(
        sent.try_recv(),
        Ok(Err(StoreError::Unavailable(_)))
    ));
    assert!(matches!(queued.try_recv(), Err(TryRecvError::Empty)));
}

const SHORT: Duration = Duration::from_millis(50);

/// A decision whose call the backend never answers, sent: the lane has a call in flight.
async fn frozen_call(fake: &Arc<Fake>) -> tokio::task::JoinHandle<Checked> {
    let frozen = tokio::spawn({
        let fake = fake.clone();
        async move { decide(&fake, &Buckets::one("frozen"), &LIMITS).await }
    });
    while fake.calls().is_empty() {
        tokio::task::yield_now().await;
    }
    frozen
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_never_answered_fails_on_the_senders_timer() {
    let fake = Fake::with_deadline(SHORT);
    let started = Instant::now();
    let frozen = frozen_call(&fake).await;
    // Another call, sent while the first hangs, is answered: not failed with it.
    let cold = decide(&fake, &Buckets::one("cold"), &LIMITS).await;
    assert!(cold.unwrap().admitted);
    let frozen = tokio::time::timeout(SHORT * 40, frozen)
        .await
        .expect("the sender never failed the call")
        .unwrap();
    let waited = started.elapsed();
    assert!(matches!(frozen, Err(StoreError::Timeout(d)) if d == SHORT));
    assert_eq!(fake.calls(), [["frozen"], ["cold"]]);
    assert_eq!(
        *fake.timed_out.lock().unwrap(),
        1,
        "the backend learns of it"
    );
    assert!(waited >= SHORT, "failed early: {waited:?}");
    assert!(waited < SHORT * 20, "failed late: {waited:?}");
    // A later call is numbered past the expired one: it is answered.
    assert!(
        decide(&fake, &Buckets::one("cold"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_busy_lane_keeps_one_sender_and_an_idle_one_ends_after_a_deadline() {
    let fake = Fake::with_deadline(SHORT);
    for _ in 0..3 {
        assert!(
            decide(&fake, &Buckets::one("cold"), &LIMITS)
                .await
                .unwrap()
                .admitted
        );
    }
    assert_eq!(*fake.spawned.lock().unwrap(), 1, "one sender for the three");
    let idle_from = Instant::now();
    while fake.coalescer.lanes.get(0).is_sending() {
        assert!(
            idle_from.elapsed() < SHORT * 40,
            "the idle sender never ended"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(idle_from.elapsed() >= SHORT - Duration::from_millis(5));
    assert!(
        decide(&fake, &Buckets::one("cold"), &LIMITS)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(
        *fake.spawned.lock().unwrap(),
        2,
        "the next request started one again"
    );
}

/// With a call in flight, the first arrival defers the bell and those after it ride on it: one
/// call carries them all. A request dropped while its ring is deferred (its client gone) rings
/// as it goes, so what rode on its ring is still sent.
#[tokio::test(flavor = "current_thread")]
async fn arrivals_behind_a_call_in_flight_share_one_ring_even_when_its_ringer_is_dropped() {
    let fake = Fake::new();
    let frozen = frozen_call(&fake).await;
    let riders = |names: &'static [&'static str]| {
        names
            .iter()
            .map(|name| {
                let fake = fake.clone();
                tokio::spawn(async move { decide(&fake, &Buckets::one(name), &LIMITS).await })
            })
            .collect::<Vec<_>>()
    };
    for rider in riders(&["c0", "c1", "c2"]) {
        assert!(rider.await.unwrap().unwrap().admitted);
    }
    assert_eq!(fake.calls(), [vec!["frozen"], vec!["c0", "c1", "c2"]]);

    let ringer = Buckets::one("gone-early");
    let mut ringer = Box::pin(decide(&fake, &ringer, &LIMITS));
    let polled = std::future::poll_fn(|cx| Poll::Ready(ringer.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "its ring deferred");
    let rider = riders(&["c3"]).pop().unwrap();
    while fake.coalescer.lanes.get(0).queued() < 2 {
        tokio::task::yield_now().await;
    }
    drop(ringer);
    let rider = tokio::time::timeout(Duration::from_secs(1), rider)
        .await
        .expect("the ring went with the dropped request");
    assert!(rider.unwrap().unwrap().admitted);
    assert_eq!(
        fake.calls().last().unwrap(),
        &["c3"],
        "the dropped one not decided"
    );
    frozen.abort();
}
