//! The schema users write: what serde reads from the TOML file, before any cross-field check.
//!
//! Serde already rejects unknown keys, malformed durations, addresses and CIDRs here, and the
//! TOML parser attaches the offending value's line to the error. Values that later checks must
//! point at are kept in [`Spanned`] so [`super::validate`] can name their line too.
//!
//! Durations are bounded at parse time ([`BoundedDuration`], [`Window`]) so that the arithmetic
//! other modules do on them (`timeout * 4`, `Limit::window_us`, the `u32` of milliseconds in a
//! `LimitId`, window plus a microsecond timestamp in Lua doubles) can never overflow or lose
//! precision.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::secrets::{EnvPath, EnvText};
use super::OnError;

mod bounded;
mod key;
mod log;
mod threads;
mod upstream;
pub use bounded::MAX_WINDOW;
pub(super) use bounded::*;
pub(super) use key::RawKey;
pub(super) use log::RawLog;
pub(super) use threads::Threads;
pub(super) use upstream::*;

/// The whole file.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub server: RawServer,
    /// `[tls]`: the listener's certificates chosen by SNI.
    pub tls: Option<RawTls>,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub client_ip: RawClientIp,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    /// `[plans.<name>]`: the limits of each customer plan, for routes with a `plan`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plans: BTreeMap<String, RawPlan>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub log: RawLog,
}

/// `[plans.<name>]`: one customer plan.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    /// The plan's limits, as a route's (`limits[].key` included).
    #[serde(default)]
    pub limits: Vec<RawLimit>,
}

/// A route's `plan`: where each client's plan is read, and the plan of a client it lacks.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlanChoice {
    /// `"file:<path>"` or `"redis"`.
    pub from: Spanned<String>,
    /// The plan of a client the source does not name.
    pub default: Spanned<String>,
    /// `from = "redis"`: how long a client's plan is used before it is read again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<Spanned<PlanRefresh>>,
}

/// `[server]`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub listen: Spanned<SocketAddr>,
    pub admin_listen: Spanned<SocketAddr>,
    #[serde(default = "default_threads")]
    pub threads: Spanned<Threads>,
    #[serde(default = "default_grace")]
    pub grace_period: GracePeriod,
    #[serde(default = "default_shutdown_delay")]
    pub shutdown_delay: ShutdownDelay,
    pub pid_file: Option<PathBuf>,
    pub upgrade_sock: Option<PathBuf>,
    pub admin_token: Option<Spanned<EnvText>>,
    pub admin_token_file: Option<Spanned<EnvPath>>,
    #[serde(default)]
    pub admin_hosts: Vec<Spanned<String>>,
    /// The inspector shows the clients' keys (`false`: only their `pk`).
    #[serde(default = "default_true")]
    pub admin_show_keys: bool,
    /// Counters of each route's top limited clients (`/api/v1/top`).
    #[serde(default = "default_top_clients")]
    pub top_clients: Spanned<u32>,
    #[serde(default = "default_client_header_timeout")]
    pub client_header_timeout: ClientTimeout,
    #[serde(default = "default_keepalive_timeout")]
    pub keepalive_timeout: KeepaliveTimeout,
    #[serde(default = "default_sixty_seconds")]
    pub client_body_timeout: ClientTimeout,
    #[serde(default = "default_sixty_seconds")]
    pub send_timeout: ClientTimeout,
    #[serde(default = "default_max_connections")]
    pub max_connections: Spanned<u32>,
    #[serde(default = "default_keepalive_requests")]
    pub keepalive_requests: Spanned<u32>,
    pub tls_listen: Option<Spanned<SocketAddr>>,
    pub tls_cert: Option<Spanned<PathBuf>>,
    pub tls_key: Option<Spanned<PathBuf>>,
    /// Default "1.2" (filled in by `-T` when `tls_listen` is set).
    pub tls_min_version: Option<Spanned<super::TlsVersion>>,
    #[serde(default)]
    pub h2c: bool,
    /// `Server` on every response; `""` sends none.
    #[serde(default = "default_server_header")]
    pub server_header: Spanned<String>,
    /// Forwarding headers set on proxied requests; the others are removed from them.
    #[serde(default = "default_forwarded_headers")]
    pub forwarded_headers: Spanned<Vec<Spanned<String>>>,
    /// `X-Request-Id`: `"on"`, `"upstream"` or `"off"`.
    #[serde(default)]
    pub request_id: super::RequestIdMode,
}

fn default_forwarded_headers() -> Spanned<Vec<Spanned<String>>> {
    let names = super::ForwardedHeader::ALL.map(|h| Spanned::new(0..0, h.name().to_string()));
    Spanned::new(0..0, names.into())
}

fn default_server_header() -> Spanned<String> {
    Spanned::new(0..0, "slidegate".into())
}

/// `[tls]`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    #[serde(default)]
    pub certs: Vec<RawTlsCert>,
}

/// One `[[tls.certs]]` entry.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTlsCert {
    pub cert: Spanned<PathBuf>,
    pub key: Spanned<PathBuf>,
    /// Absent: the DNS names of the certificate's subjectAltName.
    pub names: Option<Spanned<Vec<Spanned<String>>>>,
}

fn default_threads() -> Spanned<Threads> {
    Spanned::new(0..0, Threads::Auto)
}
fn default_grace() -> GracePeriod {
    BoundedDuration(Duration::from_secs(5))
}
fn default_shutdown_delay() -> ShutdownDelay {
    BoundedDuration(Duration::ZERO)
}
fn default_client_header_timeout() -> ClientTimeout {
    BoundedDuration(Duration::from_secs(10))
}
fn default_keepalive_timeout() -> KeepaliveTimeout {
    BoundedDuration(Duration::from_secs(60))
}
fn default_sixty_seconds() -> ClientTimeout {
    BoundedDuration(Duration::from_secs(60))
}
fn default_top_clients() -> Spanned<u32> {
    Spanned::new(0..0, crate::top::DEFAULT_TOP_CLIENTS as u32)
}
fn default_max_connections() -> Spanned<u32> {
    Spanned::new(0..0, 10_000)
}
/// nginx's `keepalive_requests` default.
fn default_keepalive_requests() -> Spanned<u32> {
    Spanned::new(0..0, 1000)
}

/// `[store].backend`.
#[derive(Deserialize, Serialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawBackend {
    #[default]
    Memory,
    Redis,
    RedisCluster,
    RedisSentinel,
}

/// `[store]`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(default = "default_backend")]
    pub backend: Spanned<RawBackend>,
    pub url: Option<Spanned<EnvText>>,
    pub urls: Option<Spanned<Vec<EnvText>>>,
    /// Replaces the password of every URL (trailing newline stripped).
    pub password_file: Option<Spanned<EnvPath>>,
    /// The secret the RateLimit fields' partition keys are hashed under (trailing newline
    /// stripped); none: a random one per process.
    pub partition_key_secret_file: Option<Spanned<EnvPath>>,
    /// Private CA (PEM) trusted for `rediss://` instead of the system roots.
    pub ca_file: Option<Spanned<EnvPath>>,
    pub client_cert_file: Option<Spanned<EnvPath>>,
    pub client_key_file: Option<Spanned<EnvPath>>,
    /// `redis_sentinel`: the master's name, its own credentials and database.
    pub master_name: Option<Spanned<String>>,
    pub master_username: Option<Spanned<String>>,
    pub master_password: Option<Spanned<EnvText>>,
    pub db: Option<Spanned<i64>>,
    #[serde(default = "default_prefix")]
    pub prefix: Spanned<String>,
    #[serde(default = "default_timeout")]
    pub timeout: StoreTimeout,
    /// Default: `local` with a shared store, `allow` with the memory store.
    pub on_error: Option<Spanned<OnError>>,
    #[serde(default = "default_true")]
    pub local_deny_cache: bool,
    #[serde(default = "default_max_memory")]
    pub max_memory: ByteSize,
    #[serde(default = "default_deny_cache_max_age")]
    pub deny_cache_max_age: DenyCacheMaxAge,
    /// The routes' default status for a denial (429).
    pub deny_status: Option<Spanned<u16>>,
    /// The routes' default `max_delay` (none: denials answer at once).
    pub max_delay: Option<MaxDelay>,
    /// The routes' default `max_queue`.
    pub max_queue: Option<Spanned<u32>>,
    /// Requests waiting for room (`max_delay`) at once, over every route and client.
    #[serde(default = "default_max_delayed")]
    pub max_delayed: Spanned<u32>,
    /// Buckets the local fallback (`on_error = "local"`) remembers what the shared store said of.
    #[serde(default = "default_fallback_buckets")]
    pub fallback_buckets: Spanned<u32>,
    /// Memory store: where its windows are written at a stop and read at the start.
    pub state_file: Option<Spanned<PathBuf>>,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            backend: default_backend(),
            url: None,
            urls: None,
            password_file: None,
            partition_key_secret_file: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            master_name: None,
            master_username: None,
            master_password: None,
            db: None,
            prefix: default_prefix(),
            timeout: default_timeout(),
            on_error: None,
            local_deny_cache: true,
            max_memory: default_max_memory(),
            deny_cache_max_age: default_deny_cache_max_age(),
            deny_status: None,
            max_delay: None,
            max_queue: None,
            max_delayed: default_max_delayed(),
            fallback_buckets: default_fallback_buckets(),
            state_file: None,
        }
    }
}

fn default_fallback_buckets() -> Spanned<u32> {
    Spanned::new(0..0, crate::limiter::fallback::learned::MAX_LEARNED as u32)
}
fn default_max_delayed() -> Spanned<u32> {
    Spanned::new(0..0, crate::config::DEFAULT_MAX_DELAYED)
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
fn default_max_memory() -> ByteSize {
    ByteSize(256 << 20)
}
fn default_deny_cache_max_age() -> DenyCacheMaxAge {
    BoundedDuration(Duration::from_secs(10))
}
fn default_true() -> bool {
    true
}

/// `[client_ip]`.
#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientIp {
    #[serde(default)]
    pub trusted_proxies: Vec<IpNet>,
    pub ipv4_prefix: Option<Spanned<u8>>,
    pub ipv6_prefix: Option<Spanned<u8>>,
}

/// One `[[routes]]` entry.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub name: Spanned<String>,
    pub host: Option<Spanned<String>>,
    #[serde(default = "default_path_prefix")]
    pub path_prefix: Spanned<String>,
    #[serde(default)]
    pub methods: Vec<Spanned<String>>,
    pub upstream: Spanned<String>,
    /// One part, or a list of parts (a composite key).
    #[serde(default = "default_key")]
    pub key: Spanned<RawKey>,
    #[serde(default)]
    pub path_case_insensitive: bool,
    #[serde(default)]
    pub shadow: bool,
    pub on_error: Option<Spanned<OnError>>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    /// Client networks that skip the limits.
    #[serde(default)]
    pub exempt: Vec<IpNet>,
    pub deny_status: Option<Spanned<u16>>,
    pub deny_body_file: Option<Spanned<PathBuf>>,
    pub deny_content_type: Option<Spanned<String>>,
    /// Upstream statuses whose admissions stay counted; any other gives the admission back.
    pub count_status: Option<Spanned<Vec<Spanned<u16>>>>,
    /// A denial for which room frees within this long waits for it instead.
    pub max_delay: Option<MaxDelay>,
    /// Waiters per bucket for `max_delay`.
    pub max_queue: Option<Spanned<u32>>,
    /// Fields set on every response of the route (name → value).
    #[serde(default)]
    pub response_headers: BTreeMap<String, Spanned<String>>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` of the tightest limit beside the draft's.
    #[serde(default)]
    pub legacy_headers: bool,
    /// A request's cost in the cost limits: an integer or `"header:<Name>"` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Spanned<RawCost>>,
    /// A request claiming a higher cost is refused (`400`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<Spanned<u32>>,
    /// `"header:<Name>"`: the response header or trailer with the request's real cost;
    /// `"json:<path>[+<path>…]"`: the response's JSON body (or event stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<Spanned<String>>,
    /// The most bytes of a body, or of one event, that `settle = "json:…"` reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle_scan_bytes: Option<Spanned<u64>>,
    /// `"max_cost"`: every request reserves `max_cost` and settles down to its real cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<Spanned<String>>,
    /// Limits from the client's plan (`[plans.<name>]`), besides the route's own `limits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Spanned<RawPlanChoice>>,
}

/// `cost`: a fixed integer or where to read it.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(super) enum RawCost {
    Fixed(u32),
    Text(String),
}

/// `limits[].unit`: what a limit counts.
#[derive(Deserialize, Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawUnit {
    Requests,
    Cost,
}

fn default_path_prefix() -> Spanned<String> {
    Spanned::new(0..0, "/".into())
}
fn default_key() -> Spanned<RawKey> {
    Spanned::new(0..0, RawKey::One("client_ip".into()))
}

/// One entry of a route's `limits`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    /// Requests per `window` (a request limit); a limit is this, `quota` or `concurrent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Spanned<NonZeroU32>>,
    /// Cost units per window (a cost limit, `unit = "cost"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Spanned<NonZeroU32>>,
    /// What the limit counts: `"requests"` (default) or `"cost"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Spanned<RawUnit>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Spanned<Window>>,
    /// Requests in flight at once (a concurrency limit), each lease held while its request
    /// runs (renewed every `lease_ttl / 3`), and at most `lease_ttl` past a crashed proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<Spanned<NonZeroU32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<Spanned<LeaseTtl>>,
    /// Slot length of a bounded-memory limit (checked against the window in `validate`).
    #[serde(default)]
    pub resolution: Option<Spanned<Resolution>>,
    /// A key of its own instead of the route's (`"global"`: one bucket for every client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Spanned<RawKey>>,
    /// A calendar quota's period: `"day"`, `"week"` (ISO, from Monday) or `"month"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<Spanned<String>>,
    /// A calendar quota's time zone, an IANA name (default `"UTC"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<Spanned<String>>,
}

impl RawLimit {
    /// The options given that belong to a kind of limit of its own (its parameters, which the
    /// kind reads: `Kind::from_options`), each with its name, span and text; empty for a limit
    /// of `requests`/`quota` per `window` or `concurrent`.
    pub fn kind_options(&self) -> Vec<(&'static str, std::ops::Range<usize>, String)> {
        [("per", &self.per), ("time_zone", &self.time_zone)]
            .into_iter()
            .filter_map(|(name, v)| v.as_ref().map(|v| (name, v.span(), v.get_ref().clone())))
            .collect()
    }
}
