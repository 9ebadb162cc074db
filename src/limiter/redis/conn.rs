//! The connection seam: the one place that knows one Redis from a Cluster and from a master
//! behind Sentinel (`sentinel.rs`, then talked to as one Redis). Everything else in
//! the store talks to a [`Target`] (built without connecting) and a [`Conn`] (a live
//! connection implementing [`redis::aio::ConnectionLike`]), and bounds every maintenance and
//! admin call with [`within`], which also maps redis-rs errors to the store's error kinds
//! (a decision's call is bounded by its lane's sender instead, forgiving the proxy's own lag:
//! `coalesce/deadline.rs`).

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::io::tcp::TcpSettings;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use super::sentinel::{probe_master, SentinelTarget};
use super::{RedisNodes, RedisTarget, SCRIPT, SCRIPT_SOURCE};
use crate::limiter::StoreError;

/// Library-level timeouts are set to this multiple of the store's deadline: a safety net that
/// never fires before the store's own timer.
const SAFETY_NET_FACTOR: u32 = 2;

/// Hash slots of a Redis Cluster.
const CLUSTER_SLOTS: usize = 16384;

/// Where the store's state lives and how every call reaches it: the server (one Redis, a
/// Cluster or a master behind Sentinel: that choice stays in this file), the key namespace and
/// the deadline of each call. Built without connecting.
pub(super) struct Target {
    server: Server,
    /// Key namespace (`store.prefix`), validated free of `{`, `}` and whitespace.
    pub(super) prefix: String,
    /// `store.timeout`: bound on every call, and on each PING.
    pub(super) timeout: Duration,
}

/// The clients of one kind of deployment.
// One per store, built once: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Server {
    Single(redis::Client),
    Cluster(ClusterClient),
    Sentinel(SentinelTarget),
}

impl Server {
    /// Clients for `nodes`, configured for calls bounded by `timeout`, with `tls` (a private
    /// CA, a client certificate) on `rediss://` nodes; nothing connects yet.
    fn new(
        nodes: &RedisNodes,
        tls: Option<&redis::TlsCertificates>,
        timeout: Duration,
    ) -> Result<Server, StoreError> {
        match nodes {
            RedisNodes::Single(info) => {
                let info = no_delay((**info).clone());
                match tls {
                    Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
                    None => redis::Client::open(info),
                }
                .map(Server::Single)
                .map_err(|e| StoreError::Backend(format!("invalid Redis URL: {e}")))
            }
            RedisNodes::Cluster(seeds) => {
                let mut builder = ClusterClientBuilder::new(seeds.iter().cloned().map(no_delay))
                    .tcp_settings(
                        seeds
                            .first()
                            .map_or_else(TcpSettings::default, |s| s.tcp_settings().clone())
                            .set_nodelay(true),
                    )
                    // Retries happen inside one call, bounded by `store.timeout` (the store's
                    // deadline fails the call whatever is left): quick ones cover a MOVED,
                    // ASK or TRYAGAIN while a slot migrates. Four, since redis-rs 1.8 sends an
                    // ASK's `ASKING` apart from its command on a shared connection, so another
                    // call can slip between them and the redirect repeat (with two, 34 calls of
                    // a source-first migration under load failed to `on_error` in an audit).
                    .retries(4)
                    .min_retry_wait(1)
                    .max_retry_wait(timeout.as_millis().clamp(1, 100) as u64)
                    .connection_timeout(connect_timeout(timeout))
                    // The store's own deadline bounds every call; the library's per-attempt
                    // timeout is only a safety net that frees a hung attempt.
                    .response_timeout(timeout * SAFETY_NET_FACTOR)
                    .overall_response_timeout(None);
                if let Some(certs) = tls {
                    builder = builder.certs(certs.clone());
                }
                builder
                    .build()
                    .map(Server::Cluster)
                    .map_err(|e| StoreError::Backend(format!("invalid Redis Cluster config: {e}")))
            }
            RedisNodes::Sentinel(nodes) => SentinelTarget::new(nodes).map(Server::Sentinel),
        }
    }
}

impl Target {
    /// The clients for `target` (see [`RedisTarget`]); nothing connects yet.
    pub(super) fn new(target: &RedisTarget) -> Result<Target, StoreError> {
        Ok(Target {
            server: Server::new(&target.nodes, target.tls.as_ref(), target.timeout)?,
            prefix: target.prefix.clone(),
            timeout: target.timeout,
        })
    }

    /// The backend name used as a metric label.
    pub(super) fn label(&self) -> &'static str {
        match &self.server {
            Server::Single(_) => "redis",
            Server::Cluster(_) => "redis_cluster",
            Server::Sentinel(_) => "redis_sentinel",
        }
    }

    /// True when every key lives on one server, so decisions for any buckets may share one
    /// script call, and one failed call says the whole store is in trouble. A Cluster spreads
    /// buckets over slots: a call carries one slot's decisions, and a failure usually concerns
    /// one shard only.
    pub(super) fn one_server(&self) -> bool {
        match &self.server {
            Server::Single(_) | Server::Sentinel(_) => true,
            Server::Cluster(_) => false,
        }
    }

    /// How many lanes decisions travel in (see `coalesce/sender.rs`): one for one server, one per hash
    /// slot for a Cluster.
    pub(super) fn lanes(&self) -> usize {
        match &self.server {
            Server::Single(_) | Server::Sentinel(_) => 1,
            Server::Cluster(_) => CLUSTER_SLOTS,
        }
    }

    /// The lane of `bucket`: on a Cluster its hash slot, since its keys are
    /// `<prefix>:{<bucket>}:…` and the braces make `bucket` the hash tag.
    pub(super) fn lane_of(&self, bucket: &str) -> usize {
        match &self.server {
            Server::Single(_) | Server::Sentinel(_) => 0,
            Server::Cluster(_) => {
                usize::from(crc16::State::<crc16::XMODEM>::calculate(bucket.as_bytes()))
                    % CLUSTER_SLOTS
            }
        }
    }

    /// True when a lost connection should not wait for the same address to come back: behind
    /// Sentinel the master may now be another server, so `maintain` asks again at once.
    pub(super) fn follows_failover(&self) -> bool {
        match &self.server {
            Server::Sentinel(_) => true,
            Server::Single(_) | Server::Cluster(_) => false,
        }
    }

    /// Open a new connection (behind Sentinel: to the master the Sentinels name now), bounded
    /// so that `maintain` returns promptly.
    pub(super) async fn connect(&self) -> Result<Conn, StoreError> {
        let timeout = self.timeout;
        // Asking the Sentinels costs a round trip to each and a connection to the master it
        // names (to check its `ROLE`) before the connection of our own.
        let budget = connect_timeout(timeout) * if self.follows_failover() { 4 } else { 2 };
        let attempt = async {
            match &self.server {
                Server::Single(client) => one_redis(client.clone(), timeout).await,
                Server::Sentinel(sentinels) => {
                    let master = sentinels.master().await?.get_connection_info().clone();
                    one_redis(redis::Client::open(no_delay(master))?, timeout).await
                }
                Server::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            }
        };
        within(budget, attempt).await
    }

    /// Behind Sentinel: do the Sentinels now name another master than the one connected to?
    /// (Always no elsewhere.) Bounded like a connect.
    pub(super) async fn master_moved(&self) -> Result<bool, StoreError> {
        match &self.server {
            Server::Sentinel(sentinels) => {
                within(connect_timeout(self.timeout) * 2, sentinels.moved()).await
            }
            Server::Single(_) | Server::Cluster(_) => Ok(false),
        }
    }

    /// The health probe `maintain` sends: PING, or behind Sentinel `ROLE`, which also tells a
    /// demoted master (see `sentinel.rs`). (A Cluster is probed master by master instead, off
    /// the connection: `shards.rs`.)
    pub(super) async fn probe(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        match &self.server {
            Server::Sentinel(_) => probe_master(conn).await,
            Server::Single(_) | Server::Cluster(_) => conn.ping().await,
        }
    }
}

/// A [`ConnectionManager`] on one Redis (standalone, or the master Sentinel named).
async fn one_redis(client: redis::Client, timeout: Duration) -> redis::RedisResult<Conn> {
    let config = ConnectionManagerConfig::new()
        // Reconnects run in the background while `check` fails fast (see the gate); one quick
        // retry, then the next PING starts another.
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
        .set_connection_timeout(Some(connect_timeout(timeout)))
        // No library response timer: the store's deadline is the only one (a second timer of
        // the same length would race it, and its expiries would escape the fail-fast count).
        .set_response_timeout(None);
    ConnectionManager::new_with_config(client, config)
        .await
        .map(Conn::Single)
}

/// A live connection (a master behind Sentinel is `Single`). Both kinds are cheap handles (`Clone` shares the underlying sockets) and
/// multiplex concurrent requests over one socket per server.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Run one prepared `EVALSHA` of the sliding-window script; on `NOSCRIPT` (Redis restarted,
    /// failed over, `SCRIPT FLUSH`) load the script and send it again.
    pub(super) async fn decide(&mut self, evalsha: &Cmd) -> redis::RedisResult<Value> {
        match evalsha.query_async(self).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                SCRIPT.prepare_invoke().load_async(self).await?;
                evalsha.query_async(self).await
            }
            other => other,
        }
    }

    /// `SCRIPT LOAD` the sliding-window script (on every master of a Cluster).
    pub(super) async fn load_script(&mut self) -> redis::RedisResult<()> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(SCRIPT_SOURCE);
        self.on_masters(cmd, ResponsePolicy::AllSucceeded).await
    }

    /// PING (on a Cluster, any master answering will do).
    async fn ping(&mut self) -> redis::RedisResult<()> {
        self.on_masters(redis::cmd("PING"), ResponsePolicy::OneSucceeded)
            .await
    }

    /// Send `cmd` to the server, or to every master of a Cluster and combine by `policy`.
    async fn on_masters(&mut self, cmd: Cmd, policy: ResponsePolicy) -> redis::RedisResult<()> {
        match self {
            Conn::Single(c) => cmd.query_async::<Value>(c).await.map(drop),
            Conn::Cluster(c) => {
                let masters =
                    RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, Some(policy)));
                c.route_command(cmd, masters).await.map(drop)
            }
        }
    }
}

/// `info` with `TCP_NODELAY` (redis-rs leaves it off): with several calls in flight on one
/// connection, Nagle's algorithm would hold each command written while an earlier one is
/// unacknowledged until that ACK comes back, which with Redis a network hop away is one more
/// round trip (measured through `tests/it/redis_rtt.rs`'s delay proxy: 2 round trips at 64 callers
/// instead of 1).
fn no_delay(info: redis::ConnectionInfo) -> redis::ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    info.set_tcp_settings(tcp)
}

/// Run one call to Redis within `timeout`, mapping its failure to the store's error kinds.
pub(super) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => classified(timeout, result),
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

/// A call's result with its failure mapped to the store's error kinds (`timeout` names the
/// deadline in a library timeout).
pub(super) fn classified<T>(
    timeout: Duration,
    result: redis::RedisResult<T>,
) -> Result<T, StoreError> {
    result.map_err(|e| classify(&e, timeout))
}

/// True when `e` says the connection to the server was lost or refused (not an answer, not a
/// timeout): on a Cluster, that master is down (`shards.rs`).
pub(super) fn connection_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == ErrorKind::ClusterConnectionNotFound
}

/// How long one connection attempt may take. A new connection needs a TCP (maybe TLS) handshake
/// and `HELLO`/`AUTH` round trips, so it gets more than one call's timeout, but it stays well
/// under the one-second `maintain` period.
pub(super) fn connect_timeout(timeout: Duration) -> Duration {
    (timeout * 4).clamp(Duration::from_millis(100), Duration::from_millis(400))
}

/// Map a redis-rs error to the store's three kinds: the connection is the problem
/// (`Unavailable`), the clock ran out (`Timeout`), or Redis answered with an error (`Backend`).
/// `READONLY` is the connection's problem too: the server is a replica now (a failover
/// demoted it), and writes there would be lost, so the gate closes until a master answers.
fn classify(e: &RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    let unavailable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::ReadOnly
                )
        );
    if unavailable {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}
