//! Limits of one decision in several buckets (`limits[].key`), all-or-nothing on the memory
//! store: see [`MemoryStore::check_stacked`].

use std::future::Future as _;

use super::MemoryStore;
use crate::limiter::buckets::{reserve_in_order, time_of, Step};
use crate::limiter::{Buckets, Change, Limit, LimitState, Verdict};

impl MemoryStore {
    /// Decide limits in several buckets of `route`: each bucket's limits under its shard's
    /// lock, one bucket after another in the route's key order, what was reserved given back
    /// at once when a later bucket denies ([`reserve_in_order`]). Not every lock held at once:
    /// two buckets may share a shard (one mutex), a bucket's decision may evict in its shard
    /// and fall back to the summary, and all of that is written for one locked shard; the
    /// release follows its denial with no wait in between, so the over-count lasts
    /// microseconds and is never an admission past a limit.
    pub(super) fn check_stacked(
        &self,
        route: &str,
        buckets: &Buckets<'_>,
        limits: &[Limit],
    ) -> Verdict {
        let mut groups = buckets.groups(limits.len());
        // A bucket with no room is decided first, so nothing is reserved for a request it
        // denies: a client at its own limit never holds a place in a shared bucket, even for
        // the microseconds of a reservation, whichever of them the route's key is (issue 52
        // row 16: fresh clients refused in 5-8 of 300 probes while the shared limit had room).
        let full = (1..groups.len()).find(|&g| !self.peek(route, &groups[g], limits).0);
        if let Some(full) = full {
            groups[..=full].rotate_right(1);
        }
        let parts: Vec<Step> = (groups.iter())
            .map(|(_, members)| Step {
                members: members.clone(),
            })
            .collect();
        let bucket_of = |members: &[usize]| buckets.of(members[0]);
        let decide = |sub: Vec<Limit>, members: &[usize]| {
            let verdict = self.check_now_in(route, bucket_of(members), &sub);
            std::future::ready(Ok(verdict))
        };
        let release = |sub: Vec<Limit>, members: &[usize], at: u64| {
            self.refund_now((route, bucket_of(members)), &sub, at, Change::GiveBack);
            std::future::ready(())
        };
        let decided = reserve_in_order(limits, &parts, decide, release);
        // Every future above is ready: this completes on its first poll.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let polled = std::pin::pin!(decided).poll(&mut cx);
        let mut verdict = match polled {
            std::task::Poll::Ready(Ok(verdict)) => verdict,
            _ => unreachable!("the memory store's decisions never wait or fail"),
        };
        let first_denied = (groups[0].1.iter()).any(|&i| verdict.states[i].remaining == 0);
        if full.is_some() && !verdict.admitted && first_denied {
            // Denied by the full bucket before any other was reached: each other bucket's
            // limits as they stand, as one atomic decision would report them.
            for group in &groups[1..] {
                let (_, states) = self.peek(route, group, limits);
                for (&i, state) in group.1.iter().zip(states) {
                    verdict.states[i] = state;
                }
            }
        }
        verdict
    }

    /// Would the limits of `group` (a bucket and the indexes of its limits) admit a request,
    /// and each one's state as it stands?
    fn peek(
        &self,
        route: &str,
        (bucket, members): &(&str, Vec<usize>),
        limits: &[Limit],
    ) -> (bool, Vec<LimitState>) {
        let sub: Vec<Limit> = members.iter().map(|&i| limits[i]).collect();
        match self.arenas.load().get(route) {
            Some(arena) => arena.peek(self.hash(bucket), &sub, || self.now_us()),
            // No arena yet: no client of the route has been counted.
            None => {
                let empty = |l: &Limit| LimitState {
                    remaining: l.requests,
                    reset: l.window,
                };
                (true, sub.iter().map(empty).collect())
            }
        }
    }

    /// Renew an admission's leases, each limit in its bucket (see
    /// [`Store::renew`](crate::limiter::Store::renew)).
    pub(super) fn renew_now(
        &self,
        route: &str,
        buckets: &Buckets<'_>,
        limits: &[Limit],
        recorded_at: &[u64],
    ) -> Vec<u64> {
        let mut renewed = vec![0; limits.len()];
        let Some(arena) = self.arenas.load().get(route).cloned() else {
            return renewed;
        };
        for (bucket, members) in buckets.groups(limits.len()) {
            for i in members {
                let at = time_of(recorded_at, i);
                renewed[i] = arena.renew(self.hash(bucket), &limits[i], at, || self.now_us());
            }
        }
        renewed
    }

    /// Give back an admission of `bucket` recorded at `at` under `limits`, or charge them now
    /// ([`Change::Charge`]: see [`MemoryStore::charge_now`]).
    pub(super) fn refund_now(
        &self,
        (route, bucket): (&str, &str),
        limits: &[Limit],
        at: u64,
        change: Change,
    ) {
        match change {
            Change::Charge => self.charge_now(route, bucket, limits),
            Change::GiveBack => {
                if let Some(arena) = self.arenas.load().get(route) {
                    arena.refund(self.hash(bucket), limits, at);
                }
            }
        }
    }
}
