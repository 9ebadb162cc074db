//! The TLS part of the model: the listener with its certificates (chosen by SNI), and an
//! upstream's TLS settings. Files are named with the key and line that named them, so an
//! error found when they are read (after validation) still points into the config.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::HostMatch;

/// The TLS listener: `server.tls_listen`, `server.tls_min_version`, the default certificate
/// (`server.tls_cert`/`tls_key`) and the `[[tls.certs]]` chosen by SNI. The address needs a
/// restart to change; everything else is loaded again on every reload and swapped in at once
/// ([`crate::edge::TlsPort::replace`]), so it is left out of the restart-only diff.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TlsListenerSettings {
    /// Listening address.
    pub listen: SocketAddr,
    /// The oldest protocol version a client may use.
    #[serde(skip)]
    pub min_version: TlsVersion,
    /// What a client without SNI, or with a name no entry claims, gets.
    #[serde(skip)]
    pub default_cert: CertFiles,
    /// `[[tls.certs]]`, in file order.
    #[serde(skip)]
    pub certs: Vec<SniCert>,
}

/// `server.tls_min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3 (the default, as nginx's and Mozilla's "intermediate").
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

impl TlsVersion {
    /// As written in the config: `"1.2"` or `"1.3"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "1.2",
            TlsVersion::Tls13 => "1.3",
        }
    }
}

/// A file the config names, with the key and line that named it (for errors found when the
/// file is read, after validation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    /// The path, as configured.
    pub path: PathBuf,
    /// The key naming it, e.g. `tls.certs[1].key`.
    pub key: String,
    /// 1-based line of that key, when known.
    pub line: Option<usize>,
}

/// A certificate chain and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate chain, leaf first.
    pub cert: ConfigFile,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: ConfigFile,
}

/// One `[[tls.certs]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniCert {
    /// The certificate and key.
    pub files: CertFiles,
    /// `names`: the SNI names it is served for; `None`: the DNS names of the certificate's
    /// subjectAltName, read when it is loaded.
    pub names: Option<Vec<HostMatch>>,
}

/// `[upstreams.<name>]` TLS settings (`tls = true`).
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTls {
    /// SNI and the name the certificate is checked against; `None`: each server's host.
    pub sni: Option<String>,
    /// Verify the upstream's certificate (chain and name).
    pub verify: bool,
    /// Roots trusted for this upstream instead of the system's (PEM), read when rules are built.
    pub ca_file: Option<PathBuf>,
}
