//! The admin inspector's reads and resets on Redis (the inspector script,
//! `lua/inspect/skeleton.lua` with `lua/kinds/*.lua`; plain `DEL`).

use std::sync::LazyLock;

use super::conn::{within, Conn};
use super::Inner;
use crate::limiter::{Limit, StoreError, WindowView};

/// Source of the read-only inspector script (`lua/inspect/skeleton.lua` with `lua/kinds/*.lua`).
pub const INSPECT_SOURCE: &str = crate::limiter::algo::script::INSPECT;

/// The inspector script with its SHA1 computed once.
static INSPECT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(INSPECT_SOURCE));

/// The admin inspector's calls. They use the same connection, gate and timeout as `check` but
/// stay out of its health bookkeeping: an operator's read must not open or close the gate.
impl Inner {
    /// The live connection, if the gate is open and `bucket`'s master is up.
    fn admin_conn(&self, bucket: &str) -> Result<Conn, StoreError> {
        self.live_conn_for(bucket).map(|conn| (*conn).clone())
    }

    /// One `EVALSHA` of the read-only inspector script.
    pub(super) async fn inspect_window(
        &self,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<WindowView, StoreError> {
        if limits.is_empty() {
            let mut conn = self.live_conn().map(|conn| (*conn).clone())?;
            let (secs, micros): (u64, u64) = within(
                self.target.timeout,
                redis::cmd("TIME").query_async(&mut conn),
            )
            .await?;
            return Ok(WindowView {
                now_us: secs * 1_000_000 + micros,
                limits: Vec::new(),
            });
        }
        let mut call = INSPECT.prepare_invoke();
        for limit in limits {
            call.key(self.key(bucket, limit));
        }
        for limit in limits {
            // The first three values per limit of the deciding script (not the weight).
            for &arg in &limit.script_args()[..3] {
                call.arg(arg);
            }
        }
        call.arg(crate::limiter::MAX_VIEW_ENTRIES);
        let mut conn = self.admin_conn(bucket)?;
        let reply: Vec<i64> = within(self.target.timeout, call.invoke_async(&mut conn)).await?;
        parse_inspect(&reply, limits)
    }

    /// `HGET <prefix>:<hash> <field>` (see [`Store::read_shared`](crate::limiter::Store)).
    pub(super) async fn read_field(
        &self,
        hash: &str,
        field: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let mut conn = self.live_conn().map(|conn| (*conn).clone())?;
        let mut hget = redis::cmd("HGET");
        hget.arg(format!("{}:{hash}", self.target.prefix))
            .arg(field);
        within(self.target.timeout, hget.query_async(&mut conn)).await
    }

    /// `DEL` of every key of the bucket (one slot: they share the hash tag).
    pub(super) async fn reset_bucket(
        &self,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<(), StoreError> {
        if limits.is_empty() {
            return Ok(());
        }
        let mut del = redis::cmd("DEL");
        for limit in limits {
            del.arg(self.key(bucket, limit));
        }
        let mut conn = self.admin_conn(bucket)?;
        let _: i64 = within(self.target.timeout, del.query_async(&mut conn)).await?;
        self.coalescer.known().forget(bucket);
        Ok(())
    }
}

/// Decode the inspector script's reply (documented in the header of `lua/inspect/skeleton.lua`),
/// checking its shape; each limit's values are its kind's to read.
fn parse_inspect(reply: &[i64], limits: &[Limit]) -> Result<WindowView, StoreError> {
    let bad = || {
        StoreError::Backend(format!(
            "inspect script returned a malformed reply for {} limits",
            limits.len()
        ))
    };
    let (&now, mut rest) = reply.split_first().ok_or_else(bad)?;
    let mut views = Vec::with_capacity(limits.len());
    for limit in limits {
        let [count, remaining, reset, k, ..] = *rest else {
            return Err(bad());
        };
        let k = usize::try_from(k).map_err(|_| bad())?;
        let values = rest.get(4..4 + k).ok_or_else(bad)?;
        let head = [count, remaining, reset];
        views.push(limit.view_from_inspect(head, values).ok_or_else(bad)?);
        rest = &rest[4 + k..];
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok(WindowView {
        now_us: now.max(0) as u64,
        limits: views,
    })
}
