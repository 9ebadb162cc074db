//! `maintain`, about once a second on the proxy's runtime: connect, probe (PING, or `ROLE`
//! behind Sentinel), reload the script after an outage, and tell the gate what it found. Behind
//! Sentinel, a master lost or demoted is replaced in the same call by the one the Sentinels
//! name now.

use std::sync::Arc;

use super::conn::{within, Conn};
use super::Inner;
use crate::limiter::StoreError;

impl Inner {
    /// See [`crate::limiter::Store::maintain`].
    pub(super) async fn maintain(&self) {
        let Ok(_guard) = self.maintaining.try_lock() else {
            return;
        };
        let mut result = match self.conn.load_full() {
            Some(conn) => self.probe(&conn).await,
            None => self.connect_and_probe().await,
        };
        if matches!(result, Err(StoreError::Unavailable(_))) && self.target.follows_failover() {
            // The master is gone or demoted: waiting for its address to come back would hold
            // the store closed through the whole failover. A new master means new state, and
            // `connect_and_probe` voids what was cached (the generation).
            if self.conn.swap(None).is_some() {
                log::warn!(
                    "{} store: master lost ({}), asking the Sentinels",
                    self.target.label(),
                    result
                        .as_ref()
                        .err()
                        .map(ToString::to_string)
                        .unwrap_or_default()
                );
                result = self.connect_and_probe().await;
            }
        }
        match result {
            Ok(()) => self.gate.ping_answered(),
            Err(error) => self.ping_failed(&error),
        }
    }

    /// Open a connection, make it current, and probe it.
    async fn connect_and_probe(&self) -> Result<(), StoreError> {
        let conn = Arc::new(self.target.connect(self.timeout).await?);
        self.conn.store(Some(conn.clone()));
        self.gate.state_may_be_lost();
        self.probe(&conn).await
    }

    /// Probe `conn`; on the way back from an outage also load the script.
    async fn probe(&self, conn: &Conn) -> Result<(), StoreError> {
        let mut conn = conn.clone();
        let mut result = within(self.timeout, self.target.probe(&mut conn)).await;
        if matches!(result, Err(StoreError::Unavailable(_))) {
            self.gate.state_may_be_lost();
            // A probe that finds the connection lost (or the last reconnect failed) makes the
            // ConnectionManager start a new attempt without waiting for it; a second probe
            // waits for that attempt, so a Redis that is back is back in one `maintain`.
            result = within(self.timeout, self.target.probe(&mut conn)).await;
        }
        // Coming back (first connect, restart, failover): load the script before opening the
        // gate, so the first burst of requests does not pay NOSCRIPT + SCRIPT LOAD each.
        // Best effort: a shard that misses it (down now) is covered by the NOSCRIPT fallback.
        if result.is_ok() && !self.gate.is_open() {
            if let Err(e) = within(self.timeout, conn.load_script()).await {
                log::debug!("{} store: SCRIPT LOAD failed: {e}", self.target.label());
            }
        }
        result
    }

    /// Tell the gate; give the connection up when it says so.
    fn ping_failed(&self, error: &StoreError) {
        if self.gate.ping_failed(error) && self.conn.load().is_some() {
            log::warn!(
                "{} store: PINGs keep failing, reconnecting from scratch",
                self.target.label()
            );
            self.conn.store(None);
        }
    }
}
