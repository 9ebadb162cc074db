//! The admin inspector's reads and resets on Redis (`lua/inspect.lua`, plain `DEL`).

use std::sync::LazyLock;
use std::time::Duration;

use super::conn::{within, Conn};
use super::Inner;
use crate::limiter::{Limit, LimitView, StoreError, WindowView};

/// Source of the read-only inspector script (`lua/inspect.lua`).
pub const INSPECT_SOURCE: &str = include_str!("../../../lua/inspect.lua");

/// The inspector script with its SHA1 computed once.
static INSPECT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(INSPECT_SOURCE));

/// The admin inspector's calls. They use the same connection, gate and timeout as `check` but
/// stay out of its health bookkeeping: an operator's read must not open or close the gate.
impl Inner {
    /// The live connection, if the gate is open.
    fn admin_conn(&self) -> Result<Conn, StoreError> {
        self.live_conn().map(|conn| (*conn).clone())
    }

    /// One `EVALSHA` of the read-only `lua/inspect.lua`.
    pub(super) async fn inspect_window(
        &self,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<WindowView, StoreError> {
        if limits.is_empty() {
            let mut conn = self.admin_conn()?;
            let (secs, micros): (u64, u64) =
                within(self.timeout, redis::cmd("TIME").query_async(&mut conn)).await?;
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
            call.arg(limit.requests).arg(limit.window_us());
        }
        call.arg(crate::limiter::MAX_VIEW_ENTRIES);
        let mut conn = self.admin_conn()?;
        let reply: Vec<i64> = within(self.timeout, call.invoke_async(&mut conn)).await?;
        parse_inspect(&reply, limits.len())
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
        let mut conn = self.admin_conn()?;
        let _: i64 = within(self.timeout, del.query_async(&mut conn)).await?;
        self.lanes.get(self.target.lane_of(bucket)).forget(bucket);
        Ok(())
    }
}

/// Decode `lua/inspect.lua`'s reply (documented in its header), checking its shape.
fn parse_inspect(reply: &[i64], limits: usize) -> Result<WindowView, StoreError> {
    let bad = || {
        StoreError::Backend(format!(
            "inspect script returned a malformed reply for {limits} limits"
        ))
    };
    let (&now, mut rest) = reply.split_first().ok_or_else(bad)?;
    let mut views = Vec::with_capacity(limits);
    for _ in 0..limits {
        let [count, remaining, reset, k, ..] = *rest else {
            return Err(bad());
        };
        let k = usize::try_from(k).map_err(|_| bad())?;
        let entries = rest.get(4..4 + k).ok_or_else(bad)?;
        views.push(LimitView {
            count: count.max(0) as u64,
            remaining: remaining.clamp(0, i64::from(u32::MAX)) as u32,
            reset: Duration::from_micros(reset.max(0) as u64),
            entries_us: entries.iter().map(|&t| t.max(0) as u64).collect(),
        });
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
