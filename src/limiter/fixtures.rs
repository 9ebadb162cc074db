//! Fixtures shared by the unit tests of the modules that render verdicts or wrap stores.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::*;

/// A memory store that counts the decisions reaching it: in front of it, a wrapper's own
/// answers (the coalescer's deny cache, `coalesce::fixture`) are the ones not counted.
/// While [`Counting::lose_calls`] is on, decisions never reach it: they time out, as calls
/// lost on the way to Redis. After [`Counting::answer_late_after`], answers linger on
/// their way back, as on a loaded proxy.
#[derive(Default)]
pub(crate) struct Counting {
    store: memory::MemoryStore,
    checks: AtomicUsize,
    lost: AtomicBool,
    /// Decisions answered at once before answers start lingering.
    prompt: AtomicUsize,
    /// How long a later answer lingers, in ms (0: never).
    late_ms: AtomicU64,
}

impl Counting {
    /// Decisions that reached the store so far.
    pub(crate) fn reached(&self) -> usize {
        self.checks.load(Ordering::Relaxed)
    }

    /// From now on, lose every decision (`true`) or let them through again.
    pub(crate) fn lose_calls(&self, lost: bool) {
        self.lost.store(lost, Ordering::SeqCst);
    }

    /// Answer the first `prompt` decisions at once and every later one `late` after it
    /// was decided.
    pub(crate) fn answer_late_after(&self, prompt: usize, late: Duration) {
        self.prompt.store(prompt, Ordering::SeqCst);
        let ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX);
        self.late_ms.store(ms, Ordering::SeqCst);
    }
}

#[async_trait]
impl Store for Counting {
    async fn check(&self, route: &str, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked {
        if self.lost.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout(Duration::from_millis(50)));
        }
        let earlier = self.checks.fetch_add(1, Ordering::Relaxed);
        let checked = self.store.check(route, buckets, limits).await;
        let late = self.late_ms.load(Ordering::SeqCst);
        if late > 0 && earlier >= self.prompt.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(late)).await;
        }
        checked
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        self.store.inspect(bucket, limits).await
    }

    async fn reset(&self, bucket: &str, limits: &[Limit]) -> Result<(), StoreError> {
        self.store.reset(bucket, limits).await
    }

    async fn refund(&self, admission: Admission<'_>) -> Result<(), StoreError> {
        self.store.refund(admission).await
    }

    async fn renew(&self, admission: Admission<'_>) -> Result<Vec<u64>, StoreError> {
        self.store.renew(admission).await
    }

    async fn read_shared(&self, hash: &str, field: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.read_shared(hash, field).await
    }
    fn backend(&self) -> &'static str {
        "counting"
    }
}

/// A denial by the first of two limits (full, room frees in 1.2 s); the second has 40
/// left and frees one in 30 s.
pub(crate) fn denied_by_the_first_of_two() -> Verdict {
    Verdict {
        admitted: false,
        recorded_at: None,
        recorded_each: Vec::new(),
        states: vec![
            LimitState {
                remaining: 0,
                reset: Duration::from_millis(1200),
            },
            LimitState {
                remaining: 40,
                reset: Duration::from_secs(30),
            },
        ],
    }
}
