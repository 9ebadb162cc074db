//! Redis Sentinel: which server is the master now. The Sentinels are asked (redis-rs
//! [`redis::sentinel::Sentinel`]: up to three at once, the first valid answer in the configured
//! order wins, and the named master must confirm with `ROLE` that it is one) whenever the store
//! connects; `conn.rs` then talks to that master as to one Redis. A master that stops answering
//! or answers `ROLE` as a replica (demoted by a failover) is given up at once, and the Sentinels
//! are asked again (`maintain.rs`), so a failover is followed without a restart. And since an
//! old master stays a writable master until Sentinel reconfigures it (about 10 s after a
//! `SENTINEL FAILOVER`, whose promoted replica never sees what is written meanwhile), `maintain`
//! also asks the Sentinels once a second which master they name ([`SentinelTarget::moved`]), and
//! follows a new one as it follows a lost one.

use redis::aio::ConnectionLike;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{ErrorKind, RedisError, Role, ServerErrorKind};

use super::SentinelNodes;
use crate::limiter::StoreError;

/// The Sentinels of one master, and how to reach the master they name.
pub(super) struct SentinelTarget {
    /// redis-rs keeps one verified connection per Sentinel in here, hence the lock: one
    /// discovery at a time (only `maintain` discovers, and it is serialized anyway).
    sentinels: tokio::sync::Mutex<Sentinel>,
    /// `store.master_name`.
    master_name: String,
    /// The master's database and credentials; its address comes from the Sentinels.
    master: SentinelNodeConnectionInfo,
    /// The address of the master last connected to (as text: redis-rs's address type has no
    /// equality).
    connected: std::sync::Mutex<Option<String>>,
}

impl SentinelTarget {
    /// A target for `nodes`; nothing connects yet.
    pub(super) fn new(nodes: &SentinelNodes) -> Result<SentinelTarget, StoreError> {
        let sentinels = Sentinel::build(nodes.sentinels.clone())
            .map_err(|e| StoreError::Backend(format!("invalid Sentinel config: {e}")))?;
        Ok(SentinelTarget {
            sentinels: tokio::sync::Mutex::new(sentinels),
            master_name: nodes.master_name.clone(),
            master: SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(nodes.master.clone()),
            connected: std::sync::Mutex::new(None),
        })
    }

    /// Do the Sentinels now name another master than the one last connected to (a failover,
    /// planned or not, while the old one still answers as a master)?
    pub(super) async fn moved(&self) -> redis::RedisResult<bool> {
        let named = self.named().await?.get_connection_info().addr().to_string();
        let connected = self.connected.lock().unwrap_or_else(|e| e.into_inner());
        Ok(connected.as_deref().is_some_and(|c| c != named))
    }

    /// A client for the current master, as the Sentinels name it and it confirms itself.
    /// The caller bounds the time (the future may be dropped at any await: redis-rs caches
    /// only Sentinel connections it has verified).
    pub(super) async fn master(&self) -> redis::RedisResult<redis::Client> {
        let client = self.named().await?;
        let addr = client.get_connection_info().addr().to_string();
        *self.connected.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
        Ok(client)
    }

    /// The master the Sentinels name now, confirmed by its `ROLE`.
    async fn named(&self) -> redis::RedisResult<redis::Client> {
        let mut sentinels = self.sentinels.lock().await;
        let client = sentinels
            .async_master_for(&self.master_name, Some(&self.master))
            .await?;
        log::debug!(
            "Sentinel names {} for master {:?}",
            client.get_connection_info().addr(),
            self.master_name
        );
        Ok(client)
    }
}

/// The health probe on a master found through Sentinel: `ROLE` instead of `PING`, so that a
/// master demoted to a replica (it came back after a failover, or Sentinel moved the role while
/// the connection stayed up) reads as lost, and `maintain` asks the Sentinels again.
pub(super) async fn probe_master(conn: &mut impl ConnectionLike) -> redis::RedisResult<()> {
    let role: Role = redis::cmd("ROLE").query_async(conn).await?;
    match role {
        Role::Primary { .. } => Ok(()),
        _ => Err(not_master()),
    }
}

/// What a demoted master reads as: the `READONLY` a write to it would get, which the store
/// classifies as a lost connection (the gate closes, cached denials are void).
fn not_master() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::ReadOnly),
        "the server the Sentinels named is no longer the master",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demoted_master_is_a_lost_connection_to_the_store() {
        let e = super::super::conn::classified::<()>(
            std::time::Duration::from_millis(50),
            Err(not_master()),
        );
        assert!(matches!(e, Err(StoreError::Unavailable(_))), "{e:?}");
    }
}
