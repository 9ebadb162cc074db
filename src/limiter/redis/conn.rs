//! Connections to one Redis or a Cluster: building clients, the calls the store makes on a
//! live connection, and how redis-rs errors map to the store's error kinds.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::{SCRIPT, SCRIPT_SOURCE};
use crate::limiter::StoreError;

/// Library-level timeouts are set to this multiple of the store's deadline: a safety net that
/// never fires before the store's own timer.
pub(super) const SAFETY_NET_FACTOR: u32 = 2;

/// Where the store connects; built without connecting.
// One per store, built once: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// A live connection. Both kinds are cheap handles (`Clone` shares the underlying sockets) and
/// multiplex concurrent requests over one socket per server.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Run one sliding-window script invocation.
    pub(super) async fn invoke(
        &mut self,
        call: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<Vec<i64>> {
        match self {
            Conn::Single(c) => call.invoke_async(c).await,
            Conn::Cluster(c) => call.invoke_async(c).await,
        }
    }

    /// Run one prepared `EVALSHA` of the sliding-window script; on `NOSCRIPT` (Redis restarted,
    /// failed over, `SCRIPT FLUSH`) load the script and send it again.
    pub(super) async fn decide(
        &mut self,
        evalsha: &redis::Cmd,
    ) -> redis::RedisResult<redis::Value> {
        let first = match self {
            Conn::Single(c) => evalsha.query_async(c).await,
            Conn::Cluster(c) => evalsha.query_async(c).await,
        };
        match first {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let load = SCRIPT.prepare_invoke();
                match self {
                    Conn::Single(c) => load.load_async(c).await?,
                    Conn::Cluster(c) => load.load_async(c).await?,
                };
                match self {
                    Conn::Single(c) => evalsha.query_async(c).await,
                    Conn::Cluster(c) => evalsha.query_async(c).await,
                }
            }
            other => other,
        }
    }

    /// `SCRIPT LOAD` the sliding-window script (on every master of a Cluster).
    pub(super) async fn load_script(&mut self) -> redis::RedisResult<()> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(SCRIPT_SOURCE);
        match self {
            Conn::Single(c) => cmd.query_async::<redis::Value>(c).await.map(drop),
            Conn::Cluster(c) => {
                let all_masters = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                c.route_command(cmd, all_masters).await.map(drop)
            }
        }
    }

    /// PING. A Cluster counts as up while any master answers: one failed shard must not
    /// stop the others (checks for its slots fail on their own, within the timeout).
    pub(super) async fn ping(&mut self) -> redis::RedisResult<()> {
        let cmd = redis::cmd("PING");
        match self {
            Conn::Single(c) => cmd.query_async::<redis::Value>(c).await.map(drop),
            Conn::Cluster(c) => {
                let any_master = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::OneSucceeded),
                ));
                c.route_command(cmd, any_master).await.map(drop)
            }
        }
    }
}

/// How long one connection attempt may take. A new connection needs a TCP (maybe TLS) handshake
/// and `HELLO`/`AUTH` round trips, so it gets more than one call's timeout, but it stays well
/// under the one-second `maintain` period.
pub(super) fn connect_timeout(timeout: Duration) -> Duration {
    (timeout * 4).clamp(Duration::from_millis(100), Duration::from_millis(400))
}

/// Map a redis-rs error to the store's three kinds: the connection is the problem
/// (`Unavailable`), the clock ran out (`Timeout`), or Redis answered with an error (`Backend`).
pub(super) fn classify(e: &RedisError, timeout: Duration) -> StoreError {
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
                )
        );
    if unavailable {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Backend(e.to_string())
    }
}
