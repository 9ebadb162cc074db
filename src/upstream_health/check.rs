//! The active check of a pool: Pingora's `HttpHealthCheck` (with `path`) or `TcpHealthCheck`
//! (without), inside a [`Checker`] that bounds each check by `timeout`, keeps the last error
//! and tells the pool when a server flips.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck, TcpHealthCheck};
use pingora::lb::Backend;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType};

use super::PoolCell;
use crate::config::ActiveCheck;

/// The active check `check` asks for, reporting to the pool `pool` will hold. `template` is a
/// peer of the upstream's transport (TLS, SNI, ALPN), its address replaced by each server's.
pub fn build_check(
    check: &ActiveCheck,
    host: &str,
    mut template: HttpPeer,
    pool: PoolCell,
) -> Box<dyn HealthCheck + Send + Sync> {
    let t = check.timeout;
    let inner: Box<dyn HealthCheck + Send + Sync> = match &check.path {
        None => {
            let mut tcp = TcpHealthCheck::new();
            tcp.peer_template.options.connection_timeout = Some(t);
            tcp
        }
        Some(path) => {
            template.options.connection_timeout = Some(t);
            template.options.total_connection_timeout = Some(t);
            template.options.read_timeout = Some(t);
            template.options.write_timeout = Some(t);
            let mut http = HttpHealthCheck::new(host, false);
            http.peer_template = template;
            let mut req = RequestHeader::build("GET", path.as_bytes(), None)
                .expect("a validated origin-form path");
            let _ = req.insert_header("Host", host);
            let _ = req.insert_header("User-Agent", "slidegate-health-check");
            http.req = req;
            // Any 2xx or 3xx passes, as nginx's `health_check` (Envoy asks for 200).
            http.validator = Some(Box::new(|resp| match resp.status.as_u16() {
                200..=399 => Ok(()),
                code => Error::e_explain(
                    ErrorType::CustomCode("status", code),
                    format!("answered {code}"),
                ),
            }));
            Box::new(http)
        }
    };
    Box::new(Checker {
        inner,
        timeout: t,
        healthy: check.healthy as usize,
        unhealthy: check.unhealthy as usize,
        errors: Mutex::new(HashMap::new()),
        pool,
    })
}

/// Pingora's check, bounded, remembering why each server last failed.
struct Checker {
    inner: Box<dyn HealthCheck + Send + Sync>,
    timeout: Duration,
    healthy: usize,
    unhealthy: usize,
    errors: Mutex<HashMap<SocketAddr, String>>,
    pool: PoolCell,
}

#[async_trait]
impl HealthCheck for Checker {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let checked = tokio::time::timeout(self.timeout, self.inner.check(target)).await;
        let result = checked.unwrap_or_else(|_| {
            Error::e_explain(ErrorType::ConnectTimedout, "no answer within the timeout")
        });
        if let (Err(e), Some(addr)) = (&result, target.addr.as_inet()) {
            let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
            errors.insert(*addr, e.to_string());
        }
        result
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        let (Some(pool), Some(addr)) = (
            self.pool.get().and_then(std::sync::Weak::upgrade),
            target.addr.as_inet(),
        ) else {
            return;
        };
        let error = match healthy {
            true => None,
            false => {
                let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
                errors.get(addr).cloned()
            }
        };
        pool.checked(*addr, healthy, error);
    }

    fn health_threshold(&self, success: bool) -> usize {
        match success {
            true => self.healthy,
            false => self.unhealthy,
        }
    }
}
