//! One lane's state (see `batch.rs`): is a call in flight, what waits for the next one, when
//! the lane last got an answer, and which buckets its calls found full.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::batch::MAX_PENDING;
use crate::limiter::{Limit, StoreError, Verdict};

/// A remembered denial is trusted for at most this long (it is dropped sooner when the lane
/// goes idle): a `FLUSHALL` or failover on a kept connection may have freed the bucket.
const MAX_DENIAL_AGE: Duration = Duration::from_secs(1);

/// Most denials a lane remembers; past it new ones are simply not remembered (correct, only
/// slower), so rotating keys cannot grow memory.
const MAX_DENIALS: usize = MAX_PENDING;

/// Where a verdict goes.
pub(super) type Answer = oneshot::Sender<Result<Verdict, StoreError>>;

/// Every lane of a store.
pub(super) struct Lanes(Box<[Mutex<Lane>]>);

impl Lanes {
    /// `count` idle lanes.
    pub(super) fn new(count: usize) -> Lanes {
        Lanes((0..count).map(|_| Mutex::default()).collect())
    }

    /// Lane `i`, locked.
    pub(super) fn get(&self, i: usize) -> MutexGuard<'_, Lane> {
        // The lock guards plain data: a panic while holding it leaves it usable.
        self.0[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One queued decision and where its verdict goes.
pub(super) struct Pending {
    pub(super) bucket: Box<str>,
    pub(super) limits: Box<[Limit]>,
    pub(super) verdict: Answer,
}

/// What a decision arriving at a lane does next.
pub(super) enum Arrival {
    /// The lane knows the bucket is full: this is the verdict.
    Known(Verdict),
    /// Queued on an idle lane: the caller starts the lane's sending task.
    Start,
    /// Queued behind the call in flight; the verdict comes through the channel.
    Queued,
    /// The queue is full: answer at once.
    Overloaded,
}

/// A bucket a call of this lane found full.
struct Denial {
    limits: Box<[Limit]>,
    verdict: Verdict,
    /// When the call that found it was sent (the proof's time base, see `deny_cache.rs`).
    sent: Instant,
    /// Until then no request for the bucket can be admitted.
    until: Instant,
    /// The store's generation before that call.
    generation: u64,
}

/// See the module documentation.
#[derive(Default)]
pub(super) struct Lane {
    sending: bool,
    pending: Vec<Pending>,
    last_answer: Option<Instant>,
    denied: HashMap<Box<str>, Denial>,
}

impl Lane {
    /// A decision for `bucket` arrives at `now`; `verdict` is where its answer goes if queued.
    pub(super) fn arrive(
        &mut self,
        bucket: &str,
        limits: &[Limit],
        verdict: Answer,
        generation: u64,
        now: Instant,
    ) -> Arrival {
        if let Some(known) = self.known(bucket, limits, generation, now) {
            return Arrival::Known(known);
        }
        if self.pending.len() >= MAX_PENDING {
            return Arrival::Overloaded;
        }
        self.pending.push(Pending {
            bucket: bucket.into(),
            limits: limits.into(),
            verdict,
        });
        if self.sending {
            Arrival::Queued
        } else {
            self.sending = true;
            Arrival::Start
        }
    }

    /// A call of this lane was answered at `now`.
    pub(super) fn answered(&mut self, now: Instant) {
        self.last_answer = Some(now);
    }

    /// When a call of this lane was last answered.
    pub(super) fn last_answer(&self) -> Option<Instant> {
        self.last_answer
    }

    /// True while the lane's sending task runs.
    #[cfg(test)]
    pub(super) fn is_sending(&self) -> bool {
        self.sending
    }

    /// `verdict` came back for `bucket` from a call sent at `sent` under `generation`: a
    /// denial is remembered (see [`Lane::answer_known`]).
    pub(super) fn learn(
        &mut self,
        bucket: &str,
        limits: &[Limit],
        verdict: &Verdict,
        sent: Instant,
        generation: u64,
    ) {
        let Some(wait) = verdict.retry_after() else {
            return;
        };
        if self.denied.len() >= MAX_DENIALS {
            let now = Instant::now();
            self.denied.retain(|_, d| d.until > now);
        }
        if self.denied.len() >= MAX_DENIALS && !self.denied.contains_key(bucket) {
            return;
        }
        let denial = Denial {
            limits: limits.into(),
            verdict: verdict.clone(),
            sent,
            until: sent + wait.min(MAX_DENIAL_AGE),
            generation,
        };
        self.denied.insert(bucket.into(), denial);
    }

    /// Answer at once every queued decision whose bucket is known to be full.
    pub(super) fn answer_known(&mut self, generation: u64) {
        if self.denied.is_empty() {
            return;
        }
        let now = Instant::now();
        let known = &self.denied;
        self.pending.retain_mut(|p| {
            let Some(d) = known.get(&p.bucket) else {
                return true;
            };
            if *d.limits != *p.limits || d.generation != generation || now >= d.until {
                return true;
            }
            // Swap in a dead sender: the real one is consumed by answering.
            let (dead, _) = oneshot::channel();
            let answer = std::mem::replace(&mut p.verdict, dead);
            let _ = answer.send(Ok(d.verdict.aged(now - d.sent)));
            false
        });
    }

    /// The remembered denial for `bucket`, aged to `now`, if it is still certain.
    fn known(
        &self,
        bucket: &str,
        limits: &[Limit],
        generation: u64,
        now: Instant,
    ) -> Option<Verdict> {
        let d = self.denied.get(bucket)?;
        let certain = *d.limits == *limits && d.generation == generation && now < d.until;
        certain.then(|| d.verdict.aged(now - d.sent))
    }

    /// Forget what the lane knows of `bucket` (an operator reset it).
    pub(super) fn forget(&mut self, bucket: &str) {
        self.denied.remove(bucket);
    }

    /// The next batch (at most `max` decisions), or `None` when nothing waits: the lane is idle
    /// again and the next request sends its own call.
    pub(super) fn next_batch(&mut self, max: usize) -> Option<Vec<Pending>> {
        if self.pending.is_empty() {
            self.release();
            return None;
        }
        let n = self.pending.len().min(max);
        Some(self.pending.drain(..n).collect())
    }

    /// Idle again, whatever waited: the waiters are returned to be dropped (they see their
    /// batch dropped).
    pub(super) fn release(&mut self) -> Vec<Pending> {
        self.sending = false;
        self.denied.clear();
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitState;

    const LIMITS: [Limit; 1] = [Limit::log(1, Duration::from_secs(60))];

    fn denial() -> Verdict {
        Verdict {
            admitted: false,
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
            Arrival::Queued
        ));
    }

    #[test]
    fn an_admission_teaches_nothing() {
        let mut lane = Lane::default();
        let admitted = Verdict {
            admitted: true,
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
        assert!(lane.next_batch(64).is_some());
        assert!(lane.next_batch(64).is_none());
        assert!(lane.denied.is_empty() && !lane.sending);
    }
}
