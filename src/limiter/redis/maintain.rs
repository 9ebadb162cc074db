//! `maintain`, about once a second on the proxy's runtime: connect, PING, reload the script
//! after an outage, and tell the gate what it found.

use std::sync::Arc;

use super::conn::within;
use super::Inner;
use crate::limiter::StoreError;

impl Inner {
    /// See [`crate::limiter::Store::maintain`].
    pub(super) async fn maintain(&self) {
        let Ok(_guard) = self.maintaining.try_lock() else {
            return;
        };
        let conn = match self.conn.load_full() {
            Some(conn) => conn,
            None => match self.target.connect(self.timeout).await {
                Ok(conn) => {
                    let conn = Arc::new(conn);
                    self.conn.store(Some(conn.clone()));
                    self.gate.state_may_be_lost();
                    conn
                }
                Err(error) => return self.ping_failed(&error),
            },
        };
        let mut conn = (*conn).clone();
        let mut result = within(self.timeout, conn.ping()).await;
        if matches!(result, Err(StoreError::Unavailable(_))) {
            self.gate.state_may_be_lost();
            // A PING that finds the connection lost (or the last reconnect failed) makes the
            // ConnectionManager start a new attempt without waiting for it; a second PING
            // waits for that attempt, so a Redis that is back is back in one `maintain`.
            result = within(self.timeout, conn.ping()).await;
        }
        // Coming back (first connect, restart, failover): load the script before opening the
        // gate, so the first burst of requests does not pay NOSCRIPT + SCRIPT LOAD each.
        // Best effort: a shard that misses it (down now) is covered by the NOSCRIPT fallback.
        if result.is_ok() && !self.gate.is_open() {
            if let Err(e) = within(self.timeout, conn.load_script()).await {
                log::debug!("{} store: SCRIPT LOAD failed: {e}", self.target.label());
            }
            // A user that lacks a command would fail decisions one by one, with a message
            // that does not name it: stay not ready, naming it (see `acl.rs`).
            let probe = conn.check_permissions(&self.prefix);
            if let Ok(Err(denied @ StoreError::Backend(_))) =
                tokio::time::timeout(self.timeout * 4, probe).await
            {
                result = Err(denied);
            }
        }
        match result {
            Ok(()) => {
                *self.reported.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.gate.ping_answered()
            }
            Err(error) => self.ping_failed(&error),
        }
    }

    /// Log why a store that is not ready stays so, once per reason (an open gate logs its own
    /// closing): without it a proxy whose Redis refuses its certificate or its user would
    /// only show a 503 on `/readyz`.
    fn report(&self, error: &StoreError) {
        let why = error.to_string();
        let mut last = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() == Some(why.as_str()) {
            return;
        }
        let label = self.target.label();
        match error {
            StoreError::Backend(_) => log::error!("{label} store not ready: {why}"),
            _ => log::warn!("{label} store not ready: {why}"),
        }
        *last = Some(why);
    }

    /// Tell the gate; give the connection up when it says so.
    fn ping_failed(&self, error: &StoreError) {
        if !self.gate.is_open() {
            self.report(error);
        }
        if self.gate.ping_failed(error) && self.conn.load().is_some() {
            log::warn!(
                "{} store: PINGs keep failing, reconnecting from scratch",
                self.target.label()
            );
            self.conn.store(None);
        }
    }
}
