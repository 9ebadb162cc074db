//! Configuration: the TOML file users write, validated into the typed model the rest of the
//! proxy runs on.
//!
//! Three steps, one file each:
//! - `raw`: the serde schema, with spans (unknown keys, bad durations, addresses, CIDRs are
//!   rejected here, with the line the TOML parser reports);
//! - `validate`: pure cross-field checks (no DNS, no sockets) that build the model;
//! - this module: the model itself, and [`Config::load`].
//!
//! The model is split by what a reload may change: [`ServerSettings`] and [`StoreSettings`] are
//! fixed for the life of the process, [`RoutingSpec`] (routes, upstreams, client address
//! resolution) is swapped in whole on reload. [`Config::restart_only_changes`] diffs the
//! former field by field, so a new process-level setting is covered without a hand-kept list.

mod answers;
mod effective;
pub mod file;
pub mod log_format;
mod raw;
mod route;
mod secrets;
mod store;
mod tls;
mod validate;
mod values;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use crate::keys::KeySpec;
pub use crate::request::additions::{ForwardedHeader, ForwardedHeaders, RequestIdMode};
pub use answers::{refused_response_header, ResponseField, ResponseHeaders};
pub use effective::REDACTED;
pub use raw::MAX_WINDOW;
pub use route::{
    Answers, Counting, DenyAnswer, DenyBody, LimitKeys, PlanLimits, PlanSource, RouteMatch,
    RoutePlans, RouteSpec, Smoothing,
};
pub use secrets::{fingerprint, redacted_url, Secret};
pub use store::{Backend, OnError, RedisTls, RedisUrl, SentinelMaster, StoreSettings};
pub use tls::{CertFiles, ConfigFile, SniCert, TlsListenerSettings, TlsVersion, UpstreamTls};
pub use values::{ActiveCheck, HostMatch, HostPort, UpstreamHealth, UpstreamTimeouts};

/// A configuration error: which file, which line (when the parser knows it), which key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read config: {source}")]
    Io {
        /// The config file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration.
    #[error("{file}:{}: `{key}`: {message}", line.map(|l| l.to_string()).unwrap_or_else(|| "?".into()))]
    Invalid {
        /// The config file.
        file: PathBuf,
        /// 1-based line number, when known.
        line: Option<usize>,
        /// Dotted key path, e.g. `routes[1].limits[0].window`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// `[server]`: listeners and Pingora process settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerSettings {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`.
    pub admin_listen: SocketAddr,
    /// Pingora worker threads for the proxy service.
    pub threads: usize,
    /// How long SIGTERM waits for in-flight requests.
    pub grace_period: Duration,
    /// How long SIGTERM keeps serving, `/readyz` at 503, before the drain starts.
    pub shutdown_delay: Duration,
    /// Pingora pid file; defaults to a path derived from the listen address so instances on one
    /// host never collide.
    pub pid_file: PathBuf,
    /// Pingora upgrade socket (zero-downtime upgrade); derived like `pid_file` by default.
    pub upgrade_sock: PathBuf,
    /// Deadline for a whole request head, from the connection's accept or the first byte after
    /// the previous response (nginx `client_header_timeout`).
    pub client_header_timeout: Duration,
    /// An idle client connection is closed after this; zero turns keep-alive off.
    pub keepalive_timeout: Duration,
    /// Deadline for a whole HTTP/1 request body, from its first read; then `408` and close.
    pub client_body_timeout: Duration,
    /// A response write that waits this long for the client to take bytes closes the
    /// connection (nginx `send_timeout`).
    pub send_timeout: Duration,
    /// Most client connections the proxy listener holds at once; beyond it new ones are
    /// closed at once, so descriptors remain for upstreams, Redis and the admin listener.
    pub max_connections: u32,
    /// Requests one client connection serves (nginx `keepalive_requests`): an HTTP/1.1 one is
    /// then closed after its response, an HTTP/2 one gets GOAWAY.
    pub keepalive_requests: u32,
    /// Bearer token the admin inspector (`/api/*` and the page) requires; `None`: open.
    #[serde(serialize_with = "redacted")]
    pub admin_token: Option<Secret>,
    /// Host names, beyond the listener's own address and loopback names, that the inspector
    /// answers to (and that may be a write's `Origin`); see [`crate::admin::guard`].
    pub admin_hosts: Vec<HostMatch>,
    /// The inspector shows the clients' keys in `/api/v1/top` (`false`: only their `pk`).
    pub admin_show_keys: bool,
    /// Counters of each route's top limited clients (see [`crate::top`]).
    pub top_clients: usize,
    /// The TLS listener (HTTP/2 and HTTP/1.1 by ALPN), if any.
    pub tls: Option<TlsListenerSettings>,
    /// Accept HTTP/2 with prior knowledge (h2c) on the plain listener.
    pub h2c: bool,
}

/// Secrets take part in the restart-only diff without their value being kept in it.
fn redacted<S: serde::Serializer>(v: &Option<Secret>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(fingerprint(v))
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum AccessTarget {
    /// No access log.
    Off,
    /// Standard output.
    Stdout,
    /// A file, appended to; reopened on SIGUSR1.
    File(PathBuf),
}

/// Access log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// nginx's `combined`, without header values (referer and user agent are `-`).
    Combined,
}

/// `[log]` (restart only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogSettings {
    /// Where access lines go.
    pub access: AccessTarget,
    /// How they are written.
    pub format: AccessFormat,
    /// `combined` written as this `log_format` instead (nginx's syntax), if set.
    pub log_format: Option<log_format::LogFormat>,
}

/// `[client_ip]`: how the client address is found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClientIpSettings {
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// `ipv4_prefix` and `ipv6_prefix`: how much of a client address keys its bucket.
    pub key_prefixes: crate::keys::KeyPrefixes,
}

/// `[upstreams.<name>]`.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSpec {
    /// The table name, referenced by routes.
    pub name: String,
    /// Servers, in file order.
    pub servers: Vec<HostPort>,
    /// Connect, read, write and pool idle timeouts.
    pub timeouts: UpstreamTimeouts,
    /// HTTPS to the servers, when set.
    pub tls: Option<UpstreamTls>,
    /// Speak HTTP/2 to the servers (ALPN `h2` over TLS, prior knowledge without).
    pub h2: bool,
    /// Active checks, passive ejection and name re-resolution.
    pub health: UpstreamHealth,
}

/// `store.max_delayed` when not configured: requests parked waiting for room at once, over
/// the whole process. A parked request holds its in-flight state (about 18 KB, most of it
/// Pingora's per-request future) plus its place; 3000 keep them under about 64 MB.
pub const DEFAULT_MAX_DELAYED: u32 = 3000;
/// The largest `store.max_delayed`.
pub const MAX_MAX_DELAYED: u32 = 1_000_000;

/// Everything a reload swaps in at once: routes, upstreams, client address resolution, and
/// what is added to requests and responses (`server.server_header`, `forwarded_headers`,
/// `request_id`: `[server]` keys, but ones a reload may change).
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingSpec {
    /// `server.server_header`: the `Server` field of every response; `None`: none is sent.
    pub server_header: Option<http::HeaderValue>,
    /// `server.forwarded_headers`.
    pub forwarded_headers: ForwardedHeaders,
    /// `server.request_id`.
    pub request_id: RequestIdMode,
    /// `[client_ip]`.
    pub client_ip: ClientIpSettings,
    /// `[upstreams.*]`, sorted by name.
    pub upstreams: Vec<UpstreamSpec>,
    /// `[[routes]]`, in file order (first match wins).
    pub routes: Vec<RouteSpec>,
}

/// A complete, validated configuration.
///
/// `server` and `store` are fixed for the life of the process: a reload that changes them logs
/// that a restart is needed and keeps the running values. `routing` is swapped in whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was loaded from (for messages and reloads).
    pub source: PathBuf,
    /// `[server]` (restart only).
    pub server: ServerSettings,
    /// `[store]` (restart only).
    pub store: StoreSettings,
    /// `[log]` (restart only).
    pub log: LogSettings,
    /// Routes, upstreams and client address resolution (reloadable).
    pub routing: RoutingSpec,
}

/// A configuration reads as its rule set: `config.routes`, `config.upstreams`.
impl std::ops::Deref for Config {
    type Target = RoutingSpec;

    fn deref(&self) -> &RoutingSpec {
        &self.routing
    }
}

impl Config {
    /// Read and validate a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = file::read_text(path, file::MAX_CONFIG).map_err(|source| ConfigError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(path, &text)
    }

    /// Validate config text; `path` is used in messages and as [`Config::source`].
    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::new(text);
        let raw: raw::RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e
                .path()
                .to_string()
                .replace(".$__serde_spanned_private_value", "");
            let inner = e.into_inner();
            ConfigError::Invalid {
                file: path.to_path_buf(),
                line: inner.span().map(|s| validate::line_of(text, s.start)),
                key: if key == "." {
                    "(top level)".into()
                } else {
                    key
                },
                message: inner.message().to_string(),
            }
        })?;
        validate::Validator { path, text }.validate(raw)
    }

    /// The restart-only keys (`server.threads`, `store.prefix`, …) whose values differ in
    /// `new`: computed from the settings' serialized form, so every field is covered without a
    /// hand-kept list.
    pub fn restart_only_changes(&self, new: &Config) -> Vec<String> {
        let mut out = changed_fields("server", &self.server, &new.server);
        out.extend(changed_fields("store", &self.store, &new.store));
        out.extend(changed_fields("log", &self.log, &new.log));
        out
    }
}

/// `section.field` for every top-level field of `old` whose serialized value differs in `new`.
fn changed_fields<T: Serialize>(section: &str, old: &T, new: &T) -> Vec<String> {
    let fields = |v: &T| match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (old, new) = (fields(old), fields(new));
    old.iter()
        .filter(|(field, value)| new.get(*field) != Some(*value))
        .map(|(field, _)| format!("{section}.{field}"))
        .collect()
}
