//! The health gate: whether `check` and the inspector may use the connection, when to fail
//! fast, when to rebuild the connection, the generation that voids cached denials, and the
//! bookkeeping of `maintain` (one at a time, each reason for not being ready logged once).
//!
//! The gate opens on a PING answered by `maintain` and closes on a failed PING; on one Redis
//! it also closes on a lost connection or a few call timeouts in a row, so a frozen Redis costs
//! one timeout per second instead of one per request. A Cluster's gate stays open on call
//! failures (they concern one master) and closes only when no master answers a PING; each
//! master's own health, which fails its slots alone, is `shards.rs`'s.
//!
//! The generation changes whenever the store may have lost its state (a connection made,
//! found lost or rebuilt; a new master), in one place: [`Gate::state_may_be_lost`].

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::limiter::StoreError;

/// After this many call timeouts in a row, the gate closes until a `maintain` PING succeeds:
/// a frozen Redis then costs one timeout per second, not one per request, and does not queue
/// requests that Redis would execute late.
const TIMEOUTS_BEFORE_FAIL_FAST: u32 = 3;

/// Call timeouts in a row, no answer between them, that make a Cluster's connection count as
/// stalled (see [`Gate::stalled`]): more than the few a busy proxy may miss while answers go
/// on arriving between them.
const STALLED_AFTER: u32 = 20;

/// After this many failed PINGs in a row (about seconds), `maintain` drops the connection and
/// builds a new one. The libraries reconnect on their own after a closed socket, but not after a
/// half-open one (host gone, no RST) where every command just times out.
const PINGS_BEFORE_REBUILD: u32 = 5;

/// See the module documentation.
pub(super) struct Gate {
    /// The store's metric label, for log lines.
    label: &'static str,
    /// Call failures close the gate (one server: a failure concerns the whole store).
    close_on_call_failure: bool,
    /// The last PING succeeded and no outage was seen since.
    open: AtomicBool,
    /// Call timeouts in a row (reset by any answer).
    timeouts: AtomicU32,
    /// Failed PINGs (or connection attempts) in a row.
    failed_pings: AtomicU32,
    /// See [`crate::limiter::Store::generation`].
    generation: AtomicU64,
    /// Serializes `maintain`, in case a caller runs it from two places.
    maintaining: tokio::sync::Mutex<()>,
    /// Why the store is not ready, as last logged (each new reason is logged once).
    reported: Mutex<Option<String>>,
}

impl Gate {
    /// A closed gate. `close_on_call_failure`: see [`super::conn::Target::one_server`].
    pub(super) fn new(label: &'static str, close_on_call_failure: bool) -> Gate {
        Gate {
            label,
            close_on_call_failure,
            open: AtomicBool::new(false),
            timeouts: AtomicU32::new(0),
            failed_pings: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            maintaining: tokio::sync::Mutex::new(()),
            reported: Mutex::new(None),
        }
    }

    /// Held while `maintain` runs; `None` when it already runs elsewhere.
    pub(super) fn maintaining(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.maintaining.try_lock().ok()
    }

    /// Log why a store that is not ready stays so, once per reason (an open gate logs its own
    /// closing): without it a proxy whose Redis refuses its certificate or its user would
    /// only show a 503 on `/readyz`.
    pub(super) fn report(&self, error: &StoreError) {
        let why = error.to_string();
        let mut last = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() == Some(why.as_str()) {
            return;
        }
        let label = self.label;
        match error {
            StoreError::Backend(_) => log::error!("{label} store not ready: {why}"),
            _ => log::warn!("{label} store not ready: {why}"),
        }
        *last = Some(why);
    }

    /// True while calls may be sent (used by `/readyz`).
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// `Ok` while calls may be sent; else the error to answer at once.
    pub(super) fn pass(&self) -> Result<(), StoreError> {
        if self.is_open() {
            Ok(())
        } else {
            Err(StoreError::Unavailable("connection not ready".into()))
        }
    }

    /// See [`crate::limiter::Store::generation`].
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The store may have lost its state (new connection, lost connection, new master):
    /// decisions cached before are void.
    pub(super) fn state_may_be_lost(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// A call was answered.
    pub(super) fn answered(&self) {
        self.timeouts.store(0, Ordering::Release);
    }

    /// A call failed: a lost connection voids cached denials; on one server, a lost connection
    /// or a few timeouts in a row close the gate until `maintain` gets a PING through.
    pub(super) fn call_failed(&self, error: &StoreError) {
        if matches!(error, StoreError::Unavailable(_)) {
            // A lost connection (to a server or one cluster shard) may hide a restart that
            // emptied it.
            self.state_may_be_lost();
        }
        let n = match error {
            StoreError::Timeout(_) => self.timeouts.fetch_add(1, Ordering::AcqRel) + 1,
            _ => 0,
        };
        if !self.close_on_call_failure {
            return;
        }
        match error {
            StoreError::Unavailable(_) => self.close(format_args!("unavailable: {error}")),
            StoreError::Timeout(_) => {
                if n >= TIMEOUTS_BEFORE_FAIL_FAST {
                    self.close(format_args!(
                        "{n} timeouts in a row, failing fast until Redis answers a PING"
                    ));
                }
            }
            StoreError::Backend(_) | StoreError::Overloaded(_) => {}
        }
    }

    /// True when the last [`STALLED_AFTER`] calls or more all ran out their deadline, no
    /// answer between them. A Cluster's `maintain` reads it before its PINGs reset the count:
    /// calls that all time out while the masters answer their own PINGs mean the client's
    /// connection itself no longer delivers, and it is built anew.
    pub(super) fn stalled(&self) -> bool {
        self.timeouts.load(Ordering::Acquire) >= STALLED_AFTER
    }

    /// A `maintain` PING was answered: open the gate.
    pub(super) fn ping_answered(&self) {
        *self.reported.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.failed_pings.store(0, Ordering::Release);
        self.timeouts.store(0, Ordering::Release);
        if !self.open.swap(true, Ordering::AcqRel) {
            log::info!("{} store ready", self.label);
        }
    }

    /// A `maintain` PING or connection attempt failed: close the gate. True when the
    /// connection should be given up and built anew.
    pub(super) fn ping_failed(&self, error: &StoreError) -> bool {
        self.close(format_args!("not ready: {error}"));
        let failures = self.failed_pings.fetch_add(1, Ordering::AcqRel) + 1;
        failures.is_multiple_of(PINGS_BEFORE_REBUILD)
    }

    /// Close the gate, logging why once per closing.
    fn close(&self, why: std::fmt::Arguments<'_>) {
        if self.open.swap(false, Ordering::AcqRel) {
            log::warn!("{} store {why}", self.label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_server_fails_fast_after_a_few_timeouts_and_reopens_on_a_ping() {
        let gate = Gate::new("redis", true);
        assert!(gate.pass().is_err(), "closed until the first PING");
        gate.ping_answered();
        let timeout = StoreError::Timeout(Duration::from_millis(50));
        for _ in 1..TIMEOUTS_BEFORE_FAIL_FAST {
            gate.call_failed(&timeout);
            assert!(gate.is_open());
        }
        gate.answered();
        gate.call_failed(&timeout);
        assert!(gate.is_open(), "an answer resets the count");
        for _ in 1..TIMEOUTS_BEFORE_FAIL_FAST {
            gate.call_failed(&timeout);
        }
        assert!(!gate.is_open());
        gate.ping_answered();
        assert!(gate.is_open());
    }

    #[test]
    fn a_lost_connection_bumps_the_generation_on_every_backend() {
        for one_server in [true, false] {
            let gate = Gate::new("t", one_server);
            gate.ping_answered();
            let before = gate.generation();
            gate.call_failed(&StoreError::Unavailable("gone".into()));
            assert_eq!(gate.generation(), before + 1);
            assert_eq!(
                gate.is_open(),
                !one_server,
                "only one server closes on a call"
            );
        }
    }

    #[test]
    fn a_cluster_gate_stays_open_on_call_timeouts() {
        let gate = Gate::new("redis_cluster", false);
        gate.ping_answered();
        for _ in 0..10 * TIMEOUTS_BEFORE_FAIL_FAST {
            gate.call_failed(&StoreError::Timeout(Duration::from_millis(50)));
        }
        assert!(gate.is_open());
    }

    #[test]
    fn a_cluster_gate_tells_a_stall_from_timeouts_among_answers() {
        let gate = Gate::new("redis_cluster", false);
        gate.ping_answered();
        let timeout = StoreError::Timeout(Duration::from_millis(50));
        for _ in 0..STALLED_AFTER - 1 {
            gate.call_failed(&timeout);
        }
        assert!(!gate.stalled());
        gate.answered();
        gate.call_failed(&timeout);
        assert!(!gate.stalled(), "an answer resets the count");
        for _ in 0..STALLED_AFTER {
            gate.call_failed(&timeout);
        }
        assert!(gate.stalled() && gate.is_open());
    }

    #[test]
    fn pings_ask_for_a_rebuild_every_few_failures() {
        let gate = Gate::new("redis", true);
        let e = StoreError::Timeout(Duration::from_millis(50));
        let rebuilds: Vec<bool> = (0..2 * PINGS_BEFORE_REBUILD)
            .map(|_| gate.ping_failed(&e))
            .collect();
        assert_eq!(rebuilds.iter().filter(|&&r| r).count(), 2);
        assert!(rebuilds[PINGS_BEFORE_REBUILD as usize - 1]);
    }
}
