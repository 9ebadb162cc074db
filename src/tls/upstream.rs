//! Upstream TLS: [`UpstreamTransport`] turns an `[upstreams.*]` table into Pingora peers (TLS,
//! SNI, verification, trusted roots, ALPN).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use pingora::protocols::tls::CaType;
use pingora::protocols::ALPN;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, WrappedX509};

use super::{file_error, read_certs, TlsFileError};
use crate::config::UpstreamSpec;

/// How to reach the servers of one upstream: plain or TLS, HTTP/1.1 or HTTP/2.
pub struct UpstreamTransport {
    tls: Option<PeerTls>,
    alpn: ALPN,
}

struct PeerTls {
    /// `sni` from the config, or each server's host (by resolved address).
    sni: Result<String, Vec<(SocketAddr, String)>>,
    verify: bool,
    ca: Option<Arc<CaType>>,
}

impl UpstreamTransport {
    /// The transport of `spec`, whose servers resolved to `resolved` (address, configured
    /// host). Reads `ca_file` (the one file an upstream names).
    pub fn new(
        spec: &UpstreamSpec,
        resolved: Vec<(SocketAddr, String)>,
    ) -> Result<UpstreamTransport, TlsFileError> {
        // h2 only when asked for: over TLS by ALPN, in the clear by prior knowledge (gRPC).
        let alpn = if spec.h2 { ALPN::H2 } else { ALPN::H1 };
        let Some(tls) = &spec.tls else {
            return Ok(UpstreamTransport { tls: None, alpn });
        };
        if !tls.verify {
            log::warn!(
                "upstream {}: TLS certificate verification is off (verify = false): \
                 anyone on the path can impersonate it",
                spec.name
            );
        }
        let ca = match &tls.ca_file {
            None => None,
            Some(path) => Some(load_ca(&format!("upstreams.{}.ca_file", spec.name), path)?),
        };
        Ok(UpstreamTransport {
            tls: Some(PeerTls {
                sni: tls.sni.clone().ok_or(resolved),
                verify: tls.verify,
                ca,
            }),
            alpn,
        })
    }

    /// A peer for one resolved server of this upstream.
    pub fn peer(&self, addr: SocketAddr) -> HttpPeer {
        let mut peer = match &self.tls {
            None => HttpPeer::new(addr, false, String::new()),
            Some(tls) => {
                let sni = match &tls.sni {
                    Ok(sni) => sni.clone(),
                    Err(hosts) => hosts
                        .iter()
                        .find(|(a, _)| *a == addr)
                        .map(|(_, h)| h.clone())
                        .unwrap_or_else(|| addr.ip().to_string()),
                };
                let mut peer = HttpPeer::new(addr, true, sni);
                peer.options.verify_cert = tls.verify;
                peer.options.verify_hostname = tls.verify;
                peer.options.ca = tls.ca.clone();
                peer
            }
        };
        peer.options.alpn = self.alpn.clone();
        peer
    }
}

/// Trusted roots from a PEM file, each checked by webpki first (Pingora's own parser panics
/// on a malformed certificate).
fn load_ca(key: &str, path: &Path) -> Result<Arc<CaType>, TlsFileError> {
    let certs = read_certs(key, path)?;
    let mut check = rustls::RootCertStore::empty();
    let mut out = Vec::with_capacity(certs.len());
    for (i, der) in certs.into_iter().enumerate() {
        check
            .add(der.clone())
            .map_err(|e| file_error(key, path, format!("certificate #{}: {e}", i + 1)))?;
        out.push(WrappedX509::new(der.to_vec(), parse_x509));
    }
    Ok(Arc::from(out.into_boxed_slice()))
}
