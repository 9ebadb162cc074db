//! An upstream's servers as Pingora's `ServiceDiscovery`: the addresses its names resolved to
//! when the rules were built, then, every `resolve_interval`, what they resolve to now.
//!
//! A name that fails to resolve, or resolves to nothing, keeps its last addresses (nginx's
//! `resolve` does the same), so a resolver outage never empties a pool.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::Backend;

use crate::config::HostPort;

/// What looks a `host:port` up: the system's resolver, or a test's.
#[async_trait]
pub trait Resolve: Send + Sync {
    /// The addresses of `host` (a name or an address) at `port`.
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>>;
}

/// The system's resolver (`getaddrinfo`, on Tokio's blocking pool): `/etc/hosts`, then DNS.
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// The servers of one upstream, looked up again at each `discover`.
pub struct Resolving {
    upstream: String,
    servers: Vec<HostPort>,
    resolver: Arc<dyn Resolve>,
    /// The last addresses of each server, in `servers` order.
    last: Mutex<Vec<Vec<SocketAddr>>>,
    /// The first `discover` gives the addresses resolved when the rules were built.
    seeded: AtomicBool,
}

impl Resolving {
    /// `servers` of `upstream`, which resolved to `first` (one list per server).
    pub fn new(
        upstream: &str,
        servers: Vec<HostPort>,
        first: Vec<Vec<SocketAddr>>,
        resolver: Arc<dyn Resolve>,
    ) -> Resolving {
        Resolving {
            upstream: upstream.to_string(),
            servers,
            resolver,
            last: Mutex::new(first),
            seeded: AtomicBool::new(false),
        }
    }

    fn backends(&self) -> BTreeSet<Backend> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.iter().flatten().map(|a| super::backend(*a)).collect()
    }
}

#[async_trait]
impl ServiceDiscovery for Resolving {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        if !self.seeded.swap(true, Ordering::Relaxed) {
            return Ok((self.backends(), HashMap::new()));
        }
        for (i, server) in self.servers.iter().enumerate() {
            match self.resolver.resolve(&server.host, server.port).await {
                Ok(mut addrs) if !addrs.is_empty() => {
                    addrs.sort();
                    addrs.dedup();
                    let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
                    last[i] = addrs;
                }
                Ok(_) => log::warn!(
                    "upstream {}: {server} resolves to no address; keeping its last ones",
                    self.upstream
                ),
                Err(e) => log::warn!(
                    "upstream {}: {server} does not resolve ({e}); keeping its last addresses",
                    self.upstream
                ),
            }
        }
        // Every server's addresses, enabled (ejection is the balancer's own flag).
        Ok((self.backends(), HashMap::new()))
    }
}
