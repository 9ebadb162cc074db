//! TLS handshakes inside the connection cap and under `client_header_timeout`.
//!
//! Pingora's TLS listener runs the handshake (60 s timeout) before the application sees the
//! connection, so silent TCP connects to the TLS port held descriptors outside
//! `max_connections` for a minute each, and every one logged an ERROR. The TLS port is
//! therefore a plain listener here, and [`EdgeApp`](super::EdgeApp) runs the handshake itself
//! once the connection holds a permit, bounded by `client_header_timeout` as in nginx (whose
//! header timeout covers the handshake).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;

/// The TLS listener's address and the acceptor for its handshakes.
pub struct TlsPort {
    listen: SocketAddr,
    /// Swapped whole on reload: certificates, SNI names and versions change together.
    acceptor: ArcSwap<Acceptor>,
}

impl TlsPort {
    /// Handshakes for connections accepted on `listen`, with `config` (see
    /// [`crate::tls::load_listener`]).
    pub fn new(listen: SocketAddr, config: Arc<rustls::ServerConfig>) -> Arc<Self> {
        Arc::new(TlsPort {
            listen,
            acceptor: ArcSwap::from_pointee(Acceptor::from_server_config(config)),
        })
    }

    /// Handshakes from the next one on use `config`; those under way finish with the old one.
    pub fn replace(&self, config: Arc<rustls::ServerConfig>) {
        self.acceptor
            .store(Arc::new(Acceptor::from_server_config(config)));
    }

    /// Was a connection with this local address accepted on the TLS listener?
    pub fn accepted(&self, local: Option<&PeerAddr>) -> bool {
        match local.and_then(PeerAddr::as_inet) {
            Some(local) => is_listen_addr(self.listen, *local),
            None => false,
        }
    }

    /// Run the handshake within `deadline`; `None` (closing the connection) on failure.
    pub async fn handshake(&self, stream: Stream, deadline: Duration) -> Option<Stream> {
        // The listener is a plain TCP one, so its streams are Pingora's L4 stream.
        let Ok(l4) = stream.into_any().downcast::<L4Stream>() else {
            log::error!("a TLS-port connection is not a TCP stream; closed");
            return None;
        };
        let failures = &crate::metrics::METRICS.tls_handshake_failures;
        let acceptor = self.acceptor.load_full();
        match tokio::time::timeout(deadline, acceptor.tls_handshake(*l4)).await {
            Ok(Ok(tls)) => Some(Box::new(tls)),
            Ok(Err(e)) => {
                // A client's failed handshake is the client's business, not an error of ours:
                // counted, and logged at debug level (a scanner makes one per connection).
                failures.with_label_values(&["error"]).inc();
                log::debug!("TLS handshake failed: {e}");
                None
            }
            Err(_) => {
                failures.with_label_values(&["timeout"]).inc();
                crate::metrics::METRICS.client_idle_closed.inc();
                None
            }
        }
    }
}

/// Pure: does a connection's local address belong to a listener bound to `listen` (which may
/// be a wildcard address)? IPv4-mapped local addresses count as their IPv4 address.
fn is_listen_addr(listen: SocketAddr, local: SocketAddr) -> bool {
    let canonical = |ip: std::net::IpAddr| ip.to_canonical();
    listen.port() == local.port()
        && (listen.ip().is_unspecified() || canonical(listen.ip()) == canonical(local.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_port_and_a_bound_address_must_match() {
        assert!(is_listen_addr(a("127.0.0.1:8443"), a("127.0.0.1:8443")));
        assert!(!is_listen_addr(a("127.0.0.1:8443"), a("127.0.0.1:8080")));
        assert!(!is_listen_addr(a("127.0.0.1:8443"), a("127.0.0.2:8443")));
    }

    #[test]
    fn a_wildcard_listener_owns_its_port_on_every_address() {
        assert!(is_listen_addr(a("0.0.0.0:8443"), a("10.1.2.3:8443")));
        assert!(is_listen_addr(a("[::]:8443"), a("[::ffff:10.1.2.3]:8443")));
        assert!(!is_listen_addr(a("[::]:8443"), a("10.1.2.3:8080")));
    }

    #[test]
    fn an_ipv4_mapped_local_address_matches_its_ipv4_listener() {
        assert!(is_listen_addr(
            a("127.0.0.1:8443"),
            a("[::ffff:127.0.0.1]:8443")
        ));
    }
}
