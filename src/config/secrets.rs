//! Secrets kept out of the config file, and out of everything the config is shown in.
//!
//! - `${NAME}` in a string value is replaced by the environment variable `NAME` while the file
//!   is parsed ([`EnvText`]); `$${` writes a literal `${`. A variable that is not set is a
//!   config error naming its line and key. It applies to the values that carry a secret or an
//!   address: `store.url`, `store.urls`, `upstreams.*.servers`, `server.admin_token` and every
//!   `*_file` path of `[store]` and `[server]` (`password_file`, `ca_file`,
//!   `client_cert_file`, `client_key_file`, `admin_token_file`).
//! - `password_file` / `admin_token_file` are read by the validator ([`read_secret_file`]).
//! - What is printed or serialized never holds a secret: [`redacted_url`] writes a Redis
//!   address with `***` for its password, and [`fingerprint`] stands in for a secret where a
//!   change must still be noticed (the restart-only diff) without its value being kept.

use std::hash::{BuildHasher, Hash};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// A string value with `${NAME}` replaced from the environment, once, while parsing: the rest
/// of the pipeline only sees the plain value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EnvText(pub String);

impl<'de> Deserialize<'de> for EnvText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        substitute(&text, |name| std::env::var(name).ok())
            .map(EnvText)
            .map_err(serde::de::Error::custom)
    }
}

/// The substituted value (`-T` redacts the secret ones by key: `crate::config::effective`).
impl Serialize for EnvText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Written back so that parsing it again gives this value: a literal `${` is `$${`.
        s.serialize_str(&self.0.replace("${", "$${"))
    }
}

/// A path value, substituted like [`EnvText`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EnvPath(pub PathBuf);

impl<'de> Deserialize<'de> for EnvPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        EnvText::deserialize(d).map(|t| EnvPath(PathBuf::from(t.0)))
    }
}

/// Like [`EnvText`].
impl Serialize for EnvPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EnvText(self.0.to_string_lossy().into_owned()).serialize(s)
    }
}

/// Replace every `${NAME}` in `text` with `lookup(NAME)`; `$${` is a literal `${`, and a `$`
/// before anything else is kept as is. Pure, so the rules are unit-tested without touching the
/// process environment.
pub(super) fn substitute(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let end = tail
                .find('}')
                .ok_or("unterminated \"${\" (write \"$${\" for a literal \"${\")")?;
            let name = &tail[..end];
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "\"${{{name}}}\": a variable name is letters, digits and '_', not starting \
                     with a digit (write \"$${{\" for a literal \"${{\")"
                ));
            }
            let value =
                lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A secret read from a file: its content without one trailing newline (`\n` or `\r\n`), as
/// `echo secret > file` and most secret stores write it. Errors say what is wrong, never the
/// content.
pub(super) fn read_secret_file(path: &Path) -> Result<String, String> {
    let bytes = super::file::read_bounded(path, super::file::MAX_SECRET)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(text)
}

/// A secret value of the model (`server.admin_token`): its `Debug` is `***`, and it has no
/// `Display` or `Serialize`, so it reaches a log or a dump only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The value, for the one place that compares it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// One keyed hasher per process: fingerprints compare within the process (a reload's diff)
/// but are no unkeyed hash of a short secret that could be brute-forced from a dump.
static KEY: LazyLock<std::collections::hash_map::RandomState> = LazyLock::new(Default::default);

/// A stand-in for a secret: equal for equal secrets within this process, and nothing else.
pub fn fingerprint(secret: &impl Hash) -> u64 {
    KEY.hash_one(secret)
}

/// `info` as a URL without its password: `rediss://user:***@host:port/db`.
pub fn redacted_url(info: &redis::ConnectionInfo) -> String {
    use redis::ConnectionAddr;
    let settings = info.redis_settings();
    let user = settings.username().unwrap_or("");
    let auth = match (user, settings.password().is_some()) {
        ("", false) => String::new(),
        (user, true) => format!("{user}:***@"),
        (user, false) => format!("{user}@"),
    };
    let db = settings.db();
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("redis://{auth}{host}:{port}/{db}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{auth}{host}:{port}/{db}"),
        ConnectionAddr::Unix(path) => format!("unix://{auth}{}?db={db}", path.display()),
        _ => "redis://(unprintable address)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    fn env(name: &str) -> Option<String> {
        match name {
            "PASS" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_are_replaced_and_dollars_kept() {
        for (input, want) in [
            ("redis://:${PASS}@h:6379", "redis://:s3cret@h:6379"),
            ("${PASS}${PASS}", "s3crets3cret"),
            ("a$b$", "a$b$"),
            ("$${PASS}", "${PASS}"),
            ("x${EMPTY}y", "xy"),
            ("", ""),
        ] {
            assert_eq!(substitute(input, env).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn unset_malformed_and_unterminated_variables_are_errors() {
        let err = substitute("redis://:${NOPE}@h", env).unwrap_err();
        assert!(err.contains("NOPE is not set"), "{err}");
        for bad in ["${", "${PASS", "${1X}", "${A-B}", "${}"] {
            assert!(substitute(bad, env).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_are_printed_without_their_password() {
        let info = "rediss://app:hunter2@redis.internal:6380/2"
            .into_connection_info()
            .unwrap();
        assert_eq!(
            redacted_url(&info),
            "rediss://app:***@redis.internal:6380/2"
        );
        let info = "redis://127.0.0.1:6379".into_connection_info().unwrap();
        assert_eq!(redacted_url(&info), "redis://127.0.0.1:6379/0");
    }

    #[test]
    fn secret_files_lose_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, "pw\r\n").unwrap();
        assert_eq!(read_secret_file(&path).unwrap(), "pw");
        std::fs::write(&path, "pw\n\n").unwrap();
        assert_eq!(read_secret_file(&path).unwrap(), "pw\n");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_secret_file(&path).unwrap_err().contains("empty"));
        assert!(read_secret_file(&dir.path().join("missing")).is_err());
    }
}
