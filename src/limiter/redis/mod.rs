//! Redis store: the limiter state of every proxy instance in one Redis server, a Redis Cluster,
//! or a master behind Redis Sentinel.
//!
//! # At most one round trip per request
//!
//! Each decision is made by one `EVALSHA` of the sliding-window script, assembled from
//! `lua/sliding_window/` and `lua/kinds/` ([`crate::limiter::algo::script`]; its head documents
//! KEYS, ARGV and the reply); on one Redis, decisions pending at the same instant share one
//! call (the coalescer, [`crate::limiter::coalesce`]; `call.rs` is what it sends through). The script reads Redis's own clock (`TIME`), evicts, counts and records in
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
//! starts that limit afresh. A limit with a key of its own (`limits[].key`) counts under its own
//! bucket's keys; on a Cluster those may be in another slot (`stacked.rs`).
//!
//! # Connections and failure
//!
//! Connections are created in [`Store::maintain`], never in [`RedisStore::new`] nor in
//! [`Store::check`], and on the store's own I/O thread (`io.rs`): a redis-rs connection's
//! driver task lives on the runtime that created it, and there it reads replies as they
//! arrive, however busy the proxy's workers are. One Redis uses a
//! [`redis::aio::ConnectionManager`] (reconnects in the background), a Cluster a
//! [`redis::cluster_async::ClusterConnection`]; a master behind Sentinel is one Redis whose
//! address the Sentinels give (`sentinel.rs`), asked again whenever it stops answering or turns
//! out to be a replica. Only `conn.rs` tells the kinds apart (and `RedisStore::new`, which gives
//! a Cluster its per-master health, `shards.rs`): the rest of the store sees one
//! connection type and asks the target whether all keys live on one server (then decisions for
//! any buckets share a call, and a failed call closes the gate).
//!
//! `check` never waits for a connection: until one is up and answering, it fails at once with
//! [`StoreError::Unavailable`], and every call is bounded by `store.timeout`, so a dead or
//! frozen Redis costs a request at most that timeout, never the client library's multi-second
//! reconnect backoff. `maintain` PINGs about once a second; the answer drives
//! [`Store::is_ready`] and re-opens `check` after an outage. On one Redis, a lost connection or
//! a few timeouts in a row close `check` until then; on a Cluster only "no master answers"
//! does, so that one failed shard does not take the healthy ones down with it. All of that
//! bookkeeping, and the generation that voids cached denials, lives in the gate (`gate.rs`),
//! which `check` and the inspector share. A Cluster's masters are also probed one by one
//! (`shards.rs`): the slots of a master that is down (it failed its PING, sent each second and
//! at once when a call finds a connection lost) fail at once, without a call, so that redis-rs
//! never stalls the other masters' calls over it; a cluster connection that stalls anyway is
//! rebuilt (`maintain.rs`).

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use async_trait::async_trait;

use super::coalesce::known::LearnedUnder;
use super::coalesce::sender::{self, Coalescer};
use super::{Admission, Buckets, Change, Checked, Limit, Store, StoreError, Verdict, WindowView};
use conn::{Conn, Target};
use gate::Gate;
use shards::Shards;

mod acl;
mod call;
mod conn;
pub mod eviction;
mod gate;
mod inspect;
mod io;
mod maintain;
mod refund;
mod renew;
mod sentinel;
mod shards;
mod stacked;
mod top;

pub use acl::{CLUSTER_COMMANDS, REQUIRED_COMMANDS};
pub use top::TOP_COMMANDS;

/// Source of the sliding-window script, compiled into the binary (assembled from its parts:
/// [`crate::limiter::algo::script::SLIDING_WINDOW`]).
pub const SCRIPT_SOURCE: &str = crate::limiter::algo::script::SLIDING_WINDOW;

/// The script with its SHA1 computed once; shared by every store.
static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SCRIPT_SOURCE));

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
    /// A private CA and/or a client certificate for `rediss://` nodes (PEM, checked by the
    /// config); `None`: the system roots, no client certificate.
    pub tls: Option<redis::TlsCertificates>,
}

/// One Redis, a Redis Cluster's seed nodes, or the Sentinels that know a master.
#[derive(Debug, Clone)]
pub enum RedisNodes {
    /// One Redis server (or a primary behind a proxy).
    Single(Box<redis::ConnectionInfo>),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<redis::ConnectionInfo>),
    /// A master found through Redis Sentinel, followed across failovers.
    Sentinel(Box<SentinelNodes>),
}

/// Where to ask for the master, and how to talk to it once found.
#[derive(Debug, Clone)]
pub struct SentinelNodes {
    /// The Sentinels, each with its own credentials (`user:password@` in its URL).
    pub sentinels: Vec<redis::ConnectionInfo>,
    /// The name the Sentinels monitor the master under (`sentinel monitor <name> …`).
    pub master_name: String,
    /// The master's own database and credentials (its address comes from the Sentinels).
    pub master: redis::RedisConnectionInfo,
}

/// The Redis (or Redis Cluster) limiter store: a cheap handle on the state below, which the task
/// that sends a lane's batches of decisions (the coalescer's sender) shares.
pub struct RedisStore {
    inner: Arc<Inner>,
}

/// The store's state.
struct Inner {
    /// Where the state lives: the server(s), the key namespace and each call's deadline.
    target: Target,
    /// The current connection; `None` until `maintain` connects, or after it gave one up.
    conn: ArcSwapOption<Conn>,
    /// Whether `check` and the inspector may use `conn`, the generation of its state, and
    /// `maintain`'s bookkeeping.
    gate: Gate,
    /// The last `maxmemory-policy` verdict reported (see `eviction.rs`).
    eviction: eviction::Reported,
    /// A Cluster's health per master (`shards.rs`); `None` for one Redis and behind Sentinel.
    shards: Option<Shards>,
    /// Decisions waiting to be sent, calls in flight and denials found, per lane.
    coalescer: Coalescer,
    /// Where connections live and calls are sent from (last: its drop stops the thread).
    io: io::IoThread,
}

impl RedisStore {
    /// A store for `target`. Builds clients without connecting and needs no runtime. The first
    /// [`Store::maintain`] connects; until then `check` returns [`StoreError::Unavailable`].
    pub fn new(target: &RedisTarget) -> Result<RedisStore, StoreError> {
        let client = Target::new(target)?;
        let gate = Gate::new(client.label(), client.one_server());
        let shards = match &target.nodes {
            RedisNodes::Cluster(seeds) => Some(Shards::new(
                seeds,
                target.tls.clone(),
                target.timeout,
                conn::connect_timeout(target.timeout),
            )),
            RedisNodes::Single(_) | RedisNodes::Sentinel(_) => None,
        };
        let coalescer = Coalescer::new(client.lanes());
        let io = io::IoThread::start(&format!("slidegate-{}", client.label()))
            .map_err(|e| StoreError::Backend(format!("cannot start the store I/O thread: {e}")))?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                target: client,
                conn: ArcSwapOption::empty(),
                gate,
                eviction: eviction::Reported::default(),
                shards,
                coalescer,
                io,
            }),
        })
    }

    /// The Redis key holding `limit`'s log for `bucket`: `<prefix>:{<bucket>}:<window ms>`.
    pub fn key(&self, bucket: &str, limit: &Limit) -> String {
        self.inner.key(bucket, limit)
    }

    /// Turn the local deny cache on (`store.local_deny_cache`): the memory of denials this
    /// store learns from its calls answers a bucket known to be full without a call, for as
    /// long as the denial proves it and at most `max_age` (a `FLUSHALL`, an eviction or a
    /// failover on a kept connection may have freed it), also while calls fail fast. Off, a
    /// denial answers only the decisions of its lane's busy period.
    pub fn with_deny_cache(self, max_age: Duration) -> RedisStore {
        self.inner.coalescer.known().serve_cache(max_age);
        self
    }

    /// See [`Store::check`]. Fails at once while the gate is closed or nothing is connected,
    /// rather than queue behind a reconnect.
    ///
    /// Every limit's bucket must be in one lane (see `stacked.rs` for those that are not).
    async fn decide(&self, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked {
        if limits.is_empty() {
            return Ok(Verdict {
                admitted: true,
                states: Vec::new(),
                recorded_at: None,
                recorded_each: Vec::new(),
            });
        }
        if let Err(error) = self.inner.live_conn_for(buckets.first()) {
            return self.inner.known_while_closed(buckets, limits).ok_or(error);
        }
        sender::decide(&self.inner, buckets, limits).await
    }
}

impl Inner {
    /// The live connection, if the gate lets calls through: fail fast rather than queue
    /// behind a reconnect (`maintain` re-opens the gate).
    fn live_conn(&self) -> Result<Arc<Conn>, StoreError> {
        let Some(conn) = self.conn.load_full() else {
            return Err(StoreError::Unavailable("not connected".into()));
        };
        self.gate.pass()?;
        Ok(conn)
    }

    /// [`Inner::live_conn`], if `bucket`'s Cluster master is up too (`shards.rs`): a dead
    /// master's slots fail at once, so that their calls never stall the other masters'.
    fn live_conn_for(&self, bucket: &str) -> Result<Arc<Conn>, StoreError> {
        let conn = self.live_conn()?;
        if let Some(shards) = &self.shards {
            shards.pass(self.target.lane_of(bucket))?;
        }
        Ok(conn)
    }

    /// While calls fail fast, the deny cache still answers a bucket known to be full (the
    /// lanes answer it on the main line).
    fn known_while_closed(&self, buckets: &Buckets<'_>, limits: &[Limit]) -> Option<Verdict> {
        let known = self.coalescer.known();
        let under = LearnedUnder {
            generation: self.gate.generation(),
            epoch: 0,
        };
        let cached = known.outlives_lanes() && buckets.is_one();
        cached.then(|| known.verdict(buckets.first(), limits, under, Instant::now()))?
    }
}

#[async_trait]
impl Store for RedisStore {
    /// Concurrent decisions share calls per lane (the coalescer's sender). Redis keys name
    /// their bucket, so the route is not needed.
    async fn check(&self, _route: &str, buckets: &Buckets<'_>, limits: &[Limit]) -> Checked {
        if buckets.is_one() {
            return self.decide(buckets, limits).await;
        }
        self.decide_stacked(buckets, limits).await
    }

    async fn read_shared(&self, hash: &str, field: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let (inner, hash, field) = (self.inner.clone(), hash.to_owned(), field.to_vec());
        let read = async move { inner.read_field(&hash, &field).await };
        self.inner.io.run(read).await
    }

    fn backend(&self) -> &'static str {
        self.inner.target.label()
    }

    async fn maintain(&self) {
        self.inner.watch_for_stalls();
        let inner = self.inner.clone();
        let _ = self
            .inner
            .io
            .run(async move {
                inner.maintain().await;
                Ok(())
            })
            .await;
    }

    fn is_ready(&self) -> bool {
        self.inner.gate.is_open()
    }

    fn generation(&self) -> u64 {
        self.inner.gate.generation()
    }

    fn sweep_expired(&self) {
        let generation = self.inner.gate.generation();
        self.inner
            .coalescer
            .known()
            .sweep(Instant::now(), generation);
    }

    async fn inspect(&self, bucket: &str, limits: &[Limit]) -> Result<WindowView, StoreError> {
        let (inner, bucket, limits) = (self.inner.clone(), bucket.to_owned(), limits.to_vec());
        let read = async move { inner.inspect_window(&bucket, &limits).await };
        self.inner.io.run(read).await
    }

    async fn refund(&self, admission: Admission<'_>) -> Result<(), StoreError> {
        let change = admission.change;
        let (_, buckets, limits, recorded_at) = admission.parts();
        self.refund_each(buckets, limits, recorded_at, change)
            .await?;
        if change != Change::Charge {
            // An entry came back: a denial remembered before it is too pessimistic now (a
            // charge only adds, so every denial still stands).
            for (bucket, _) in buckets.groups(limits.len()) {
                self.inner.coalescer.known().forget(bucket);
            }
        }
        Ok(())
    }

    async fn renew(&self, admission: Admission<'_>) -> Result<Vec<u64>, StoreError> {
        let (_, buckets, limits, recorded_at) = admission.parts();
        self.renew_each(buckets, limits, recorded_at).await
    }

    async fn reset(&self, bucket: &str, limits: &[Limit]) -> Result<(), StoreError> {
        let (inner, bucket, limits) = (self.inner.clone(), bucket.to_owned(), limits.to_vec());
        let forget = bucket.clone();
        let reset = async move { inner.reset_bucket(&bucket, &limits).await };
        self.inner.io.run(reset).await?;
        // After the store forgot the bucket: a denial remembered from now on was decided after
        // the reset. (A check already in flight when the reset ran may still bring back its
        // older denial; it lapses at its deadline. Other proxies' memories are not reached.)
        self.inner.coalescer.known().forget(&forget);
        Ok(())
    }

    fn rules_changed(&self) {
        // New limits may admit what the old ones denied.
        self.inner.coalescer.known().clear();
    }

    fn shares_top(&self) -> bool {
        true
    }

    /// On the store's I/O thread, where its connections live (`io.rs`).
    async fn fold_top(&self, folds: Vec<crate::limiter::top::TopFold>) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        self.inner
            .io
            .run(async move { inner.fold_top(folds).await })
            .await
    }

    async fn read_top(
        &self,
        query: crate::limiter::top::TopQuery,
    ) -> Result<Vec<crate::limiter::top::TopCount>, StoreError> {
        let inner = self.inner.clone();
        self.inner
            .io
            .run(async move { inner.read_top(query).await })
            .await
    }
}
