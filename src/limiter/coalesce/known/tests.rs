//! The memory's rules, and the deny cache in front of a store that counts what reaches it.

use super::*;
use crate::limiter::fixtures::Counting;
use crate::limiter::LimitState;

fn limit(requests: u32, window: Duration) -> Limit {
    Limit::log(requests, window)
}

/// A deny cache in front of a counting memory store, and the count.
fn cache() -> (DenyCache, Arc<Counting>) {
    let store = Arc::new(Counting::default());
    (DenyCache::new(store.clone()), store)
}

/// Fill a one-request limit of bucket `b`: admitted, then denied.
async fn fill(cache: &DenyCache, limits: &[Limit]) {
    assert!(
        cache
            .check("r", &Buckets::one("b"), limits)
            .await
            .unwrap()
            .admitted
    );
    assert!(
        !cache
            .check("r", &Buckets::one("b"), limits)
            .await
            .unwrap()
            .admitted
    );
}

#[tokio::test]
async fn denies_locally_until_the_bucket_has_room_then_asks_again() {
    let (cache, store) = cache();
    let limits = [limit(2, Duration::from_millis(300))];
    assert!(
        cache
            .check("r", &Buckets::one("b"), &limits)
            .await
            .unwrap()
            .admitted
    );
    assert!(
        cache
            .check("r", &Buckets::one("b"), &limits)
            .await
            .unwrap()
            .admitted
    );
    let denied = cache.check("r", &Buckets::one("b"), &limits).await.unwrap();
    assert!(!denied.admitted);
    assert_eq!(store.reached(), 3, "the first denial comes from the store");
    let cached = cache.check("r", &Buckets::one("b"), &limits).await.unwrap();
    assert!(!cached.admitted);
    assert_eq!(store.reached(), 3, "the second one does not reach it");
    assert!(cached.states[0].reset <= denied.states[0].reset);
    tokio::time::sleep(denied.retry_after().unwrap() + Duration::from_millis(5)).await;
    assert!(
        cache
            .check("r", &Buckets::one("b"), &limits)
            .await
            .unwrap()
            .admitted,
        "room again: the store decides again"
    );
    assert_eq!(store.reached(), 4);
}

#[tokio::test]
async fn reload_clears_the_cache() {
    let (cache, store) = cache();
    let limits = [limit(1, Duration::from_secs(60))];
    fill(&cache, &limits).await;
    cache.rules_changed();
    assert!(
        !cache
            .check("r", &Buckets::one("b"), &limits)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(store.reached(), 3, "asked the store again after the reload");
    let raised = [limit(3, Duration::from_secs(60))];
    assert!(
        cache
            .check("r", &Buckets::one("b"), &raised)
            .await
            .unwrap()
            .admitted,
        "raised limit admits at once"
    );
}

#[tokio::test]
async fn a_denial_only_binds_the_limits_it_was_decided_under() {
    // A request that began before a reload may insert its old-limit denial after the
    // reload cleared the cache: requests under the new limits must not see it.
    let (cache, store) = cache();
    fill(&cache, &[limit(1, Duration::from_secs(60))]).await;
    let new = [limit(2, Duration::from_secs(60))];
    assert!(
        cache
            .check("r", &Buckets::one("b"), &new)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(store.reached(), 3);
}

fn denial(reset: Duration) -> Verdict {
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

const STAMP: Stamp = Stamp {
    generation: 3,
    epoch: 1,
};

#[test]
fn a_denial_answers_only_under_its_stamp() {
    let known = KnownDenials::new(Duration::from_secs(1));
    let limits = [limit(1, Duration::from_secs(60))];
    let now = Instant::now();
    known.learn("b", &limits, &denial(Duration::from_secs(30)), now, STAMP);
    assert!(known.verdict("b", &limits, STAMP, now).is_some());
    let next_generation = Stamp {
        generation: 4,
        ..STAMP
    };
    assert!(known.verdict("b", &limits, next_generation, now).is_none());
    let next_epoch = Stamp { epoch: 2, ..STAMP };
    assert!(known.verdict("b", &limits, next_epoch, now).is_none());
}

#[test]
fn a_denial_is_trusted_for_max_age_at_most_and_then_swept() {
    let known = KnownDenials::new(Duration::from_secs(1));
    let limits = [limit(1, Duration::from_secs(60))];
    let sent = Instant::now();
    known.learn("b", &limits, &denial(Duration::from_secs(30)), sent, STAMP);
    let aged = known.verdict("b", &limits, STAMP, sent + Duration::from_millis(400));
    assert_eq!(aged.unwrap().states[0].reset, Duration::from_millis(29_600));
    let late = sent + Duration::from_secs(1);
    assert!(known.verdict("b", &limits, STAMP, late).is_none());
    known.sweep(late, STAMP.generation);
    assert!(known.denied.is_empty());
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
    known.learn("b", &[], &admitted, Instant::now(), STAMP);
    assert!(known.denied.is_empty());
}

#[tokio::test]
async fn a_cache_reading_a_stores_memory_answers_what_the_store_learned_and_learns_nothing() {
    let store = Arc::new(Counting::default());
    let known = Arc::new(KnownDenials::new(Duration::from_secs(1)));
    let cache = DenyCache::reading(store.clone(), known.clone());
    let limits = [limit(1, Duration::from_secs(60))];
    // The store itself learns (here: would learn) its denials: the cache adds none of its own.
    fill(&cache, &limits).await;
    assert!(
        !cache
            .check("r", &Buckets::one("b"), &limits)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(store.reached(), 3, "nothing learned by the cache");
    // What the store learns, under the cache's stamp (epoch 0), answers at the cache.
    let stamp = Stamp {
        generation: 0,
        epoch: 0,
    };
    let now = Instant::now();
    known.learn("b", &limits, &denial(Duration::from_secs(30)), now, stamp);
    assert!(
        !cache
            .check("r", &Buckets::one("b"), &limits)
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(store.reached(), 3, "answered from the shared memory");
    assert!(
        known.outlives_lanes(),
        "the lanes keep denials for the cache"
    );
}
