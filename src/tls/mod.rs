//! TLS on both sides of the proxy, with Pingora's `rustls` backend.
//!
//! | file | owns |
//! |---|---|
//! | [`listener`] | the client-facing listener: certificates chosen by SNI, the minimum version, loaded whole on every reload |
//! | [`sni`] | pure: which certificate a client's SNI selects |
//! | `upstream` | [`UpstreamTransport`]: TLS, SNI, verification, roots and ALPN towards upstreams |

use std::fmt;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

pub mod listener;
pub mod sni;
mod upstream;

pub use listener::{load_listener, CertResolver};
pub use upstream::UpstreamTransport;

/// A certificate or key file that cannot be used: which config key, which file, why.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {}: {message}", path.display())]
pub struct TlsFileError {
    /// The config key naming the file, e.g. `server.tls_cert`.
    pub key: String,
    /// The line of that key, when known.
    pub line: Option<usize>,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl TlsFileError {
    /// The same error as the config error it is: `file:line: `key`: path: message`.
    pub fn in_config(&self, file: &Path) -> crate::config::ConfigError {
        crate::config::ConfigError::Invalid {
            file: file.to_path_buf(),
            line: self.line,
            key: self.key.clone(),
            message: format!("{}: {}", self.path.display(), self.message),
        }
    }
}

fn file_error(key: impl Into<String>, path: &Path, message: impl fmt::Display) -> TlsFileError {
    TlsFileError {
        key: key.into(),
        line: None,
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Every certificate of a PEM file, in file order; an unreadable file or one without any
/// `CERTIFICATE` block is an error.
fn read_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = crate::config::file::read_bounded(path, crate::config::file::MAX_PEM)
        .map_err(|e| file_error(key, path, format!("cannot read: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.map(CertificateDer::into_owned))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(key, path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "no CERTIFICATE block found"));
    }
    Ok(certs)
}
