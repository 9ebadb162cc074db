//! Giving an admission back on Redis (the refund script, `lua/refund/skeleton.lua` with
//! `lua/kinds/*.lua`), for a route's `count_status` or `settle`, or charging a cost settled
//! higher than charged (in the slot of Redis's now).

use std::sync::LazyLock;

use super::conn::within;
use super::Inner;
use crate::limiter::{Change, Limit, StoreError};

/// Source of the refund script (`lua/refund/skeleton.lua` with `lua/kinds/*.lua`).
pub const REFUND_SOURCE: &str = crate::limiter::algo::script::REFUND;

/// The refund script with its SHA1 computed once.
static REFUND: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(REFUND_SOURCE));

impl Inner {
    /// One `EVALSHA` of the refund script for the admission of `bucket` recorded at
    /// `recorded_at`. Like the inspector's calls, it stays out of the gate's health
    /// bookkeeping: a refund that fails leaves the admission counted, which only errs on the safe side.
    pub(super) async fn refund_entry(
        &self,
        bucket: &str,
        limits: &[Limit],
        recorded_at: u64,
        change: Change,
    ) -> Result<(), StoreError> {
        if limits.is_empty() {
            return Ok(());
        }
        let mut call = REFUND.prepare_invoke();
        for limit in limits {
            call.key(self.key(bucket, limit));
        }
        call.arg(recorded_at);
        for limit in limits {
            // The kind's own ARGV value (a slotted limit's resolution, 0 for a log), what the
            // admission was charged (negative: a charge on top), and the window.
            let [_, window, kind, weight] = limit.script_args();
            let amount = match change {
                Change::GiveBack => weight,
                Change::Charge => -weight,
            };
            call.arg(kind).arg(amount).arg(window);
        }
        let mut conn = self.live_conn_for(bucket).map(|conn| (*conn).clone())?;
        let _given: i64 = within(self.target.timeout, call.invoke_async(&mut conn)).await?;
        // A known denial of this bucket is too pessimistic now (a charge only adds: it stands).
        if change == Change::GiveBack {
            self.coalescer.known().forget(bucket);
        }
        Ok(())
    }
}
