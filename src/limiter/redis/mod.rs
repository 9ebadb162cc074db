//! Redis store: the limiter state of every proxy instance in one Redis server or Redis Cluster.
//!
//! # At most one round trip per request
//!
//! Each decision is made by one `EVALSHA` of `lua/sliding_window.lua` (its header documents
//! KEYS, ARGV and the reply); on one Redis, decisions pending at the same instant share one
//! call (`batch.rs`). The script reads Redis's own clock (`TIME`), evicts, counts and records in
//! every limit of the route atomically, so proxies never disagree about time and never race.
//! The `EVALSHA` is built here (the script's SHA1 from [`redis::Script`]); on `NOSCRIPT` (after
//! a restart, a failover or `SCRIPT FLUSH`) the store loads the script and sends it again.
//!
//! # Keys
//!
//! One LIST per limit: `<prefix>:{<bucket>}:<window in ms>`. The `{bucket}` hash tag puts all
//! limits of a bucket in one Cluster slot, so the multi-key script never fails with
//! `CROSSSLOT`. The window (not the position or the request count) names the key, so a reload
//! that only changes `requests` keeps the recorded entries, and one that changes a window
//! starts that limit afresh.
//!
//! # Connections and failure
//!
//! Connections are created in [`Store::maintain`], never in [`RedisStore::new`] nor in
//! [`Store::check`]: `maintain` runs on Pingora's runtime, and a redis-rs connection's driver
//! task lives on the runtime that created it. One Redis uses a
//! [`ConnectionManager`] (reconnects in the background), a Cluster a
//! [`ClusterConnection`](redis::cluster_async::ClusterConnection).
//!
//! `check` never waits for a connection: until one is up and answering, it fails at once with
//! [`StoreError::Unavailable`], and every call is bounded by `store.timeout`, so a dead or
//! frozen Redis costs a request at most that timeout, never the client library's multi-second
//! reconnect backoff. `maintain` PINGs about once a second; the answer drives
//! [`Store::is_ready`] and re-opens `check` after an outage. On one Redis, a lost connection or
//! a few timeouts in a row close `check` until then; on a Cluster only "no master answers"
//! does, so that one failed shard does not take the healthy ones down with it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;

use super::{Limit, Store, StoreError, Verdict, WindowView};
use conn::{classify, connect_timeout, Conn, Target, SAFETY_NET_FACTOR};
use reply::ScriptReply;

mod batch;
mod conn;
mod inspect;
mod reply;

/// Source of the sliding-window script, compiled into the binary.
pub const SCRIPT_SOURCE: &str = include_str!("../../../lua/sliding_window.lua");

/// The script with its SHA1 computed once; shared by every store.
static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SCRIPT_SOURCE));

/// After this many `check` timeouts in a row, `check` stops sending and fails fast until a
/// `maintain` PING succeeds: a frozen Redis then costs one timeout per second, not one per
/// request, and does not queue requests that Redis would execute late.
const TIMEOUTS_BEFORE_FAIL_FAST: u32 = 3;

/// After this many failed PINGs in a row (about seconds), `maintain` drops the connection and
/// builds a new one. The libraries reconnect on their own after a closed socket, but not after a
/// half-open one (host gone, no RST) where every command just times out.
const PINGS_BEFORE_REBUILD: u32 = 5;

/// Everything the Redis store needs, built from the `[store]` settings by the config layer.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    /// The server or the cluster's seed nodes.
    pub nodes: RedisNodes,
    /// Key namespace, free of `{`, `}` and whitespace.
    pub prefix: String,
    /// Deadline of one decision (and of one PING). The store owns it: it enforces it and counts
    /// its expiries towards failing fast.
    pub timeout: Duration,
}

/// One Redis, or a Redis Cluster's seed nodes.
#[derive(Debug, Clone)]
pub enum RedisNodes {
    /// One Redis server (or a primary behind a proxy).
    Single(Box<redis::ConnectionInfo>),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<redis::ConnectionInfo>),
}

/// The Redis (or Redis Cluster) limiter store: a cheap handle on the state below, which the task
/// that sends a batch of decisions (see `batch.rs`) shares.
pub struct RedisStore {
    inner: Arc<Inner>,
}

/// The store's state.
struct Inner {
    target: Target,
    /// Key namespace (`store.prefix`), validated free of `{`, `}` and whitespace.
    prefix: String,
    /// `store.timeout`: bound on every call, and on each PING.
    timeout: Duration,
    /// The current connection; `None` until `maintain` connects, or after it gave one up.
    conn: ArcSwapOption<Conn>,
    /// The last PING succeeded and no outage was seen since: `check` may use `conn`.
    healthy: AtomicBool,
    /// `check` timeouts in a row (reset by any answer).
    timeouts: AtomicU32,
    /// Failed PINGs (or connection attempts) in a row.
    failed_pings: AtomicU32,
    /// Serializes `maintain`, in case a caller runs it from two places.
    maintaining: tokio::sync::Mutex<()>,
    /// Bumped whenever the connection is (re)made or found lost: Redis may have restarted
    /// empty, so decisions cached before are void (see [`Store::generation`]).
    generation: AtomicU64,
    /// Decisions waiting for the call in flight to one Redis (see `batch.rs`).
    queue: std::sync::Mutex<batch::Queue>,
}

impl RedisStore {
    /// A store for `target`. Builds clients without connecting and needs no runtime. The first
    /// [`Store::maintain`] connects; until then `check` returns [`StoreError::Unavailable`].
    pub fn new(target: &RedisTarget) -> Result<RedisStore, StoreError> {
        let timeout = target.timeout;
        let client = match &target.nodes {
            RedisNodes::Single(info) => Target::Single(
                redis::Client::open((**info).clone())
                    .map_err(|e| StoreError::Backend(format!("invalid Redis URL: {e}")))?,
            ),
            RedisNodes::Cluster(seeds) => {
                let client = ClusterClientBuilder::new(seeds.iter().cloned())
                    // Retries happen inside one call, so they must fit in `store.timeout`:
                    // a couple of quick ones cover a MOVED/TRYAGAIN during resharding.
                    .retries(2)
                    .min_retry_wait(1)
                    .max_retry_wait(timeout.as_millis().clamp(1, 100) as u64)
                    .connection_timeout(connect_timeout(timeout))
                    // The store's own deadline bounds every call (see `check`); the library's
                    // per-attempt timeout is only a safety net that frees a hung attempt.
                    .response_timeout(timeout * SAFETY_NET_FACTOR)
                    .overall_response_timeout(None)
                    .build()
                    .map_err(|e| {
                        StoreError::Backend(format!("invalid Redis Cluster config: {e}"))
                    })?;
                Target::Cluster(client)
            }
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                target: client,
                prefix: target.prefix.clone(),
                timeout,
                conn: ArcSwapOption::empty(),
                healthy: AtomicBool::new(false),
                timeouts: AtomicU32::new(0),
                failed_pings: AtomicU32::new(0),
                maintaining: tokio::sync::Mutex::new(()),
                generation: AtomicU64::new(0),
                queue: Default::default(),
            }),
        })
    }

    /// The Redis key holding `limit`'s log for `bucket`: `<prefix>:{<bucket>}:<window ms>`.
    pub fn key(&self, bucket: &str, limit: &Limit) -> String {
        self.inner.key(bucket, limit)
    }
}

impl Inner {
    /// See [`RedisStore::key`].
    fn key(&self, bucket: &str, limit: &Limit) -> String {
        let mut key = Vec::new();
        self.write_key(&mut key, bucket, limit);
        String::from_utf8(key).expect("prefix and bucket are UTF-8")
    }

    /// Write [`RedisStore::key`] into `out` (cleared first), without allocating.
    fn write_key(&self, out: &mut Vec<u8>, bucket: &str, limit: &Limit) {
        debug_assert!(
            !bucket.contains(['{', '}']),
            "bucket {bucket:?} contains a brace"
        );
        out.clear();
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(b":{");
        out.extend_from_slice(bucket.as_bytes());
        out.extend_from_slice(b"}:");
        limit.id().push_key_suffix(out);
    }

    /// Open a new connection, bounded so that `maintain` returns promptly.
    async fn connect(&self) -> Result<Conn, StoreError> {
        let budget = connect_timeout(self.timeout) * 2;
        let attempt = async {
            match &self.target {
                Target::Single(client) => {
                    let config = ConnectionManagerConfig::new()
                        // Reconnects run in the background while `check` fails fast (see
                        // `healthy`); one quick retry, then the next PING starts another.
                        .set_number_of_retries(1)
                        .set_min_delay(Duration::from_millis(10))
                        .set_max_delay(Duration::from_millis(100))
                        .set_connection_timeout(Some(connect_timeout(self.timeout)))
                        // No library response timer: the store's deadline in `check` and
                        // `ping` is the only one (a second timer of the same length would
                        // race it, and its expiries would escape the fail-fast count).
                        .set_response_timeout(None);
                    ConnectionManager::new_with_config(client.clone(), config)
                        .await
                        .map(Conn::Single)
                }
                Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            }
        };
        match tokio::time::timeout(budget, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(classify(&e, self.timeout)),
            Err(_) => Err(StoreError::Timeout(budget)),
        }
    }

    /// One PING, bounded by the store timeout.
    async fn ping(&self, conn: &mut Conn) -> Result<(), StoreError> {
        self.bounded(conn.ping()).await
    }

    /// A maintenance call, bounded by the store timeout.
    async fn bounded(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<()>>,
    ) -> Result<(), StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(classify(&e, self.timeout)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Record a failed PING or connection attempt; give the connection up after a few.
    fn ping_failed(&self, error: &StoreError) {
        if self.healthy.swap(false, Ordering::AcqRel) {
            log::warn!("{} store not ready: {error}", self.backend());
        }
        let failures = self.failed_pings.fetch_add(1, Ordering::AcqRel) + 1;
        if failures.is_multiple_of(PINGS_BEFORE_REBUILD) && self.conn.load().is_some() {
            log::warn!(
                "{} store: {failures} failed PINGs in a row, reconnecting from scratch",
                self.backend()
            );
            self.conn.store(None);
        }
    }

    /// The live connection, if `check` may use it: fail fast rather than queue behind a
    /// reconnect (`maintain` re-opens the gate).
    fn live_conn(&self) -> Result<Arc<Conn>, StoreError> {
        let Some(conn) = self.conn.load_full() else {
            return Err(StoreError::Unavailable("not connected".into()));
        };
        if !self.healthy.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable("connection not ready".into()));
        }
        Ok(conn)
    }

    /// See [`Store::check`]. One Redis coalesces concurrent decisions (`batch.rs`); a Cluster
    /// sends each on its own, to its bucket's slot.
    async fn check(
        self: &Arc<Self>,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<Verdict, StoreError> {
        if limits.is_empty() {
            return Ok(Verdict {
                admitted: true,
                states: Vec::new(),
            });
        }
        let conn = self.live_conn()?;
        match *conn {
            Conn::Single(_) => self.check_coalesced(&conn, bucket, limits).await,
            Conn::Cluster(_) => self.decide_now(&conn, bucket, limits).await,
        }
    }

    /// One decision in its own `EVALSHA`.
    async fn decide_now(
        &self,
        conn: &Conn,
        bucket: &str,
        limits: &[Limit],
    ) -> Result<Verdict, StoreError> {
        let evalsha = self.evalsha([(bucket, limits)].into_iter());
        self.call(conn, &evalsha).await?.next_verdict(limits)
    }

    /// Send one `EVALSHA`, bounded by the store timeout, and parse its reply. A failure
    /// counts towards failing fast; an answer resets that count.
    async fn call(&self, conn: &Conn, evalsha: &redis::Cmd) -> Result<ScriptReply, StoreError> {
        let mut conn = conn.clone();
        match tokio::time::timeout(self.timeout, conn.decide(evalsha)).await {
            Ok(Ok(reply)) => {
                self.timeouts.store(0, Ordering::Release);
                ScriptReply::parse(reply)
            }
            Ok(Err(e)) => {
                let error = classify(&e, self.timeout);
                self.note_failure(&error);
                Err(error)
            }
            Err(_) => {
                let error = StoreError::Timeout(self.timeout);
                self.note_failure(&error);
                Err(error)
            }
        }
    }

    /// The `EVALSHA` of some decisions, written straight into one command buffer: keys built
    /// in a reused scratch buffer, integers formatted without allocating (redis-rs writes them
    /// with itoa), no intermediate `Vec<Vec<u8>>` of keys and args.
    fn evalsha<'a>(
        &self,
        decisions: impl Iterator<Item = (&'a str, &'a [Limit])> + Clone,
    ) -> redis::Cmd {
        let (mut keys, mut key_bytes) = (0, 0);
        for (bucket, limits) in decisions.clone() {
            keys += limits.len();
            key_bytes += limits.len() * (self.prefix.len() + bucket.len() + 16);
        }
        let mut cmd = redis::Cmd::with_capacity(3 + 3 * keys, 64 + key_bytes + keys * 24);
        cmd.arg("EVALSHA").arg(SCRIPT.get_hash()).arg(keys);
        let mut key = Vec::with_capacity(64);
        for (bucket, limits) in decisions.clone() {
            for limit in limits {
                self.write_key(&mut key, bucket, limit);
                cmd.arg(&key[..]);
            }
        }
        for (_, limits) in decisions {
            cmd.arg(limits.len());
            for limit in limits {
                cmd.arg(limit.requests).arg(limit.window.as_micros() as u64);
            }
        }
        cmd
    }

    /// See [`Store::backend`].
    fn backend(&self) -> &'static str {
        match self.target {
            Target::Single(_) => "redis",
            Target::Cluster(_) => "redis_cluster",
        }
    }

    /// See [`Store::maintain`].
    async fn maintain(&self) {
        let Ok(_guard) = self.maintaining.try_lock() else {
            return;
        };
        let conn = match self.conn.load_full() {
            Some(conn) => conn,
            None => match self.connect().await {
                Ok(conn) => {
                    let conn = Arc::new(conn);
                    self.conn.store(Some(conn.clone()));
                    self.generation.fetch_add(1, Ordering::AcqRel);
                    conn
                }
                Err(error) => {
                    self.ping_failed(&error);
                    return;
                }
            },
        };
        let mut conn = (*conn).clone();
        let mut result = self.ping(&mut conn).await;
        if matches!(result, Err(StoreError::Unavailable(_))) {
            self.generation.fetch_add(1, Ordering::AcqRel);
            // A PING that finds the connection lost (or the last reconnect failed) makes the
            // ConnectionManager start a new attempt without waiting for it; a second PING
            // waits for that attempt, so a Redis that is back is back in one `maintain`.
            result = self.ping(&mut conn).await;
        }
        // Coming back (first connect, restart, failover): load the script before opening the
        // gate, so the first burst of requests does not pay NOSCRIPT + SCRIPT LOAD each.
        // Best effort: a shard that misses it (down now) is covered by the NOSCRIPT fallback.
        if result.is_ok() && !self.healthy.load(Ordering::Acquire) {
            if let Err(e) = self.bounded(conn.load_script()).await {
                log::debug!("{} store: SCRIPT LOAD failed: {e}", self.backend());
            }
        }
        match result {
            Ok(()) => {
                self.failed_pings.store(0, Ordering::Release);
                self.timeouts.store(0, Ordering::Release);
                if !self.healthy.swap(true, Ordering::AcqRel) {
                    log::info!("{} store ready", self.backend());
                }
            }
            Err(error) => self.ping_failed(&error),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn check(&self, bucket: &str, limits: &[Limit]) -> Result<Verdict, StoreError> {
        self.inner.check(bucket, limits).await
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn maintain(&self) {
        self.inner.maintain().await
    }

    fn is_ready(&self) -> bool {
        self.inner.healthy.load(Ordering::Acquire)
    }

    fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        self.inner.inspect_window(bucket, limits).await
    }

    async fn reset(&self, bucket: &str, limits: &[Limit]) -> Result<(), StoreError> {
        self.inner.reset_bucket(bucket, limits).await
    }
}

impl Inner {
    /// React to a failed `check` on one Redis: a lost connection, or a few timeouts in a row,
    /// close the gate until `maintain` gets a PING through. (The library reconnects in the
    /// background; meanwhile `check` answers at once instead of queueing behind it.)
    ///
    /// Not for a Cluster: there a failure usually concerns one shard, and closing the gate
    /// would fail the buckets of the healthy shards too. Its calls stay bounded by the
    /// timeout, and `maintain` closes the gate when no master answers at all.
    fn note_failure(&self, error: &StoreError) {
        if matches!(error, StoreError::Unavailable(_)) {
            // A lost connection (to a server or one cluster shard) may hide a restart that
            // emptied it: cached denials are void from now on.
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        if matches!(self.target, Target::Cluster(_)) {
            return;
        }
        match error {
            StoreError::Unavailable(_) => {
                if self.healthy.swap(false, Ordering::AcqRel) {
                    log::warn!("{} store unavailable: {error}", self.backend());
                }
            }
            StoreError::Timeout(_) => {
                let n = self.timeouts.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= TIMEOUTS_BEFORE_FAIL_FAST && self.healthy.swap(false, Ordering::AcqRel) {
                    log::warn!(
                        "{} store: {n} timeouts in a row, failing fast until Redis answers a PING",
                        self.backend()
                    );
                }
            }
            StoreError::Backend(_) | StoreError::Full => {}
        }
    }
}
