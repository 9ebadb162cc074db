//! The keys whose value is read from a file at validation, or is a secret: `[store]`
//! `password_file`, `partition_key_secret_file`, `ca_file`, `client_cert_file`, `client_key_file`, and `[server]`
//! `admin_token` / `admin_token_file`. Files are read once per load (so also on every reload);
//! errors name the key and the file, never a secret.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use toml::Spanned;

use super::super::raw::{RawServer, RawStore};
use super::super::secrets::{read_secret_file, EnvPath, Secret};
use super::super::{Backend, ConfigError, RedisTls};
use super::Validator;

/// Bytes `server.admin_token` must have at least (as `store.partition_key_secret_file`).
pub const MIN_ADMIN_TOKEN: usize = 16;

/// PEM of a client certificate chain and of its key, as [`RedisTls::client_pem`] holds them.
type ClientPem = (Vec<u8>, Vec<u8>);

impl Validator<'_> {
    /// `server.admin_token` or `server.admin_token_file` (not both).
    pub(super) fn admin_token(&self, raw: &RawServer) -> Result<Option<Secret>, ConfigError> {
        let (token, span, key) = match (&raw.admin_token, &raw.admin_token_file) {
            (Some(_), Some(file)) => {
                return self.err(
                    Some(file.span()),
                    "server.admin_token_file",
                    "set server.admin_token or server.admin_token_file, not both",
                )
            }
            (None, None) => return Ok(None),
            (Some(t), None) => (t.get_ref().0.clone(), t.span(), "server.admin_token"),
            (None, Some(file)) => {
                let token = self.secret_file(file, "server.admin_token_file")?;
                (token, file.span(), "server.admin_token_file")
            }
        };
        // Sent as `Authorization: Bearer <token>`: a header value, and never guessable empty.
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return self.err(
                Some(span),
                key,
                "the token must be non-empty visible ASCII without spaces",
            );
        }
        // Guessing is slowed per address (admin/throttle.rs), not stopped: many addresses
        // together still try thousands a minute, so the token itself must be out of reach.
        if token.len() < MIN_ADMIN_TOKEN {
            return self.err(
                Some(span),
                key,
                format!(
                    "the token must be at least {MIN_ADMIN_TOKEN} bytes: a short one can be \
                     guessed (e.g. `openssl rand -hex 16` makes a 32-byte one)"
                ),
            );
        }
        Ok(Some(Secret::new(token)))
    }

    /// `store.password_file`: the password of every URL of `backend` (of the master, behind
    /// Sentinel).
    pub(super) fn store_password(
        &self,
        raw: &RawStore,
        backend: &mut Backend,
    ) -> Result<(), ConfigError> {
        let Some(file) = &raw.password_file else {
            return Ok(());
        };
        let urls = backend.redis_urls_mut();
        if urls.is_empty() {
            return self.err(
                Some(file.span()),
                "store.password_file",
                "only used with a Redis backend",
            );
        }
        let password = self.secret_file(file, "store.password_file")?;
        // Behind Sentinel the password is the master's (`master_password`): the Sentinels'
        // own logins stay in their URLs.
        if let Backend::RedisSentinel { master, .. } = backend {
            master.password = Some(Secret::new(password));
            return Ok(());
        }
        for url in backend.redis_urls_mut() {
            *url = url.clone().with_password(&password);
        }
        Ok(())
    }

    /// `store.partition_key_secret_file`: at least 16 bytes, so the partition keys it hashes
    /// cannot be inverted by guessing it.
    pub(super) fn partition_key_secret(
        &self,
        raw: &RawStore,
    ) -> Result<Option<Secret>, ConfigError> {
        let Some(file) = &raw.partition_key_secret_file else {
            return Ok(None);
        };
        let key = "store.partition_key_secret_file";
        let secret = self.secret_file(file, key)?;
        if secret.len() < 16 {
            return self.err(
                Some(file.span()),
                key,
                "the secret must be at least 16 bytes",
            );
        }
        Ok(Some(Secret::new(secret)))
    }

    /// `store.ca_file` and the client certificate pair: PEM read and checked here, for
    /// `rediss://` URLs only.
    pub(super) fn store_tls(
        &self,
        raw: &RawStore,
        backend: &mut Backend,
    ) -> Result<Option<RedisTls>, ConfigError> {
        let keys = [
            ("store.ca_file", &raw.ca_file),
            ("store.client_cert_file", &raw.client_cert_file),
            ("store.client_key_file", &raw.client_key_file),
        ];
        let Some((first_key, first)) = keys.iter().find_map(|(k, v)| Some((*k, (*v).as_ref()?)))
        else {
            return Ok(None);
        };
        if matches!(backend, Backend::RedisSentinel { .. }) {
            return self.err(
                Some(first.span()),
                first_key,
                "TLS to Sentinels and a Sentinel-managed master is not supported yet",
            );
        }
        let urls = backend.redis_urls_mut();
        if urls.is_empty() {
            return self.err(
                Some(first.span()),
                first_key,
                "only used with a Redis backend",
            );
        }
        if let Some(url) = urls.iter().find(|u| !u.is_tls()) {
            let message = format!(
                "TLS settings need rediss:// URLs, but {} is plain redis://",
                url.shown()
            );
            return self.err(Some(first.span()), first_key, message);
        }
        let mut files = Vec::new();
        let ca_pem = match &raw.ca_file {
            Some(f) => Some(self.pem_certs(f, "store.ca_file", &mut files)?),
            None => None,
        };
        let client_pem = self.client_pem(raw, &mut files)?;
        Ok(Some(RedisTls {
            files,
            ca_pem,
            client_pem,
        }))
    }

    /// `store.client_cert_file` and `store.client_key_file`: both or neither, each PEM.
    fn client_pem(
        &self,
        raw: &RawStore,
        files: &mut Vec<std::path::PathBuf>,
    ) -> Result<Option<ClientPem>, ConfigError> {
        Ok(match (&raw.client_cert_file, &raw.client_key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let cert = self.pem_certs(cert, "store.client_cert_file", files)?;
                Some((cert, self.pem_key(key, "store.client_key_file", files)?))
            }
            (Some(v), None) => {
                return self.err(
                    Some(v.span()),
                    "store.client_key_file",
                    "required with store.client_cert_file",
                )
            }
            (None, Some(v)) => {
                return self.err(
                    Some(v.span()),
                    "store.client_cert_file",
                    "required with store.client_key_file",
                )
            }
        })
    }

    /// A file's bytes, or an error naming the key and the file.
    fn file_bytes(&self, file: &Spanned<EnvPath>, key: &str) -> Result<Vec<u8>, ConfigError> {
        let path: &Path = &file.get_ref().0;
        crate::config::file::read_bounded(path, crate::config::file::MAX_PEM).or_else(|e| {
            self.err(
                Some(file.span()),
                key,
                format!("cannot read {}: {e}", path.display()),
            )
        })
    }

    /// A secret file's text (see [`read_secret_file`]).
    fn secret_file(&self, file: &Spanned<EnvPath>, key: &str) -> Result<String, ConfigError> {
        read_secret_file(&file.get_ref().0).or_else(|e| self.err(Some(file.span()), key, e))
    }

    /// A PEM file of one or more certificates.
    fn pem_certs(
        &self,
        file: &Spanned<EnvPath>,
        key: &str,
        files: &mut Vec<std::path::PathBuf>,
    ) -> Result<Vec<u8>, ConfigError> {
        self.pem(
            file,
            key,
            files,
            |pem| match CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>() {
                Ok(certs) if !certs.is_empty() => Ok(()),
                Ok(_) => Err("no PEM certificate in it".to_owned()),
                Err(e) => Err(format!("bad PEM: {e}")),
            },
        )
    }

    /// A PEM file holding a private key (PKCS#8, PKCS#1 or SEC1).
    fn pem_key(
        &self,
        file: &Spanned<EnvPath>,
        key: &str,
        files: &mut Vec<std::path::PathBuf>,
    ) -> Result<Vec<u8>, ConfigError> {
        self.pem(file, key, files, |pem| {
            PrivateKeyDer::from_pem_slice(pem)
                .map(drop)
                .map_err(|e| format!("no PEM private key: {e}"))
        })
    }

    /// A PEM file that passes `check` (whose error is prefixed with the path), remembered in
    /// `files` (where the store's TLS material was read from).
    fn pem(
        &self,
        file: &Spanned<EnvPath>,
        key: &str,
        files: &mut Vec<std::path::PathBuf>,
        check: impl FnOnce(&[u8]) -> Result<(), String>,
    ) -> Result<Vec<u8>, ConfigError> {
        let pem = self.file_bytes(file, key)?;
        if let Err(e) = check(&pem) {
            let path = file.get_ref().0.display();
            return self.err(Some(file.span()), key, format!("{path}: {e}"));
        }
        files.push(file.get_ref().0.clone());
        Ok(pem)
    }
}
