//! What this proxy last learned from the shared store about each bucket, so that its own log
//! (`on_error = "local"`) does not start empty when the store goes away mid-window.
//!
//! Every verdict the shared store gives (an admission, a denial, or a denial the deny cache
//! answered from) says, per limit, how much is left (`remaining`) and when the oldest entry
//! leaves the window (`reset`). From those, `count = requests - remaining` entries were in the
//! window at that moment: the oldest leaves at `reset`, and none of the others later than a
//! full window after the moment they were learned (they were all recorded before it).
//!
//! During an outage a decision is made by the local log against each limit *reduced* by what
//! is still held of the learned count ([`LearnedBucket::held`]): so the local log admits at
//! most `requests - held` on top of what Redis had admitted. Summed over proxies: the one that
//! asked last learned everything Redis had admitted, so in an outage the proxies together admit
//! at most `proxies × requests` in any window, **including** what Redis admitted before it.
//!
//! That sum needs one more rule. A call that timed out may still have reached the store (its
//! answer was lost), or may reach it late: the store then counts requests this proxy decided
//! locally, and learns nothing of the ones it admitted locally. Once the store answers again, a
//! proxy that admitted from its own log in a bucket ([`Learned::mark_local`]) asks the store with
//! every limit reduced by what its own log still holds there, until that leaves the window. So
//! every admission the store makes fits with the local ones of the proxy that asked, and the sum
//! stays at most `proxies × requests` (one proxy: `requests`), however late the calls arrive.
//!
//! Answers are kept in the order their decisions were asked, not the order they are read: with
//! several calls in flight, the task holding an older answer ("4 of 50 used") may run after
//! the one holding a newer one ("50 of 50"), and overwriting would forget most of what the
//! store had admitted (an audit let 96 of 50 through in one window that way). A lane sends and
//! Redis runs a bucket's decisions in the order they were asked, so the one asked last is the
//! latest the store said.
//!
//! What is learned is kept per bucket, not per client: a limit with a key of its own (a
//! `global` one, or one per org) is learned under its own bucket from whichever client asked
//! last, so a new client arriving in an outage meets the shared bucket as the store last
//! showed it, full if it was full (issue 52 row 2: 40 of 20 before, with one proxy).
//!
//! The memory is bounded: [`MAX_LEARNED`] buckets. A full shard first drops what has slid out
//! of every window, then the buckets that had one entry (a flood of made-up keys), then the
//! emptiest half of the rest: a bucket at its limit is forgotten last, only when more than half
//! of a shard is at its limit (issue 52 row 3: a flood of two-request keys used to clear the
//! whole shard, and the victim got 10 of 5 in the outage). A bucket forgotten is counted from
//! empty in an outage, as before this existed.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::bucket::LearnedBucket;
use crate::limiter::{Buckets, IdHasher, Limit, LimitState, Verdict};

/// Buckets by the hash of their key (already a hash: not hashed again).
type Shard = Mutex<HashMap<u64, LearnedBucket, BuildHasherDefault<IdHasher>>>;

/// Most buckets remembered, over all shards (about 100 bytes each).
pub const MAX_LEARNED: usize = 1 << 16;

const SHARDS: usize = 16;

/// The learned buckets, by the hash of their key.
pub struct Learned {
    shards: Box<[Shard]>,
    /// The latest `local_until` of any bucket, in ms since `epoch`: before it, no bucket needs
    /// looking up ([`Learned::is_local`] is on every request's path).
    any_local_until_ms: AtomicU64,
    epoch: Instant,
    per_shard: usize,
    /// A secret per process, so a client cannot choose keys that share a hash with another's.
    seed: u64,
}

impl Default for Learned {
    fn default() -> Self {
        Learned::with_capacity(MAX_LEARNED)
    }
}

impl Learned {
    /// Remembering at most about `capacity` buckets.
    pub fn with_capacity(capacity: usize) -> Learned {
        Learned {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            any_local_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            seed: fastrand::u64(..),
        }
    }

    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> 60) as usize % SHARDS]
    }

    fn hash(&self, bucket: &str) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(bucket.as_bytes(), self.seed)
    }

    /// Remember what the store's `verdict` for `bucket` under `limits`, asked at `asked`, said
    /// at `now`; unless an answer to a decision asked later is already remembered.
    pub fn learn(
        &self,
        bucket: &str,
        (limits, verdict): (&[Limit], &Verdict),
        asked: Instant,
        now: Instant,
    ) {
        let hash = self.hash(bucket);
        let mut learned = LearnedBucket::from_verdict(limits, verdict, now);
        let mut shard = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
        let known = shard.get(&hash);
        if known.and_then(|b| b.asked).is_some_and(|a| a > asked) {
            return;
        }
        // What the local log holds is not the store's to forget.
        learned.local_until = known.and_then(|b| b.local_until);
        learned.asked = Some(asked);
        self.make_room(&mut shard, hash, now);
        shard.insert(hash, learned);
    }

    /// Room for `hash` in a full `shard`: first drop what has slid out of every window, then
    /// the buckets that had one entry, then the emptiest half of what is left (see the module
    /// documentation).
    fn make_room(
        &self,
        shard: &mut HashMap<u64, LearnedBucket, BuildHasherDefault<IdHasher>>,
        hash: u64,
        now: Instant,
    ) {
        if shard.len() < self.per_shard || shard.contains_key(&hash) {
            return;
        }
        shard.retain(|_, b| !b.spent(now) && !b.single());
        if shard.len() < self.per_shard {
            return;
        }
        // Half the shard at once, so a flood pays this O(n) pass once per half-shard of keys.
        let mut fills: Vec<u32> = shard.values().map(LearnedBucket::fill).collect();
        let mid = fills.len() / 2;
        let median = *fills.select_nth_unstable(mid).1;
        let mut excess = shard.len() - self.per_shard / 2;
        let passes: [fn(u32, u32) -> bool; 2] = [|f, m| f >= m, |f, m| f > m];
        for keep in passes {
            shard.retain(|_, b| {
                if excess == 0 || keep(b.fill(), median) {
                    return true;
                }
                excess -= 1;
                false
            });
        }
    }

    /// This proxy admitted a request of `bucket` from its own log: until `until` (when that
    /// admission has left every window) the store is asked with the limits reduced by what the
    /// local log holds of the bucket.
    pub fn mark_local(&self, bucket: &str, until: Instant) {
        let hash = self.hash(bucket);
        let mut shard = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
        self.make_room(&mut shard, hash, Instant::now());
        let b = shard.entry(hash).or_default();
        b.local_until = b.local_until.max(Some(until));
        let ms = until.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        self.any_local_until_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// True when this proxy's own log may still hold admissions of `bucket` at `now`.
    pub fn is_local(&self, bucket: &str, now: Instant) -> bool {
        let now_ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        if now_ms >= self.any_local_until_ms.load(Ordering::Relaxed) {
            return false;
        }
        let hash = self.hash(bucket);
        let shard = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
        shard
            .get(&hash)
            .and_then(|b| b.local_until)
            .is_some_and(|t| now < t)
    }

    /// What was learned of `bucket`, if anything.
    pub fn get(&self, bucket: &str) -> Option<LearnedBucket> {
        let hash = self.hash(bucket);
        let shard = self.shard(hash).lock().unwrap_or_else(|e| e.into_inner());
        shard.get(&hash).cloned()
    }

    /// Remember the store's `verdict` over `buckets`: each bucket's limits under that bucket,
    /// so a limit shared by many clients is learned once for all of them.
    pub fn learn_each(
        &self,
        buckets: &Buckets<'_>,
        (limits, verdict): (&[Limit], &Verdict),
        asked: Instant,
        now: Instant,
    ) {
        if buckets.is_one() {
            return self.learn(buckets.first(), (limits, verdict), asked, now);
        }
        for (bucket, members) in buckets.groups(limits.len()) {
            let sub: SmallVec<[Limit; 4]> = members.iter().map(|&i| limits[i]).collect();
            let states: Vec<LimitState> = members.iter().map(|&i| verdict.states[i]).collect();
            let part = Verdict {
                admitted: verdict.admitted,
                states,
                recorded_at: None,
                recorded_each: Vec::new(),
            };
            self.learn(bucket, (&sub, &part), asked, now);
        }
    }

    /// Per limit of `limits` over `buckets`: how many learned entries its bucket still holds
    /// at `now`, and when the next of them frees; `None` when nothing is learned of any.
    pub fn held(
        &self,
        buckets: &Buckets<'_>,
        limits: &[Limit],
        now: Instant,
    ) -> Option<Vec<(u32, Duration)>> {
        let mut held = vec![(0, Duration::ZERO); limits.len()];
        let mut any = false;
        for (bucket, members) in buckets.groups(limits.len()) {
            let Some(learned) = self.get(bucket) else {
                continue;
            };
            any = true;
            for (j, &i) in members.iter().enumerate() {
                let count = learned.held(j, &limits[i], now).min(limits[i].requests);
                held[i] = (count, learned.next_free(j, now));
            }
        }
        any.then_some(held)
    }

    /// [`Learned::mark_local`] every bucket of `buckets`' first `limits` limits.
    pub fn mark_local_each(&self, buckets: &Buckets<'_>, limits: usize, until: Instant) {
        self.mark_local(buckets.first(), until);
        for i in 0..limits {
            if buckets.of(i) != buckets.first() {
                self.mark_local(buckets.of(i), until);
            }
        }
    }

    /// True when this proxy's own log may still hold admissions of any bucket of `buckets`.
    pub fn is_local_any(&self, buckets: &Buckets<'_>, limits: usize, now: Instant) -> bool {
        self.is_local(buckets.first(), now)
            || (0..limits)
                .any(|i| buckets.of(i) != buckets.first() && self.is_local(buckets.of(i), now))
    }

    /// Buckets remembered.
    pub fn len(&self) -> usize {
        let len = |s: &Shard| s.lock().map_or(0, |s| s.len());
        self.shards.iter().map(len).sum()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitState;

    fn verdict(admitted: bool, remaining: u32, reset: Duration) -> Verdict {
        Verdict {
            admitted,
            recorded_at: admitted.then_some(1),
            recorded_each: Vec::new(),
            states: vec![LimitState { remaining, reset }],
        }
    }

    #[test]
    fn an_older_answer_read_later_does_not_replace_a_newer_one() {
        let learned = Learned::with_capacity(64);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let limit = Limit::log(50, Duration::from_secs(10));
        // Asked second, read first: the store was full.
        let full = verdict(false, 0, Duration::from_secs(10));
        learned.learn("k", (&[limit], &full), t0 + ms(2), t0 + ms(5));
        // Asked first, read later: 4 of 50 at the time.
        let early = verdict(true, 46, Duration::from_secs(10));
        learned.learn("k", (&[limit], &early), t0 + ms(1), t0 + ms(6));
        let b = learned.get("k").unwrap();
        assert_eq!(b.held(0, &limit, t0 + ms(7)), 50);
        // A decision asked later still replaces it.
        learned.learn("k", (&[limit], &early), t0 + ms(8), t0 + ms(9));
        assert_eq!(learned.get("k").unwrap().held(0, &limit, t0 + ms(10)), 4);
    }

    #[test]
    fn a_full_map_forgets_spent_and_single_entry_buckets_first() {
        let t0 = Instant::now();
        let limit = Limit::log(10, Duration::from_secs(60));
        let learned = Learned::with_capacity(SHARDS * 4);
        let full = verdict(false, 0, Duration::from_secs(30));
        learned.learn("victim", (&[limit], &full), t0, t0);
        for i in 0..10_000 {
            let one = verdict(true, 9, Duration::from_secs(60));
            learned.learn(&format!("flood-{i}"), (&[limit], &one), t0, t0);
        }
        assert!(learned.len() <= SHARDS * 4);
        let victim = learned.get("victim").expect("the victim is remembered");
        assert_eq!(victim.held(0, &limit, t0), 10);
    }

    /// Issue 52 row 3: a flood of keys with two requests each (not single) used to clear the
    /// whole shard; now the emptiest half goes and a bucket at its limit stays, while one
    /// bucket at 4 of 5 outlives buckets at 2 of 5.
    #[test]
    fn a_full_map_keeps_buckets_at_their_limit_over_a_two_request_flood() {
        let t0 = Instant::now();
        let limit = Limit::log(5, Duration::from_secs(60));
        let learned = Learned::with_capacity(SHARDS * 64);
        let full = verdict(false, 0, Duration::from_secs(30));
        learned.learn("victim", (&[limit], &full), t0, t0);
        learned.learn(
            "near",
            (&[limit], &verdict(true, 1, Duration::from_secs(30))),
            t0,
            t0,
        );
        for i in 0..200_000 {
            let two = verdict(true, 3, Duration::from_secs(60));
            learned.learn(&format!("flood-{i}"), (&[limit], &two), t0, t0);
            assert!(learned.len() <= SHARDS * 64);
        }
        let victim = learned.get("victim").expect("the victim is remembered");
        assert_eq!(victim.held(0, &limit, t0), 5);
        let near = learned.get("near").expect("4 of 5 outlives 2 of 5");
        assert_eq!(near.held(0, &limit, t0), 4);
        // A shard is halved, never cleared: at least half the capacity stays remembered.
        assert!(learned.len() >= SHARDS * 32, "{}", learned.len());
    }

    /// Issue 52 row 2: a limit with a key of its own is learned under that key, so a client
    /// that never asked meets it as the store last showed it to anyone.
    #[test]
    fn a_shared_bucket_is_learned_for_every_client() {
        let t0 = Instant::now();
        let own = Limit::log(100, Duration::from_secs(60));
        let shared = Limit::log(20, Duration::from_secs(60));
        let rest = vec!["r:global".to_string()];
        let learned = Learned::with_capacity(64);
        let answer = Verdict {
            admitted: false,
            recorded_at: None,
            recorded_each: Vec::new(),
            states: vec![
                LimitState {
                    remaining: 99,
                    reset: Duration::from_secs(60),
                },
                LimitState {
                    remaining: 0,
                    reset: Duration::from_secs(40),
                },
            ],
        };
        let alice = Buckets::stacked("r:ip:1", &rest, &[0, 1]);
        learned.learn_each(&alice, (&[own, shared], &answer), t0, t0);
        let bob = Buckets::stacked("r:ip:2", &rest, &[0, 1]);
        let held = learned.held(&bob, &[own, shared], t0).expect("learned");
        assert_eq!(held[0].0, 0, "bob's own bucket: nothing learned");
        assert_eq!(
            held[1],
            (20, Duration::from_secs(40)),
            "the global bucket: full"
        );
        // A local admission in the shared bucket is seen from every client's request.
        learned.mark_local_each(&alice, 2, t0 + Duration::from_secs(60));
        assert!(learned.is_local_any(&bob, 2, t0));
    }

    #[test]
    fn a_local_admission_is_remembered_until_it_leaves_and_survives_a_store_answer() {
        let learned = Learned::with_capacity(64);
        let now = Instant::now();
        assert!(!learned.is_local("a", now));
        learned.mark_local("a", now + Duration::from_secs(1));
        assert!(learned.is_local("a", now));
        assert!(!learned.is_local("b", now), "another bucket");
        let limit = Limit::log(3, Duration::from_secs(60));
        let answer = verdict(true, 2, Duration::from_secs(60));
        learned.learn("a", (&[limit], &answer), now, now);
        assert!(
            learned.is_local("a", now),
            "a store answer does not forget it"
        );
        assert!(!learned.is_local("a", now + Duration::from_secs(2)));
    }
}
