//! The TLS listener: `server.tls_listen` with its default certificate and minimum version, and
//! the `[[tls.certs]]` chosen by SNI. Files are read when the listener is built
//! ([`crate::tls`]), not here; their key and line are kept so that a file that cannot be used
//! is reported like any other config error.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use toml::Spanned;

use super::super::raw::{RawServer, RawTls, RawTlsCert};
use super::super::{CertFiles, ConfigError, ConfigFile, HostMatch, SniCert, TlsListenerSettings};
use super::{line_of, sections::collide, Validator};

impl Validator<'_> {
    /// `server.tls_listen` and its certificate: all three keys or none; `tls_min_version` and
    /// `[[tls.certs]]` only with them.
    pub(super) fn tls_listener(
        &self,
        raw: &RawServer,
        tls: Option<RawTls>,
        listen: SocketAddr,
        admin: SocketAddr,
    ) -> Result<Option<TlsListenerSettings>, ConfigError> {
        let certs = tls.map(|t| t.certs).unwrap_or_default();
        let Some(tls_listen) = &raw.tls_listen else {
            let stray = [
                ("server.tls_cert", raw.tls_cert.as_ref().map(Spanned::span)),
                ("server.tls_key", raw.tls_key.as_ref().map(Spanned::span)),
                (
                    "server.tls_min_version",
                    raw.tls_min_version.as_ref().map(Spanned::span),
                ),
                ("tls.certs[0].cert", certs.first().map(|c| c.cert.span())),
            ];
            if let Some((key, span)) = stray.into_iter().find(|(_, s)| s.is_some()) {
                return self.err(span, key, "only used with server.tls_listen");
            }
            return Ok(None);
        };
        let addr = *tls_listen.get_ref();
        for (other, name) in [(listen, "server.listen"), (admin, "server.admin_listen")] {
            if collide(addr, other) {
                return self.err(
                    Some(tls_listen.span()),
                    "server.tls_listen",
                    format!("{addr} overlaps {name} {other}: use a different port"),
                );
            }
        }
        let required = |field: &Option<Spanned<PathBuf>>, key: &str| match field {
            Some(p) => self.config_file(p, key.to_string()),
            None => self.err(
                Some(tls_listen.span()),
                key,
                "required with server.tls_listen (the default certificate)",
            ),
        };
        Ok(Some(TlsListenerSettings {
            listen: addr,
            min_version: raw
                .tls_min_version
                .as_ref()
                .map(|v| *v.get_ref())
                .unwrap_or_default(),
            default_cert: CertFiles {
                cert: required(&raw.tls_cert, "server.tls_cert")?,
                key: required(&raw.tls_key, "server.tls_key")?,
            },
            certs: self.sni_certs(certs)?,
        }))
    }

    /// A non-empty path, with its key and line.
    fn config_file(&self, p: &Spanned<PathBuf>, key: String) -> Result<ConfigFile, ConfigError> {
        if p.get_ref().as_os_str().is_empty() {
            return self.err(Some(p.span()), key, "must name a PEM file");
        }
        Ok(ConfigFile {
            path: p.get_ref().clone(),
            key,
            line: Some(line_of(self.text, p.span().start)),
        })
    }

    /// `[[tls.certs]]`: each entry's files, and its `names` (host names or `*.domain`, none
    /// listed by two entries).
    fn sni_certs(&self, raw: Vec<RawTlsCert>) -> Result<Vec<SniCert>, ConfigError> {
        let mut listed = HashSet::new();
        let mut out = Vec::with_capacity(raw.len());
        for (i, c) in raw.into_iter().enumerate() {
            let at = |k: &str| format!("tls.certs[{i}].{k}");
            let names = match &c.names {
                None => None,
                Some(names) if names.get_ref().is_empty() => {
                    return self.err(
                        Some(names.span()),
                        at("names"),
                        "lists no name: leave it out to serve the certificate's own names",
                    )
                }
                Some(names) => {
                    let mut parsed = Vec::with_capacity(names.get_ref().len());
                    for (j, n) in names.get_ref().iter().enumerate() {
                        let key = format!("tls.certs[{i}].names[{j}]");
                        let Some(m) = HostMatch::parse(n.get_ref()) else {
                            return self.err(
                                Some(n.span()),
                                key,
                                format!(
                                    "{:?} is not a host name or \"*.domain\" (SNI carries no \
                                     IP address or port)",
                                    n.get_ref()
                                ),
                            );
                        };
                        if !listed.insert(m.clone()) {
                            return self.err(
                                Some(n.span()),
                                key,
                                format!("{:?} is listed by two entries", n.get_ref()),
                            );
                        }
                        parsed.push(m);
                    }
                    Some(parsed)
                }
            };
            out.push(SniCert {
                files: CertFiles {
                    cert: self.config_file(&c.cert, at("cert"))?,
                    key: self.config_file(&c.key, at("key"))?,
                },
                names,
            });
        }
        Ok(out)
    }
}
