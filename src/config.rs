//! Configuration: the TOML schema users write, and its conversion into validated types.
//!
//! Loading is two steps. Serde deserializes the file into the `Raw*` structs below, which
//! already reject unknown keys, malformed durations, addresses and CIDRs (with the line the
//! TOML parser reports and the key path from `serde_path_to_error`). Then `Validator::validate`
//! checks what serde cannot: unique route names, upstream references, duplicate windows.
//! Every error names the file, the line when known, and the key.
//!
//! Durations are bounded at parse time (`BoundedDuration`, `Window`) so that the arithmetic
//! other modules do on them (`timeout * 4`, `window.as_micros() as u64`, window plus a
//! microsecond timestamp in Lua doubles) can never overflow or lose precision.

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use crate::limiter::Limit;

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

/// What to do with a request when the store cannot decide in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Fail open: forward the request (counted as `error_allowed`).
    Allow,
    /// Fail closed: answer 503 with `Retry-After: 1` (counted as `error_denied`).
    Deny,
}

/// Which store holds the limit state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// In-process store: exact within one process, not shared.
    Memory,
    /// One Redis server (or a primary behind a proxy).
    Redis {
        /// `redis://`, `rediss://`, with optional `user:password@` and `/db`.
        url: String,
    },
    /// A Redis Cluster, reached through one or more seed nodes.
    RedisCluster {
        /// Seed node URLs.
        urls: Vec<String>,
    },
}

/// `[server]`: listeners and Pingora process settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`.
    pub admin_listen: SocketAddr,
    /// Pingora worker threads for the proxy service.
    pub threads: usize,
    /// How long SIGTERM waits for in-flight requests.
    pub grace_period: Duration,
    /// Pingora pid file; defaults to a path derived from the listen address so instances on one
    /// host never collide.
    pub pid_file: PathBuf,
    /// Pingora upgrade socket (zero-downtime upgrade); derived like `pid_file` by default.
    pub upgrade_sock: PathBuf,
    /// Bearer token the admin inspector (`/api/*` and the page) requires; `None`: open.
    pub admin_token: Option<String>,
}

/// `[store]`: where limit state lives and how failures are handled.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    /// The backend and its address(es).
    pub backend: Backend,
    /// Key namespace in Redis.
    pub prefix: String,
    /// Hard bound on one limiter decision, end to end.
    pub timeout: Duration,
    /// Default failure policy; a route may override it.
    pub on_error: OnError,
    /// Answer locally while a bucket is known to be full (shared stores only; exact).
    pub local_deny_cache: bool,
}

/// `[client_ip]`: how the client address is found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClientIpSettings {
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
}

/// `[upstreams.<name>]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    /// The table name, referenced by routes.
    pub name: String,
    /// Servers as written (`host:port`), already checked to resolve.
    pub servers: Vec<String>,
}

/// How a route groups requests into buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The client address (see [`ClientIpSettings`]).
    ClientIp,
    /// The value of a request header; requests without it are keyed by client address.
    Header(HeaderName),
    /// One bucket for every client.
    Global,
}

/// A host match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// `example.com`: that host only (case-insensitive, port ignored).
    Exact(String),
    /// `*.example.com`: any subdomain of `example.com`, stored as `.example.com`.
    Suffix(String),
}

/// One `[[routes]]` entry, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// Unique name; used in metric labels and policy names.
    pub name: String,
    /// Optional host match.
    pub host: Option<HostMatch>,
    /// Path prefix (default `/`).
    pub path_prefix: String,
    /// Methods matched; empty means any.
    ///
    /// When `GET` is listed and `HEAD` is not, `HEAD` is added: as in nginx's
    /// `limit_except GET`, a HEAD request is served by the GET handler, so it must not bypass
    /// a GET-only limit.
    pub methods: Vec<Method>,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// How clients are grouped.
    pub key: KeySpec,
    /// Evaluate and count, never deny.
    pub shadow: bool,
    /// Failure policy for this route (the store default when not overridden).
    pub on_error: OnError,
    /// Limits, all decided together.
    pub limits: Vec<Limit>,
}

/// A complete, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was loaded from (for messages and reloads).
    pub source: PathBuf,
    /// `[server]`.
    pub server: ServerSettings,
    /// `[store]`.
    pub store: StoreSettings,
    /// `[client_ip]`.
    pub client_ip: ClientIpSettings,
    /// `[upstreams.*]`, sorted by name.
    pub upstreams: Vec<Upstream>,
    /// `[[routes]]`, in file order (first match wins).
    pub routes: Vec<RouteConfig>,
}

// ---------------------------------------------------------------------------------------------
// The schema as written in TOML.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    client_ip: RawClientIp,
    #[serde(default)]
    upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Spanned<SocketAddr>,
    admin_listen: Spanned<SocketAddr>,
    #[serde(default = "default_threads")]
    threads: Spanned<usize>,
    #[serde(default = "default_grace")]
    grace_period: GracePeriod,
    pid_file: Option<PathBuf>,
    upgrade_sock: Option<PathBuf>,
    admin_token: Option<Spanned<String>>,
}

fn default_threads() -> Spanned<usize> {
    Spanned::new(0..0, 1)
}
fn default_grace() -> GracePeriod {
    BoundedDuration(Duration::from_secs(5))
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
enum RawBackend {
    #[default]
    Memory,
    Redis,
    RedisCluster,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(default = "default_backend")]
    backend: Spanned<RawBackend>,
    url: Option<Spanned<String>>,
    urls: Option<Spanned<Vec<String>>>,
    #[serde(default = "default_prefix")]
    prefix: Spanned<String>,
    #[serde(default = "default_timeout")]
    timeout: StoreTimeout,
    #[serde(default = "default_on_error")]
    on_error: OnError,
    #[serde(default = "default_true")]
    local_deny_cache: bool,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            backend: default_backend(),
            url: None,
            urls: None,
            prefix: default_prefix(),
            timeout: default_timeout(),
            on_error: default_on_error(),
            local_deny_cache: true,
        }
    }
}

fn default_backend() -> Spanned<RawBackend> {
    Spanned::new(0..0, RawBackend::Memory)
}
fn default_prefix() -> Spanned<String> {
    Spanned::new(0..0, "slidegate".into())
}
fn default_timeout() -> StoreTimeout {
    BoundedDuration(Duration::from_millis(50))
}
fn default_true() -> bool {
    true
}
fn default_on_error() -> OnError {
    OnError::Allow
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClientIp {
    #[serde(default)]
    trusted_proxies: Vec<IpNet>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    servers: Spanned<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Spanned<String>,
    host: Option<Spanned<String>>,
    #[serde(default = "default_path_prefix")]
    path_prefix: Spanned<String>,
    #[serde(default)]
    methods: Vec<Spanned<String>>,
    upstream: Spanned<String>,
    #[serde(default = "default_key")]
    key: Spanned<String>,
    #[serde(default)]
    shadow: bool,
    on_error: Option<OnError>,
    #[serde(default)]
    limits: Vec<RawLimit>,
}

fn default_path_prefix() -> Spanned<String> {
    Spanned::new(0..0, "/".into())
}
fn default_key() -> Spanned<String> {
    Spanned::new(0..0, "client_ip".into())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    requests: NonZeroU32,
    window: Spanned<Window>,
}

/// Parse a humantime duration and check it lies in `min..=max`; messages start with `what`.
///
/// Runs inside deserialization, so the TOML parser attaches the value's line to the error.
fn parse_bounded(what: &str, text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let dur =
        humantime::parse_duration(text).map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    if dur < min {
        return Err(format!(
            "{what} {text:?} is shorter than {}",
            humantime::format_duration(min)
        ));
    }
    if dur > max {
        return Err(format!(
            "{what} {text:?} is longer than {}",
            humantime::format_duration(max)
        ));
    }
    Ok(dur)
}

/// A humantime duration bounded to `MIN_MS..=MAX_MS` milliseconds, checked while parsing so
/// an out-of-range value is reported with its line like any other parse error.
#[derive(Clone, Copy)]
struct BoundedDuration<const MIN_MS: u64, const MAX_MS: u64>(Duration);

impl<'de, const MIN_MS: u64, const MAX_MS: u64> Deserialize<'de>
    for BoundedDuration<MIN_MS, MAX_MS>
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let min = Duration::from_millis(MIN_MS);
        let max = Duration::from_millis(MAX_MS);
        parse_bounded("duration", &text, min, max)
            .map(BoundedDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// `store.timeout`: 1 ms ..= 60 s. Zero would time out every decision before the store could
/// answer; unbounded values overflow `timeout * 4` in the Redis store's connect timeout.
type StoreTimeout = BoundedDuration<1, 60_000>;

/// `server.grace_period`: 0 ..= 1 h. Zero (no drain) is allowed; an hour is far beyond any
/// sane drain and keeps the seconds pingora is given small.
type GracePeriod = BoundedDuration<0, 3_600_000>;

/// Longest window: 30 days. Window plus a microsecond timestamp then stays far below 2^53,
/// so Lua's doubles in the Redis script are exact, and `as_micros() as u64` cannot truncate.
const MAX_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// A window length: humantime syntax, whole milliseconds, 1 ms ..= [`MAX_WINDOW`].
#[derive(Clone, Copy)]
struct Window(Duration);

impl<'de> Deserialize<'de> for Window {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let dur = parse_bounded("window", &text, Duration::from_millis(1), MAX_WINDOW)
            .map_err(serde::de::Error::custom)?;
        if !dur.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(serde::de::Error::custom(format!(
                "window {text:?} must be a whole number of milliseconds"
            )));
        }
        Ok(Window(dur))
    }
}

// ---------------------------------------------------------------------------------------------

impl Config {
    /// Read and validate a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(path, &text)
    }

    /// Validate config text; `path` is used in messages and as [`Config::source`].
    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::new(text);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e
                .path()
                .to_string()
                .replace(".$__serde_spanned_private_value", "");
            let inner = e.into_inner();
            ConfigError::Invalid {
                file: path.to_path_buf(),
                line: inner.span().map(|s| line_of(text, s.start)),
                key: if key == "." {
                    "(top level)".into()
                } else {
                    key
                },
                message: inner.message().to_string(),
            }
        })?;
        Validator { path, text }.validate(raw)
    }
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

struct Validator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Validator<'_> {
    fn err<T>(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError::Invalid {
            file: self.path.to_path_buf(),
            // Defaulted values carry an empty 0..0 span: no line to point at.
            line: span
                .filter(|s| s.end > 0)
                .map(|s| line_of(self.text, s.start)),
            key: key.into(),
            message: message.into(),
        })
    }

    fn validate(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let server = self.server(raw.server)?;
        let store = self.store(raw.store)?;
        let upstreams = self.upstreams(raw.upstreams)?;
        let mut names = HashSet::new();
        let mut routes = Vec::with_capacity(raw.routes.len());
        for (i, r) in raw.routes.into_iter().enumerate() {
            let route = self.route(i, r, &upstreams, store.on_error, &mut names)?;
            routes.push(route);
        }
        Ok(Config {
            source: self.path.to_path_buf(),
            server,
            store,
            client_ip: ClientIpSettings {
                trusted_proxies: raw.client_ip.trusted_proxies,
            },
            upstreams,
            routes,
        })
    }

    fn server(&self, raw: RawServer) -> Result<ServerSettings, ConfigError> {
        let threads = *raw.threads.get_ref();
        if threads == 0 || threads > 1024 {
            return self.err(
                Some(raw.threads.span()),
                "server.threads",
                "must be between 1 and 1024",
            );
        }
        let (listen, admin) = (*raw.listen.get_ref(), *raw.admin_listen.get_ref());
        if listen == admin {
            return self.err(
                Some(raw.admin_listen.span()),
                "server.admin_listen",
                "must differ from server.listen",
            );
        }
        // Same port on overlapping addresses would only fail later, at bind time: an
        // unspecified address (0.0.0.0 / ::) takes the port on every interface, and
        // `[::ffff:a.b.c.d]` is the same socket as `a.b.c.d`. Port 0 is exempt: ephemeral
        // binds never collide.
        let overlap = listen.ip().is_unspecified()
            || admin.ip().is_unspecified()
            || listen.ip().to_canonical() == admin.ip().to_canonical();
        if listen.port() == admin.port() && listen.port() != 0 && overlap {
            return self.err(
                Some(raw.admin_listen.span()),
                "server.admin_listen",
                format!("{admin} overlaps server.listen {listen}: use a different port"),
            );
        }
        if let Some(token) = &raw.admin_token {
            // Sent as `Authorization: Bearer <token>`: a header value, and never guessable empty.
            let t = token.get_ref();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return self.err(
                    Some(token.span()),
                    "server.admin_token",
                    "must be non-empty visible ASCII without spaces",
                );
            }
        }
        // Per-instance defaults: two slidegates on one host must not share pingora's fixed
        // /tmp paths, or the second one's upgrade socket would hijack the first's.
        let tag = format!("slidegate-{}", listen.port());
        let dir = std::env::temp_dir();
        Ok(ServerSettings {
            listen,
            admin_listen: admin,
            threads,
            grace_period: raw.grace_period.0,
            pid_file: raw
                .pid_file
                .unwrap_or_else(|| dir.join(format!("{tag}.pid"))),
            upgrade_sock: raw
                .upgrade_sock
                .unwrap_or_else(|| dir.join(format!("{tag}.sock"))),
            admin_token: raw.admin_token.map(Spanned::into_inner),
        })
    }

    fn store(&self, raw: RawStore) -> Result<StoreSettings, ConfigError> {
        let backend = match raw.backend.get_ref() {
            RawBackend::Memory => {
                if let Some(url) = &raw.url {
                    return self.err(
                        Some(url.span()),
                        "store.url",
                        "only used with backend = \"redis\"",
                    );
                }
                if let Some(urls) = &raw.urls {
                    return self.err(
                        Some(urls.span()),
                        "store.urls",
                        "only used with backend = \"redis_cluster\"",
                    );
                }
                Backend::Memory
            }
            RawBackend::Redis => {
                let Some(url) = raw.url else {
                    return self.err(
                        Some(raw.backend.span()),
                        "store.url",
                        "required with backend = \"redis\"",
                    );
                };
                if let Some(urls) = &raw.urls {
                    return self.err(
                        Some(urls.span()),
                        "store.urls",
                        "only used with backend = \"redis_cluster\"; use store.url",
                    );
                }
                if let Err(e) = redis::Client::open(url.get_ref().as_str()) {
                    return self.err(
                        Some(url.span()),
                        "store.url",
                        format!("invalid Redis URL: {e}"),
                    );
                }
                Backend::Redis {
                    url: url.into_inner(),
                }
            }
            RawBackend::RedisCluster => {
                let Some(urls) = raw.urls else {
                    return self.err(
                        Some(raw.backend.span()),
                        "store.urls",
                        "required with backend = \"redis_cluster\"",
                    );
                };
                if let Some(url) = &raw.url {
                    return self.err(
                        Some(url.span()),
                        "store.url",
                        "only used with backend = \"redis\"; use store.urls",
                    );
                }
                if urls.get_ref().is_empty() {
                    return self.err(
                        Some(urls.span()),
                        "store.urls",
                        "needs at least one seed node",
                    );
                }
                for (i, u) in urls.get_ref().iter().enumerate() {
                    if let Err(e) = redis::Client::open(u.as_str()) {
                        return self.err(
                            Some(urls.span()),
                            format!("store.urls[{i}]"),
                            format!("invalid Redis URL: {e}"),
                        );
                    }
                }
                Backend::RedisCluster {
                    urls: urls.into_inner(),
                }
            }
        };
        let prefix = raw.prefix.get_ref();
        if prefix.is_empty()
            || prefix.contains(['{', '}'])
            || prefix.chars().any(|c| c.is_whitespace())
        {
            return self.err(
                Some(raw.prefix.span()),
                "store.prefix",
                "must be non-empty, without whitespace, '{' or '}'",
            );
        }
        Ok(StoreSettings {
            backend,
            prefix: raw.prefix.into_inner(),
            timeout: raw.timeout.0,
            on_error: raw.on_error,
            local_deny_cache: raw.local_deny_cache,
        })
    }

    fn upstreams(&self, raw: BTreeMap<String, RawUpstream>) -> Result<Vec<Upstream>, ConfigError> {
        let mut out = Vec::with_capacity(raw.len());
        for (name, up) in raw {
            let key = format!("upstreams.{name}.servers");
            if up.servers.get_ref().is_empty() {
                return self.err(Some(up.servers.span()), key, "needs at least one server");
            }
            for (i, s) in up.servers.get_ref().iter().enumerate() {
                match s.to_socket_addrs().map(|mut a| a.next()) {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        return self.err(
                            Some(up.servers.span()),
                            format!("{key}[{i}]"),
                            format!("{s:?} resolves to no address"),
                        )
                    }
                    Err(e) => {
                        return self.err(
                            Some(up.servers.span()),
                            format!("{key}[{i}]"),
                            format!("{s:?} is not host:port: {e}"),
                        )
                    }
                }
            }
            out.push(Upstream {
                name,
                servers: up.servers.into_inner(),
            });
        }
        Ok(out)
    }

    fn route(
        &self,
        i: usize,
        r: RawRoute,
        upstreams: &[Upstream],
        default_on_error: OnError,
        names: &mut HashSet<String>,
    ) -> Result<RouteConfig, ConfigError> {
        let at = |k: &str| format!("routes[{i}].{k}");
        let name = r.name.get_ref();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return self.err(
                Some(r.name.span()),
                at("name"),
                "must be non-empty ASCII letters, digits, '-', '_' or '.'",
            );
        }
        if !names.insert(name.clone()) {
            return self.err(
                Some(r.name.span()),
                at("name"),
                format!("duplicate route name {name:?}"),
            );
        }
        let host = match &r.host {
            None => None,
            Some(h) => {
                let mut v = h.get_ref().to_ascii_lowercase();
                // "api.example.com." is the same host in absolute form; store it without the
                // dot so configured hosts never end with '.' (the request side strips it too).
                if v.ends_with('.') {
                    v.pop();
                }
                let bare = v.strip_prefix("*.").unwrap_or(&v);
                // Empty labels ("..", a leading '.', a second trailing '.') name no host.
                if bare.is_empty()
                    || bare.contains(['*', '/', ' ', ':'])
                    || bare.split('.').any(str::is_empty)
                {
                    return self.err(
                        Some(h.span()),
                        at("host"),
                        "must be a host name or \"*.domain\"",
                    );
                }
                Some(match v.strip_prefix('*') {
                    Some(suffix) => HostMatch::Suffix(suffix.to_string()),
                    None => HostMatch::Exact(v),
                })
            }
        };
        if !r.path_prefix.get_ref().starts_with('/') {
            return self.err(
                Some(r.path_prefix.span()),
                at("path_prefix"),
                "must start with '/'",
            );
        }
        let mut methods = Vec::new();
        for (j, m) in r.methods.iter().enumerate() {
            match Method::from_bytes(m.get_ref().to_ascii_uppercase().as_bytes()) {
                Ok(method) => methods.push(method),
                Err(_) => {
                    return self.err(
                        Some(m.span()),
                        format!("routes[{i}].methods[{j}]"),
                        format!("invalid method {:?}", m.get_ref()),
                    )
                }
            }
        }
        // HEAD is answered by the GET handler upstream; without this a GET-only limit could
        // be bypassed with HEAD (nginx's `limit_except GET` covers HEAD for the same reason).
        if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
            methods.push(Method::HEAD);
        }
        let Some(upstream) = upstreams
            .iter()
            .position(|u| &u.name == r.upstream.get_ref())
        else {
            return self.err(
                Some(r.upstream.span()),
                at("upstream"),
                format!("no [upstreams.{}] is defined", r.upstream.get_ref()),
            );
        };
        let key = match r.key.get_ref().as_str() {
            "client_ip" => KeySpec::ClientIp,
            "global" => KeySpec::Global,
            other => match other.strip_prefix("header:") {
                Some(h) => match HeaderName::from_bytes(h.as_bytes()) {
                    Ok(name) => KeySpec::Header(name),
                    Err(_) => return self.err(Some(r.key.span()), at("key"), format!("invalid header name {h:?}")),
                },
                None => {
                    return self.err(
                        Some(r.key.span()),
                        at("key"),
                        format!("unknown key {other:?}; expected \"client_ip\", \"global\" or \"header:<Name>\""),
                    )
                }
            },
        };
        let mut limits = Vec::with_capacity(r.limits.len());
        for (j, l) in r.limits.iter().enumerate() {
            let window = l.window.get_ref().0;
            if limits.iter().any(|x: &Limit| x.window == window) {
                return self.err(
                    Some(l.window.span()),
                    format!("routes[{i}].limits[{j}].window"),
                    format!(
                        "duplicate window {} on route {name:?}",
                        humantime::format_duration(window)
                    ),
                );
            }
            limits.push(Limit {
                requests: l.requests.get(),
                window,
            });
        }
        Ok(RouteConfig {
            name: r.name.into_inner(),
            host,
            path_prefix: r.path_prefix.into_inner(),
            methods,
            upstream,
            key,
            shadow: r.shadow,
            on_error: r.on_error.unwrap_or(default_on_error),
            limits,
        })
    }
}
