//! The fallback layer on fake stores: a shared store whose calls are lost ([`Counting`]) or
//! that fails in a given way ([`Down`]), and the memory store as the local log.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::limiter::fixtures::Counting;
use crate::limiter::memory::MemoryStore;
use crate::limiter::{Admission, Checked, WindowView};

/// A shared store that always fails with its error.
struct Down(StoreError);

#[async_trait]
impl Store for Down {
    async fn check(&self, _: &str, _: &Buckets<'_>, _: &[Limit]) -> Checked {
        Err(self.0.clone())
    }
    async fn inspect(&self, _: &str, _: &[Limit]) -> Result<WindowView, StoreError> {
        Err(self.0.clone())
    }
    async fn reset(&self, _: &str, _: &[Limit]) -> Result<(), StoreError> {
        Err(self.0.clone())
    }
    async fn refund(&self, _: Admission<'_>) -> Result<(), StoreError> {
        Err(self.0.clone())
    }
    async fn renew(&self, _: Admission<'_>) -> Result<Vec<u64>, StoreError> {
        Err(self.0.clone())
    }
    async fn read_shared(&self, _: &str, _: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Err(self.0.clone())
    }
    fn backend(&self) -> &'static str {
        "down"
    }
}

/// Counts what the layer reports.
#[derive(Default)]
struct Seen {
    answered: AtomicUsize,
    failed: AtomicUsize,
}

impl Observe for &'static Seen {
    fn answered(&self, _took: Duration) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
    fn failed(&self, _error: &StoreError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}

fn layer<O: Observe>(shared: Arc<dyn Store>, observe: O) -> Fallback<O> {
    let mut layer = Fallback::new(shared, observe);
    layer.set_local(Some(Arc::new(MemoryStore::new())));
    layer
}

async fn ask<O: Observe>(layer: &Fallback<O>, limits: &[Limit], local: bool) -> Decided {
    let buckets = Buckets::one("r:c");
    let ask = Ask {
        route: "r",
        buckets: &buckets,
        limits,
        local,
    };
    layer.decide(ask).await
}

fn admitted(d: &Decided) -> bool {
    d.result.as_ref().is_ok_and(|v| v.admitted)
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn lost_calls_then_answers_admit_at_most_the_limit() {
    let store = Arc::new(Counting::default());
    let layer = layer(store.clone(), ());
    let limits = [Limit::log(3, MINUTE)];
    store.lose_calls(true);
    let mut local = 0;
    for _ in 0..5 {
        let d = ask(&layer, &limits, true).await;
        assert_eq!(d.by, DecidedBy::Local);
        local += u32::from(admitted(&d));
    }
    assert_eq!(local, 3, "the local log admits the limit");
    // The store answers again, having seen none of them: it would admit 3 more. The store is
    // asked with what the local log left (nothing): the local log's denial, the store not asked.
    store.lose_calls(false);
    for _ in 0..5 {
        let d = ask(&layer, &limits, true).await;
        assert!(!admitted(&d), "past the limit: {d:?}");
    }
    assert_eq!(store.reached(), 0, "the local log held the whole limit");
}

#[tokio::test]
async fn the_local_log_starts_from_what_the_store_last_said() {
    let store = Arc::new(Counting::default());
    let layer = layer(store.clone(), ());
    let limits = [Limit::log(3, MINUTE)];
    for _ in 0..2 {
        let d = ask(&layer, &limits, true).await;
        assert_eq!((admitted(&d), d.by), (true, DecidedBy::Store));
    }
    let learned = layer.learned().get("r:c").expect("learned");
    assert_eq!(learned.held(0, &limits[0], Instant::now()), 2);
    store.lose_calls(true);
    let first = ask(&layer, &limits, true).await;
    assert_eq!((admitted(&first), first.by), (true, DecidedBy::Local));
    let second = ask(&layer, &limits, true).await;
    assert_eq!((admitted(&second), second.by), (false, DecidedBy::Local));
    let verdict = second.result.unwrap();
    assert_eq!(verdict.states[0].remaining, 0);
    assert!(verdict.states[0].reset <= MINUTE);
}

#[tokio::test]
async fn a_route_without_local_fallback_gets_the_error_and_learns_nothing() {
    static SEEN: Seen = Seen {
        answered: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
    };
    let store = Arc::new(Counting::default());
    let layer = layer(store.clone(), &SEEN);
    let limits = [Limit::log(3, MINUTE)];
    assert!(admitted(&ask(&layer, &limits, false).await));
    assert!(
        layer.learned().is_empty(),
        "learned only where it may be needed"
    );
    store.lose_calls(true);
    let d = ask(&layer, &limits, false).await;
    assert!(matches!(d.result, Err(StoreError::Timeout(_))), "{d:?}");
    assert_eq!(d.by, DecidedBy::Store);
    assert_eq!(SEEN.answered.load(Ordering::Relaxed), 2);
    assert_eq!(SEEN.failed.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn the_proxys_own_overload_is_shed_never_decided_locally() {
    static SEEN: Seen = Seen {
        answered: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
    };
    let layer = layer(Arc::new(Down(StoreError::Overloaded(9))), &SEEN);
    let d = ask(&layer, &[Limit::log(3, MINUTE)], true).await;
    assert!(matches!(d.result, Err(StoreError::Overloaded(9))), "{d:?}");
    assert_eq!(d.by, DecidedBy::Store);
    assert_eq!(SEEN.failed.load(Ordering::Relaxed), 0, "no store failure");
    // A failure of the store itself goes to the local log.
    let layer = layer_down(StoreError::Unavailable("gone".into()));
    assert_eq!(
        ask(&layer, &[Limit::log(3, MINUTE)], true).await.by,
        DecidedBy::Local
    );
}

fn layer_down(e: StoreError) -> Fallback {
    layer(Arc::new(Down(e)), ())
}

#[tokio::test]
async fn an_admission_is_given_back_where_it_was_recorded() {
    let shared: Arc<dyn Store> = Arc::new(Counting::default());
    let mut layer = Fallback::new(shared.clone(), ());
    assert!(layer.store_of(DecidedBy::Local).is_none());
    let local: Arc<dyn Store> = Arc::new(MemoryStore::new());
    layer.set_local(Some(local.clone()));
    assert!(Arc::ptr_eq(
        layer.store_of(DecidedBy::Store).unwrap(),
        &shared
    ));
    assert!(Arc::ptr_eq(
        layer.store_of(DecidedBy::Local).unwrap(),
        &local
    ));
}
