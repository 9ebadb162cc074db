//! Renewing a lease on Redis (`lua/renew/script.lua`): one small script call per concurrency
//! limit of a request still running, every `lease_ttl / 3`, off the request path.

use std::sync::LazyLock;

use super::conn::within;
use super::{Inner, RedisStore};
use crate::limiter::buckets::time_of;
use crate::limiter::{Buckets, Limit, StoreError};

/// Source of the renew script.
pub const RENEW_SOURCE: &str = include_str!("../../../lua/renew/script.lua");

/// The renew script with its SHA1 computed once.
static RENEW: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RENEW_SOURCE));

impl Inner {
    /// One `EVALSHA` of the renew script: the lease of `bucket` in `limit` recorded at `at`
    /// moves to Redis's now; 0 when it had lapsed. Out of the gate's health bookkeeping, like
    /// a refund: a failed renewal leaves the lease as it was, to be renewed at the next turn.
    async fn renew_lease(&self, bucket: &str, limit: &Limit, at: u64) -> Result<u64, StoreError> {
        let mut call = RENEW.prepare_invoke();
        call.key(self.key(bucket, limit))
            .arg(at)
            .arg(limit.window_us());
        let mut conn = self.live_conn_for(bucket).map(|conn| (*conn).clone())?;
        let renewed: i64 = within(self.target.timeout, call.invoke_async(&mut conn)).await?;
        Ok(renewed.max(0) as u64)
    }
}

impl RedisStore {
    /// [`Store::renew`](crate::limiter::Store::renew): one call per limit (each its own key,
    /// perhaps in its own hash slot).
    pub(super) async fn renew_each(
        &self,
        buckets: &Buckets<'_>,
        limits: &[Limit],
        recorded_at: &[u64],
    ) -> Result<Vec<u64>, StoreError> {
        let mut renewed = vec![0; limits.len()];
        for (bucket, members) in buckets.groups(limits.len()) {
            for i in members {
                let (inner, bucket, limit) = (self.inner.clone(), bucket.to_owned(), limits[i]);
                let at = time_of(recorded_at, i);
                let renew = async move { inner.renew_lease(&bucket, &limit, at).await };
                renewed[i] = self.inner.io.run(renew).await?;
            }
        }
        Ok(renewed)
    }
}
