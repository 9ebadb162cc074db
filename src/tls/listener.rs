//! The client-facing TLS listener, loaded whole: the default certificate, the `[[tls.certs]]`
//! chosen by SNI and the protocol versions, in one rustls `ServerConfig`.
//!
//! Pingora 0.9's `TlsSettings::build` fixes the versions to TLS 1.2 and 1.3, so the config is
//! built here and handed to Pingora's `Acceptor::from_server_config`. A reload builds a new
//! one from the files and swaps it in at once ([`crate::edge::TlsPort::replace`]): the next
//! handshake gets every new certificate, name and the new minimum version together, while
//! connections already open keep theirs.

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use super::sni::{EntryNames, SniTable};
use super::{file_error, read_certs, TlsFileError};
use crate::config::{CertFiles, ConfigFile, HostMatch, TlsListenerSettings, TlsVersion};

/// ALPN offered to clients: HTTP/2 preferred, HTTP/1.1 allowed (Pingora's `ALPN::H2H1`).
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// `err` with the line of the key it names.
fn at(file: &ConfigFile, message: impl fmt::Display) -> TlsFileError {
    TlsFileError {
        line: file.line,
        ..file_error(file.key.clone(), &file.path, message)
    }
}

/// Load and check one certificate chain and key: both readable, the key usable by rustls and
/// matching the leaf certificate.
pub fn load_certified_key(files: &CertFiles) -> Result<CertifiedKey, TlsFileError> {
    let (cert, key) = (&files.cert, &files.key);
    let certs = read_certs(&cert.key, &cert.path).map_err(|e| TlsFileError {
        line: cert.line,
        ..e
    })?;
    let pem = crate::config::file::read_bounded(&key.path, crate::config::file::MAX_PEM)
        .map_err(|e| at(key, format!("cannot read: {e}")))?;
    let der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PRIVATE KEY block found".into(),
            rustls::pki_types::pem::Error::Io(e) => format!("cannot read: {e}"),
            other => format!("not valid PEM: {other}"),
        };
        at(key, why)
    })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(certs, der, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => at(
            key,
            format!("does not match the certificate in {}", cert.path.display()),
        ),
        rustls::Error::InvalidCertificate(_) | rustls::Error::InvalidCertRevocationList(_) => {
            at(cert, format!("unusable certificate: {e}"))
        }
        other => at(key, format!("unusable key: {other}")),
    })
}

/// The DNS names (exact or `*.domain`) of a leaf certificate's subjectAltName.
fn san_names(file: &ConfigFile, leaf: &CertificateDer<'_>) -> Result<Vec<HostMatch>, TlsFileError> {
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| at(file, format!("unusable certificate: {e}")))?;
    Ok(cert
        .valid_dns_names()
        .filter_map(HostMatch::parse)
        .collect())
}

/// The listener's certificates and the names that select them; immutable (a reload builds
/// a new one).
pub struct CertResolver {
    default: Arc<CertifiedKey>,
    certs: Vec<Arc<CertifiedKey>>,
    table: SniTable,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CertResolver({} by SNI)", self.certs.len())
    }
}

impl CertResolver {
    /// Read and check the default certificate and every `[[tls.certs]]` entry of `tls`.
    pub fn load(tls: &TlsListenerSettings) -> Result<CertResolver, TlsFileError> {
        let default = Arc::new(load_certified_key(&tls.default_cert)?);
        let mut certs = Vec::with_capacity(tls.certs.len());
        let mut names = Vec::with_capacity(tls.certs.len());
        for entry in &tls.certs {
            let key = load_certified_key(&entry.files)?;
            let from_cert = match &entry.names {
                Some(_) => Vec::new(),
                None => {
                    let file = &entry.files.cert;
                    let found = san_names(file, key.end_entity_cert().map_err(|e| at(file, e))?)?;
                    if found.is_empty() {
                        return Err(at(
                            file,
                            "the certificate has no DNS name in its subjectAltName: list the \
                             names it serves in `names`",
                        ));
                    }
                    found
                }
            };
            names.push(EntryNames {
                listed: entry.names.clone(),
                from_cert,
            });
            certs.push(Arc::new(key));
        }
        let table = SniTable::build(&names);
        for (i, entry) in tls.certs.iter().enumerate() {
            if !table.serves(i) {
                log::warn!(
                    "{}: every name of {} is served by an earlier entry; it is never selected",
                    entry.files.cert.key,
                    entry.files.cert.path.display()
                );
            }
        }
        Ok(CertResolver {
            default,
            certs,
            table,
        })
    }

    /// The certificate for a client's SNI: the entry it selects, else the default.
    pub fn select(&self, sni: Option<&str>) -> &Arc<CertifiedKey> {
        match self.table.select(sni) {
            Some(i) => &self.certs[i],
            None => &self.default,
        }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.select(hello.server_name()).clone())
    }
}

/// The protocol versions from `min` up.
fn versions(min: TlsVersion) -> &'static [&'static rustls::SupportedProtocolVersion] {
    static FROM_12: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS12, &rustls::version::TLS13];
    static FROM_13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
    match min {
        TlsVersion::Tls12 => &FROM_12,
        TlsVersion::Tls13 => &FROM_13,
    }
}

/// The rustls config of the TLS listener: its certificates (read and checked now), the
/// versions from `tls.min_version` up, h2 and http/1.1 by ALPN.
pub fn load_listener(tls: &TlsListenerSettings) -> Result<Arc<ServerConfig>, TlsFileError> {
    let resolver = Arc::new(CertResolver::load(tls)?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions(tls.min_version))
        .map_err(|e| TlsFileError {
            key: "server.tls_min_version".into(),
            line: None,
            path: Default::default(),
            message: format!("not supported: {e}"),
        })?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
