//! `maintain`, about once a second on the proxy's runtime: connect, probe (PING, or `ROLE`
//! behind Sentinel), reload the script after an outage, and tell the gate what it found. Behind
//! Sentinel, a master lost or demoted is replaced in the same call by the one the Sentinels
//! name now.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{within, Conn};
use super::Inner;
use crate::limiter::StoreError;

/// Behind Sentinel, while no master is found, `maintain` asks again this often within one call,
/// for at most [`REDISCOVER_FOR`]: a failover completes at any moment, and waiting for the next
/// once-a-second call would keep the store closed up to a second longer.
const REDISCOVER_EVERY: Duration = Duration::from_millis(200);
const REDISCOVER_FOR: Duration = Duration::from_millis(800);

/// How often a Cluster's calls are looked at for a stall (see [`Inner::watch_for_stalls`]).
const STALL_WATCH_EVERY: Duration = Duration::from_millis(100);

impl Inner {
    /// On a Cluster, start (once) a watch on the I/O thread that runs `maintain` as soon as
    /// every call times out while the gate is open, rather than at the next once-a-second
    /// `maintain`: a stalled cluster connection fails every client until it is rebuilt. It
    /// holds the store weakly and ends with it.
    pub(super) fn watch_for_stalls(self: &Arc<Self>) {
        let Some(shards) = &self.shards else { return };
        if shards.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = Arc::downgrade(self);
        self.io.spawn(async move {
            loop {
                tokio::time::sleep(STALL_WATCH_EVERY).await;
                let Some(inner) = store.upgrade() else { return };
                if inner.gate.stalled() && inner.gate.is_open() {
                    inner.maintain().await;
                }
            }
        });
    }

    /// See [`crate::limiter::Store::maintain`].
    pub(super) async fn maintain(&self) {
        let Some(_guard) = self.gate.maintaining() else {
            return;
        };
        let started = Instant::now();
        let mut result = match self.conn.load_full() {
            Some(conn) => self.probe(&conn).await,
            None => self.connect_and_probe().await,
        };
        if self.target.follows_failover() {
            result = self.follow_master(result, started).await;
        }
        if result.is_ok() && self.shards.is_some() && self.gate.stalled() {
            // Every call timed out while the masters answer their PINGs: the cluster
            // connection no longer delivers (seen in one run of six after a master was killed:
            // slot refreshes on end), so it is built anew, as after failed PINGs.
            let label = self.target.label();
            log::warn!("{label} store: calls time out while the masters answer, reconnecting");
            self.conn.store(None);
            result = self.connect_and_probe().await;
        }
        match result {
            Ok(()) => self.gate.ping_answered(),
            Err(error) => self.ping_failed(&error),
        }
    }

    /// Behind Sentinel: a master gone or demoted is given up at once and the Sentinels asked
    /// again, until one is found or [`REDISCOVER_FOR`] has passed since `started`. Waiting for
    /// the old address to come back would hold the store closed through the whole failover.
    /// A new master means new state: `connect_and_probe` voids what was cached.
    async fn follow_master(
        &self,
        mut result: Result<(), StoreError>,
        started: Instant,
    ) -> Result<(), StoreError> {
        if let Err(lost @ StoreError::Unavailable(_)) = &result {
            if self.conn.swap(None).is_some() {
                let label = self.target.label();
                log::warn!("{label} store: master lost ({lost}), asking the Sentinels");
                result = self.connect_and_probe().await;
            }
        } else if result.is_ok() && matches!(self.target.master_moved().await, Ok(true)) {
            // The old master still answers as one, but the Sentinels promoted another: what
            // is written to the old one now is lost when it is demoted.
            let label = self.target.label();
            log::warn!("{label} store: the Sentinels name a new master, following it");
            self.conn.store(None);
            result = self.connect_and_probe().await;
        }
        while result.is_err() && started.elapsed() + REDISCOVER_EVERY < REDISCOVER_FOR {
            tokio::time::sleep(REDISCOVER_EVERY).await;
            self.conn.store(None);
            result = self.connect_and_probe().await;
        }
        result
    }

    /// Open a connection, make it current, and probe it.
    async fn connect_and_probe(&self) -> Result<(), StoreError> {
        let conn = Arc::new(self.target.connect().await?);
        self.conn.store(Some(conn.clone()));
        self.gate.state_may_be_lost();
        self.probe(&conn).await
    }

    /// Probe `conn`; on the way back from an outage also load the script. A Cluster is probed
    /// master by master, off `conn` (`shards.rs`): the store is up while any master answers,
    /// and a dead master's slots fail alone.
    async fn probe(&self, conn: &Conn) -> Result<(), StoreError> {
        let mut conn = conn.clone();
        let mut result = match &self.shards {
            Some(shards) => shards.refresh().await.map(|back| {
                if back {
                    // A master back from an outage may have come back empty.
                    self.gate.state_may_be_lost();
                }
            }),
            None => within(self.target.timeout, self.target.probe(&mut conn)).await,
        };
        if self.shards.is_none() && matches!(result, Err(StoreError::Unavailable(_))) {
            self.gate.state_may_be_lost();
            // A probe that finds the connection lost (or the last reconnect failed) makes the
            // ConnectionManager start a new attempt without waiting for it; a second probe
            // waits for that attempt, so a Redis that is back is back in one `maintain`.
            result = within(self.target.timeout, self.target.probe(&mut conn)).await;
        }
        // Coming back (first connect, restart, failover): load the script before opening the
        // gate, so the first burst of requests does not pay NOSCRIPT + SCRIPT LOAD each.
        // Best effort: a shard that misses it (down now) is covered by the NOSCRIPT fallback.
        if result.is_ok() && !self.gate.is_open() {
            if let Err(e) = within(self.target.timeout, conn.load_script()).await {
                log::debug!("{} store: SCRIPT LOAD failed: {e}", self.target.label());
            }
            // A user that lacks a command would fail decisions one by one, with a message
            // that does not name it: stay not ready, naming it (see `acl.rs`).
            let probe = conn.check_permissions(&self.target.prefix);
            if let Ok(Err(denied @ StoreError::Backend(_))) =
                tokio::time::timeout(self.target.timeout * 4, probe).await
            {
                result = Err(denied);
            }
            // A policy that may evict limit keys opens limits under memory pressure: said at
            // each (re)connect that finds it changed, never a reason to stay closed.
            let verdict = conn.eviction(self.target.timeout * 4).await;
            self.eviction.report(self.target.label(), &verdict);
        }
        result
    }

    /// Tell the gate; give the connection up when it says so.
    fn ping_failed(&self, error: &StoreError) {
        if !self.gate.is_open() {
            self.gate.report(error);
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
