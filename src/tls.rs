//! TLS on both sides of the proxy, with Pingora's `rustls` backend.
//!
//! Listener: the certificate is served by a [`CertResolver`] (rustls's `ResolvesServerCert`,
//! which Pingora's `TlsSettings::set_cert_resolver` installs) instead of a fixed file pair, so a
//! reload can swap in a new certificate without a restart. Every handshake asks the resolver, so
//! a swap applies to the next handshake; connections already open keep theirs.
//!
//! Upstreams: [`UpstreamTransport`] turns an `[upstreams.*]` table into Pingora peers (TLS,
//! SNI, verification, trusted roots, ALPN).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::listeners::tls::TlsSettings;
use pingora::protocols::tls::CaType;
use pingora::protocols::ALPN;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, WrappedX509};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::{TlsListenerSettings, UpstreamSpec};

/// A certificate or key file that cannot be used: which config key, which file, why.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {}: {message}", path.display())]
pub struct TlsFileError {
    /// The config key naming the file, e.g. `server.tls_cert`.
    pub key: String,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

fn file_error(key: impl Into<String>, path: &Path, message: impl fmt::Display) -> TlsFileError {
    TlsFileError {
        key: key.into(),
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Every certificate of a PEM file, in file order; an unreadable file or one without any
/// `CERTIFICATE` block is an error.
fn read_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(key, path, format!("cannot read: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(key, path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "no CERTIFICATE block found"));
    }
    Ok(certs)
}

/// Load and check the listener's certificate chain and key: both readable, the key usable by
/// rustls and matching the leaf certificate.
pub fn load_certified_key(tls: &TlsListenerSettings) -> Result<CertifiedKey, TlsFileError> {
    let certs = read_certs("server.tls_cert", &tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PRIVATE KEY block found".into(),
            rustls::pki_types::pem::Error::Io(e) => format!("cannot read: {e}"),
            other => format!("not valid PEM: {other}"),
        };
        file_error("server.tls_key", &tls.key, why)
    })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(certs, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => file_error(
            "server.tls_key",
            &tls.key,
            format!("does not match the certificate in {}", tls.cert.display()),
        ),
        rustls::Error::InvalidCertificate(_) | rustls::Error::InvalidCertRevocationList(_) => {
            file_error(
                "server.tls_cert",
                &tls.cert,
                format!("unusable certificate: {e}"),
            )
        }
        other => file_error("server.tls_key", &tls.key, format!("unusable key: {other}")),
    })
}

/// The listener's certificate, swappable at run time.
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CertResolver")
    }
}

impl CertResolver {
    /// A resolver serving the certificate of `tls` (read and checked now).
    pub fn load(tls: &TlsListenerSettings) -> Result<Arc<CertResolver>, TlsFileError> {
        Ok(Arc::new(CertResolver {
            current: ArcSwap::from_pointee(load_certified_key(tls)?),
        }))
    }

    /// Serve `key` from the next handshake on.
    pub fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Pingora listener settings serving `resolver`'s certificate, offering HTTP/2 and HTTP/1.1 by
/// ALPN (h2 preferred).
pub fn listener_settings(resolver: Arc<CertResolver>) -> anyhow::Result<TlsSettings> {
    // The paths are unused: with a resolver set, Pingora's build() never reads them.
    let mut settings = TlsSettings::intermediate("", "")
        .map_err(|e| anyhow::anyhow!("cannot set up the TLS listener: {e}"))?;
    settings.set_cert_resolver(resolver);
    settings.enable_h2();
    Ok(settings)
}

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
