//! `[upstreams.<name>]` as written: its servers, timeouts and TLS, and its health keys:
//! `health_check` (active checks), `max_fails` and `fail_timeout` (passive ejection, as
//! nginx's), `resolve_interval` (names looked up again).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use toml::Spanned;

use super::super::secrets::EnvText;
use super::{BoundedDuration, UpstreamTimeout};

/// `[upstreams.<name>]`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawUpstream {
    /// `${NAME}` substituted, so a container image's config can take its upstream from the
    /// environment.
    pub servers: Spanned<Vec<EnvText>>,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: UpstreamTimeout,
    #[serde(default = "default_upstream_io_timeout")]
    pub read_timeout: UpstreamTimeout,
    #[serde(default = "default_upstream_io_timeout")]
    pub write_timeout: UpstreamTimeout,
    #[serde(default = "default_upstream_io_timeout")]
    pub idle_timeout: UpstreamTimeout,
    #[serde(default)]
    pub tls: bool,
    pub sni: Option<Spanned<String>>,
    pub verify: Option<Spanned<bool>>,
    pub ca_file: Option<Spanned<PathBuf>>,
    #[serde(default)]
    pub h2: bool,
    /// Active checks; none by default.
    pub health_check: Option<RawHealthCheck>,
    /// Failures within `fail_timeout` that take a server out (0: never).
    #[serde(default = "default_max_fails")]
    pub max_fails: u32,
    #[serde(default = "default_fail_timeout")]
    pub fail_timeout: FailTimeout,
    /// Look the servers' names up again this often; none: once, when the rules are built.
    pub resolve_interval: Option<Spanned<ResolveInterval>>,
}

fn default_connect_timeout() -> UpstreamTimeout {
    BoundedDuration(Duration::from_secs(5))
}
fn default_upstream_io_timeout() -> UpstreamTimeout {
    BoundedDuration(Duration::from_secs(60))
}

/// `health_check.interval`: 100 ms ..= 1 h between two checks of a server.
pub(in crate::config) type CheckInterval = BoundedDuration<100, 3_600_000>;
/// `health_check.timeout`: 1 ms ..= 1 min for one check (connect, and the answer's head).
pub(in crate::config) type CheckTimeout = BoundedDuration<1, 60_000>;
/// `fail_timeout`: 1 ms ..= 1 h, the window failures are counted in and how long a server is out.
pub(in crate::config) type FailTimeout = BoundedDuration<1, 3_600_000>;
/// `resolve_interval`: 1 s ..= 1 day between two look-ups of the servers' names.
pub(in crate::config) type ResolveInterval = BoundedDuration<1000, 86_400_000>;

/// `health_check = { path, interval, timeout, healthy, unhealthy }`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawHealthCheck {
    /// `GET` this path and expect `200`; none: a TCP connect is the check.
    pub path: Option<Spanned<String>>,
    #[serde(default = "default_interval")]
    pub interval: CheckInterval,
    #[serde(default = "default_timeout")]
    pub timeout: CheckTimeout,
    #[serde(default = "default_healthy")]
    pub healthy: Threshold,
    #[serde(default = "default_unhealthy")]
    pub unhealthy: Threshold,
}

fn default_interval() -> CheckInterval {
    BoundedDuration(Duration::from_secs(5))
}
fn default_timeout() -> CheckTimeout {
    BoundedDuration(Duration::from_secs(1))
}
fn default_healthy() -> Threshold {
    Threshold(2)
}
fn default_unhealthy() -> Threshold {
    Threshold(3)
}
pub(in crate::config) fn default_max_fails() -> u32 {
    1
}
pub(in crate::config) fn default_fail_timeout() -> FailTimeout {
    BoundedDuration(Duration::from_secs(10))
}

/// `healthy`, `unhealthy`: consecutive checks that flip a server, 1 ..= 100, checked while
/// parsing so a `0` is reported with its key and line.
#[derive(Clone, Copy)]
pub(in crate::config) struct Threshold(pub u32);

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        match u32::try_from(n) {
            Ok(n @ 1..=100) => Ok(Threshold(n)),
            _ => Err(serde::de::Error::custom(format!(
                "{n} checks: must be 1 to 100 consecutive checks"
            ))),
        }
    }
}

impl Serialize for Threshold {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}
