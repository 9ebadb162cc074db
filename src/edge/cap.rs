//! The connection cap: a semaphore taken when a connection is handed to the application, which
//! for the TLS listener is before its handshake (see [`super::tls_accept`]). Beyond
//! `max_connections` a new connection is closed at once (Pingora's accept loop is not ours to
//! gate), so it holds a descriptor only for that instant.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use tokio::sync::Semaphore;

use super::first_request::{self, Silent};
use super::h2_conn::PerConn;
use super::tls_accept::TlsPort;
use super::{ConnLimits, EdgeStream};
use crate::access_log::AccessLog;
use crate::metrics::METRICS;

/// Wraps a server application (the proxy) with the connection cap and [`EdgeStream`].
pub struct EdgeApp<A> {
    inner: Arc<A>,
    limits: ConnLimits,
    permits: Arc<Semaphore>,
    tls: Option<Arc<TlsPort>>,
    silent: Silent,
    access_log: Option<Arc<AccessLog>>,
}

impl<A> EdgeApp<A> {
    /// Wrap `inner`.
    pub fn new(inner: A, limits: ConnLimits) -> Self {
        EdgeApp {
            inner: Arc::new(inner),
            limits,
            permits: Arc::new(Semaphore::new(limits.max_connections as usize)),
            tls: None,
            silent: Silent::default(),
            access_log: None,
        }
    }

    /// Log the heads Pingora refuses before any proxy hook runs to `log` (see
    /// `edge/refused.rs`): the proxy's own `logging` never sees them.
    pub fn with_access_log(mut self, log: Option<AccessLog>) -> Self {
        self.access_log = log.map(Arc::new);
        self
    }

    /// Run the TLS handshake of connections accepted on `port`'s listener (a plain one).
    pub fn with_tls(mut self, port: Option<Arc<TlsPort>>) -> Self {
        self.tls = port;
        self
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for EdgeApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let Ok(_permit) = self.permits.clone().try_acquire_owned() else {
            // Over max_connections: close now (dropping the stream), keep the descriptor free.
            METRICS.client_connections_refused.inc();
            return None;
        };
        // And within the descriptor budget (the reserve stays for the admin listener).
        let Ok(_descriptors) = super::descriptors::connection() else {
            METRICS.client_connections_refused.inc();
            return None;
        };
        METRICS.client_connections.inc();
        let _gauge = scopeguard(|| METRICS.client_connections.dec());
        // Counted from now, so a shutdown also waits for a connection still in its handshake.
        let silent = self.silent.enter();
        let stream = match &self.tls {
            Some(tls) if tls.accepted(stream.get_socket_digest()?.local_addr()) => {
                tls.handshake(stream, self.limits.client_header_timeout)
                    .await?
            }
            _ => stream,
        };
        let mut next = Some(
            if crate::proxy::bench_switch::on(crate::proxy::bench_switch::Layer::Edge) {
                Box::new(
                    EdgeStream::new(stream, self.limits)
                        .silent_until_first_byte(silent)
                        .logging_refusals_to(self.access_log.clone()),
                ) as Stream
            } else {
                drop(silent);
                stream
            },
        );
        // Run any reuse here, not in Pingora's loop, so the permit is held until the end. Each
        // connection is served with its own HTTP/2 bounds (see `h2_conn`).
        while let Some(stream) = next {
            let cap = self.limits.keepalive_requests;
            next = PerConn::serve(self.inner.clone(), stream, shutdown, cap).await;
        }
        None
    }

    /// Called once the accept loop has stopped. Pingora's cleanup drops the connections still
    /// waiting for a request, so give those accepted an instant ago their first bytes first.
    async fn cleanup(&self) {
        let window = first_request::window(self.limits.grace_period);
        let still = self.silent.settle(window).await;
        if still > 0 {
            log::info!(
                "shutdown: closing {still} connection(s) that sent nothing within {window:?}"
            );
        }
        ServerApp::cleanup(&*self.inner).await
    }
}

/// Runs `f` on drop (the connection gauge must go down however the connection ends).
fn scopeguard<F: FnMut()>(f: F) -> impl Drop {
    struct Guard<F: FnMut()>(F);
    impl<F: FnMut()> Drop for Guard<F> {
        fn drop(&mut self) {
            (self.0)()
        }
    }
    Guard(f)
}
