//! Limits of one decision in several buckets (`limits[].key`) on Redis. One Redis (or the
//! master behind Sentinel) holds every key: the decision is one script call, whose keys simply
//! name different buckets, atomic as any other. A Cluster cannot run one script over keys in
//! different hash slots: the limits are decided per slot, one slot's call after another, what
//! earlier slots reserved given back (the refund script) when a later slot denies
//! ([`reserve_in_order`]): a brief over-count, never an admission past a limit.
//!
//! The slots are taken in the route's key order ([`Buckets::groups`]: the slot of the route's
//! own bucket first, a `global` limit's last), not in slot number order: either order is one
//! fixed order for every request of the route on every proxy, which is what keeps two requests
//! over the same buckets from each holding one and losing the other; the key order also keeps
//! the shared bucket last, so a reservation there is never given back and a client at its own
//! limit never holds, even briefly, what every other client needs.

use super::RedisStore;
use crate::limiter::buckets::{reserve_in_order, time_of, Step};
use crate::limiter::{Buckets, Change, Checked, Limit, StoreError};

/// `members`' buckets as [`Buckets`] parts: each limit its own entry (texts may repeat).
struct Owned {
    each: Vec<String>,
    of_limit: Vec<u8>,
}

impl Owned {
    fn of(buckets: &Buckets<'_>, members: &[usize]) -> Owned {
        let mut each: Vec<String> = Vec::new();
        let mut of_limit = Vec::with_capacity(members.len());
        for &i in members {
            let bucket = buckets.of(i);
            let k = match each.iter().position(|b| b == bucket) {
                Some(k) => k,
                None => {
                    each.push(bucket.to_owned());
                    each.len() - 1
                }
            };
            // At most `MAX_LIMIT_KEYS` + 1 distinct buckets per route (validated).
            of_limit.push(u8::try_from(k + 1).unwrap_or(u8::MAX));
        }
        Owned { each, of_limit }
    }

    fn buckets(&self) -> Buckets<'_> {
        Buckets::stacked(&self.each[0], &self.each, &self.of_limit)
    }
}

impl RedisStore {
    /// See the module documentation.
    pub(super) async fn decide_stacked(&self, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked {
        // One part per slot, in the order its first bucket comes in the route's key order.
        let mut lanes: Vec<(usize, Vec<usize>)> = Vec::new();
        for (bucket, members) in buckets.groups(limits.len()) {
            let lane = self.inner.target.lane_of(bucket);
            match lanes.iter_mut().find(|(l, _)| *l == lane) {
                Some((_, all)) => all.extend(members),
                None => lanes.push((lane, members)),
            }
        }
        if lanes.len() == 1 {
            return self.decide(buckets, limits).await;
        }
        let parts: Vec<Step> = (lanes.into_iter())
            .map(|(_, members)| Step { members })
            .collect();
        let decide = |sub: Vec<Limit>, members: &[usize]| {
            let owned = Owned::of(buckets, members);
            async move { self.decide(&owned.buckets(), &sub).await }
        };
        let release = |sub: Vec<Limit>, members: &[usize], at: u64| {
            let owned = Owned::of(buckets, members);
            async move {
                if let Err(e) = self
                    .refund_each(&owned.buckets(), &sub, &[at], Change::GiveBack)
                    .await
                {
                    // The reservation stays counted until it leaves its window: safe side.
                    log::debug!("giving back a reservation failed: {e}");
                }
            }
        };
        reserve_in_order(limits, &parts, decide, release).await
    }

    /// Give back (or charge) an admission in each of its buckets: one refund call per bucket
    /// and record time.
    pub(super) async fn refund_each(
        &self,
        buckets: &Buckets<'_>,
        limits: &[Limit],
        recorded_at: &[u64],
        change: Change,
    ) -> Result<(), StoreError> {
        for (bucket, members) in buckets.groups(limits.len()) {
            let mut by_time: Vec<(u64, Vec<Limit>)> = Vec::new();
            for &i in &members {
                let at = time_of(recorded_at, i);
                match by_time.iter_mut().find(|(t, _)| *t == at) {
                    Some((_, sub)) => sub.push(limits[i]),
                    None => by_time.push((at, vec![limits[i]])),
                }
            }
            for (at, sub) in by_time {
                let (inner, bucket) = (self.inner.clone(), bucket.to_owned());
                let refund = async move { inner.refund_entry(&bucket, &sub, at, change).await };
                self.inner.io.run(refund).await?;
            }
        }
        Ok(())
    }
}
