//! The health of an upstream's servers: active checks (Pingora's `TcpHealthCheck` and
//! `HttpHealthCheck`, run by [`HealthService`]), passive ejection (nginx's `max_fails` and
//! `fail_timeout`: [`PoolHealth::failed`]) and names looked up again (`resolve_interval`:
//! [`Resolving`], a Pingora `ServiceDiscovery`).
//!
//! A server is **up** unless its checks failed `unhealthy` times in a row (until it passes
//! `healthy` in a row) or it was ejected (for `fail_timeout`). The balancer reads both from
//! Pingora's own per-backend state (its health, and its enable flag, which ejection clears), so
//! picking a server costs no more than before; this module keeps the reasons, writes one line
//! per change and sets `slidegate_upstream_server_up`. Nothing here is on a request's path but
//! [`PoolHealth::failed`], called on a failure only.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use pingora::lb::{selection::RoundRobin, Backend, Backends, LoadBalancer};
use pingora::upstreams::peer::HttpPeer;
use prometheus::{register_int_gauge_vec, IntGaugeVec};

use crate::config::{UpstreamHealth, UpstreamSpec};

mod check;
mod discovery;
mod service;

pub use check::build_check;
pub use discovery::{Resolve, Resolving, SystemResolver};
pub use service::HealthService;

/// `slidegate_upstream_server_up{upstream, server}`.
pub static SERVER_UP: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "slidegate_upstream_server_up",
        "1 while a server of an upstream takes requests, 0 while it is out (failed health \
         checks, or ejected after max_fails failures)",
        &["upstream", "server"]
    )
    .expect("register slidegate_upstream_server_up")
});

/// What is known of one server.
struct Server {
    /// Failures counted in the current `fail_timeout` window, and when it began.
    fails: u32,
    since: Option<Instant>,
    /// Ejected (passive) until its `fail_timeout` is over.
    ejected: bool,
    /// Its active checks failed `unhealthy` times in a row, and have not passed `healthy` since.
    failing_checks: bool,
    /// What was last reported (the gauge, the log).
    up: bool,
}

impl Server {
    fn new() -> Server {
        Server {
            fails: 0,
            since: None,
            ejected: false,
            failing_checks: false,
            up: true,
        }
    }
}

/// One upstream's balancer and the health of its servers.
pub struct PoolHealth {
    upstream: String,
    settings: UpstreamHealth,
    /// Round-robin over the current servers, with Pingora's health and enable flags.
    pub lb: Arc<LoadBalancer<RoundRobin>>,
    servers: Mutex<HashMap<SocketAddr, Server>>,
    /// Number of current addresses (bounds a request's connect retries).
    size: AtomicUsize,
    /// Whether [`HealthService`] runs this pool's checks and look-ups yet.
    started: AtomicBool,
}

impl PoolHealth {
    /// The balancer and health of `spec`, whose servers resolved to `resolved` (one list per
    /// server, in `spec.servers` order). `template` is a peer of its transport, for the checks.
    pub fn build(
        spec: &UpstreamSpec,
        resolved: Vec<Vec<SocketAddr>>,
        template: HttpPeer,
        resolver: Arc<dyn Resolve>,
    ) -> Arc<PoolHealth> {
        let mut addrs: Vec<SocketAddr> = resolved.iter().flatten().copied().collect();
        addrs.sort();
        addrs.dedup();
        let servers = spec.servers.clone();
        let discovery = Resolving::new(&spec.name, servers, resolved, resolver);
        let mut lb = LoadBalancer::from_backends(Backends::new(Box::new(discovery)));
        let cell = PoolCell::default();
        if let Some(check) = &spec.health.check {
            let host = spec.servers[0].to_string();
            lb.set_health_check(build_check(check, &host, template, cell.clone()));
        }
        // The first discovery gives the addresses resolved above: no waiting.
        {
            let mut update = std::pin::pin!(lb.update());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let seeded = std::future::Future::poll(update.as_mut(), &mut cx);
            debug_assert!(matches!(seeded, std::task::Poll::Ready(Ok(()))));
        }
        let upstream = spec.name.as_str();
        let servers = addrs.iter().map(|a| (*a, Server::new())).collect();
        for addr in &addrs {
            SERVER_UP
                .with_label_values(&[upstream, &addr.to_string()])
                .set(1);
        }
        let pool = Arc::new(PoolHealth {
            upstream: upstream.to_string(),
            settings: spec.health.clone(),
            lb: Arc::new(lb),
            servers: Mutex::new(servers),
            size: AtomicUsize::new(addrs.len()),
            started: AtomicBool::new(false),
        });
        let _ = cell.set(Arc::downgrade(&pool));
        pool
    }

    /// Number of current addresses.
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Server>> {
        self.servers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A failed connect to `addr`, or a request it failed (502/504): counted against
    /// `max_fails` within `fail_timeout`; the one that reaches it ejects the server for
    /// `fail_timeout` (nginx's `max_fails`, `fail_timeout`).
    pub fn failed(self: &Arc<Self>, addr: SocketAddr, what: &dyn std::fmt::Display) {
        let (max, window) = (self.settings.max_fails, self.settings.fail_timeout);
        if max == 0 {
            return;
        }
        // The restore needs a runtime to wait on; every caller runs on one.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = Instant::now();
        let mut servers = self.servers();
        let Some(server) = servers.get_mut(&addr) else {
            return;
        };
        if server.ejected {
            return;
        }
        if server.since.is_none_or(|since| now - since > window) {
            (server.fails, server.since) = (0, Some(now));
        }
        server.fails += 1;
        if server.fails < max {
            return;
        }
        server.ejected = true;
        self.lb.backends().set_enable(&backend(addr), false);
        let why = format!(
            "out for {}: {} failure(s) within {} (last: {what})",
            humantime::format_duration(window),
            server.fails,
            humantime::format_duration(window)
        );
        self.report(addr, server, &why);
        drop(servers);
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(window).await;
            if let Some(pool) = pool.upgrade() {
                pool.restore(addr);
            }
        });
    }

    /// `addr`'s `fail_timeout` is over: it takes requests again (unless its checks fail).
    fn restore(&self, addr: SocketAddr) {
        let mut servers = self.servers();
        let Some(server) = servers.get_mut(&addr) else {
            return;
        };
        (server.ejected, server.fails, server.since) = (false, 0, None);
        self.lb.backends().set_enable(&backend(addr), true);
        self.report(addr, server, "fail_timeout is over");
    }

    /// An active check flipped `addr` (after `healthy` or `unhealthy` checks in a row).
    fn checked(&self, addr: SocketAddr, healthy: bool, error: Option<String>) {
        let mut servers = self.servers();
        let Some(server) = servers.get_mut(&addr) else {
            return;
        };
        server.failing_checks = !healthy;
        let why = match (healthy, error, &self.settings.check) {
            (true, _, Some(c)) => format!("passed {} health check(s)", c.healthy),
            (false, e, Some(c)) => format!(
                "failed {} health check(s) (last: {})",
                c.unhealthy,
                e.as_deref().unwrap_or("failed")
            ),
            (_, _, None) => String::from("health check"),
        };
        self.report(addr, server, &why);
    }

    /// One line and the gauge when `server` changed from up to down or back.
    fn report(&self, addr: SocketAddr, server: &mut Server, why: &str) {
        let up = !server.ejected && !server.failing_checks;
        if up == server.up {
            return;
        }
        server.up = up;
        let label = addr.to_string();
        SERVER_UP
            .with_label_values(&[&self.upstream, &label])
            .set(i64::from(up));
        match up {
            true => log::info!("upstream {}: server {label} is up: {why}", self.upstream),
            false => log::warn!("upstream {}: server {label} is down: {why}", self.upstream),
        }
    }

    /// Look the servers' names up again and follow what changed.
    async fn rediscover(&self) {
        let before = self.lb.backends().get_backend();
        if let Err(e) = self.lb.update().await {
            log::warn!("upstream {}: resolving its servers: {e}", self.upstream);
            return;
        }
        let after = self.lb.backends().get_backend();
        let inet = |set: &BTreeSet<Backend>| -> BTreeSet<SocketAddr> {
            set.iter()
                .filter_map(|b| b.addr.as_inet().copied())
                .collect()
        };
        let (before, after) = (inet(&before), inet(&after));
        if before == after {
            return;
        }
        let mut servers = self.servers();
        for gone in before.difference(&after) {
            servers.remove(gone);
            let _ = SERVER_UP.remove_label_values(&[&self.upstream, &gone.to_string()]);
        }
        for new in after.difference(&before) {
            servers.insert(*new, Server::new());
            SERVER_UP
                .with_label_values(&[&self.upstream, &new.to_string()])
                .set(1);
        }
        self.size.store(after.len(), Ordering::Relaxed);
        log::info!(
            "upstream {}: servers now {:?} (were {:?})",
            self.upstream,
            after,
            before
        );
    }

    /// The first call is true: the caller starts this pool's checks and look-ups.
    fn start(&self) -> bool {
        !self.started.swap(true, Ordering::Relaxed)
    }

    /// How often the checks run and the names are looked up, if at all.
    fn every(&self) -> (Option<Duration>, Option<Duration>) {
        let check = self.settings.check.as_ref().map(|c| c.interval);
        (check, self.settings.resolve_interval)
    }
}

/// The balancer's backend for `addr` (weight 1, as every server's).
fn backend(addr: SocketAddr) -> Backend {
    Backend {
        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
        weight: 1,
        ext: Default::default(),
    }
}

/// For [`check`] and the tests: the pool a check reports to, set once the pool exists.
type PoolCell = Arc<std::sync::OnceLock<Weak<PoolHealth>>>;

#[cfg(test)]
mod tests;
