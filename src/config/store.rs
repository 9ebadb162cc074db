//! `[store]`: which store holds the limit state, how to reach it, and what a route does when
//! it cannot decide. Fixed for the life of the process (a change needs a restart).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limiter::redis::{RedisNodes, RedisTarget, SentinelNodes};

/// What to do with a request when the store cannot decide in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Fail open: forward the request (counted as `error_allowed`).
    Allow,
    /// Fail closed: answer 503 with `Retry-After: 1` (counted as `error_denied`).
    Deny,
    /// Decide with this proxy's own in-process log for the same limits while the shared store
    /// cannot (counted as `local_allowed` / `local_denied`): an outage admits at most
    /// (proxies × limit) per window. The default with a shared store.
    Local,
}

/// A Redis URL, parsed once at validation into the connection info the store uses.
///
/// It never prints or serializes its password: [`RedisUrl::shown`] is the address with `***`
/// for it, and a fingerprint of the whole URL (password included) stands in for the rest, so
/// the restart-only diff still sees a changed password.
#[derive(Debug, Clone)]
pub struct RedisUrl {
    /// What the store connects with.
    pub info: Box<redis::ConnectionInfo>,
    /// The address without its password, for messages.
    shown: String,
    /// Equal for equal URLs and passwords within this process.
    fingerprint: u64,
}

impl RedisUrl {
    /// A URL whose connection info `info` was parsed from `text`.
    pub fn new(text: &str, info: redis::ConnectionInfo) -> RedisUrl {
        RedisUrl {
            shown: super::secrets::redacted_url(&info),
            fingerprint: super::secrets::fingerprint(&text),
            info: Box::new(info),
        }
    }

    /// The same URL authenticating with `password` (`[store] password_file`).
    pub fn with_password(self, password: &str) -> RedisUrl {
        let settings = self.info.redis_settings().clone().set_password(password);
        let info = (*self.info).set_redis_settings(settings);
        RedisUrl {
            shown: super::secrets::redacted_url(&info),
            fingerprint: super::secrets::fingerprint(&(self.fingerprint, password)),
            info: Box::new(info),
        }
    }

    /// The address as messages may show it: `rediss://user:***@host:port/db`.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Is it a `rediss://` (TLS) address?
    pub fn is_tls(&self) -> bool {
        matches!(self.info.addr(), redis::ConnectionAddr::TcpTls { .. })
    }
}

impl PartialEq for RedisUrl {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint
    }
}

impl Serialize for RedisUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.shown, self.fingerprint).serialize(s)
    }
}

/// `[store] ca_file`, `client_cert_file` and `client_key_file`: PEM read and checked once at
/// validation. Serialized as the paths only (a changed file needs a restart, like the key).
#[derive(Clone, PartialEq, Serialize)]
pub struct RedisTls {
    /// Where the CA and the client pair were read from.
    pub files: Vec<std::path::PathBuf>,
    /// PEM of the private CA(s) trusted instead of the system roots.
    #[serde(skip)]
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of the client certificate chain and of its key.
    #[serde(skip)]
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key's PEM never reaches a log.
        f.debug_struct("RedisTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl RedisTls {
    /// What redis-rs builds TLS clients from.
    pub fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client_pem
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca_pem.clone(),
        }
    }
}

/// Which store holds the limit state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Backend {
    /// In-process store: exact within one process, not shared.
    Memory,
    /// One Redis server (or a primary behind a proxy).
    Redis {
        /// `redis://`, `rediss://`, with optional `user:password@` and `/db`.
        url: RedisUrl,
    },
    /// A Redis Cluster, reached through one or more seed nodes.
    RedisCluster {
        /// Seed node URLs.
        urls: Vec<RedisUrl>,
    },
    /// A master found through Redis Sentinel and followed across failovers.
    RedisSentinel {
        /// The Sentinels' URLs (with the Sentinels' own credentials, if any).
        urls: Vec<RedisUrl>,
        /// Which master, and how to log in to it.
        master: SentinelMaster,
    },
}

/// `[store]` `master_name`, `master_username`, `master_password`, `db`: the master the
/// Sentinels are asked for, and the login and database used on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SentinelMaster {
    /// The name the Sentinels monitor it under.
    pub name: String,
    /// ACL user on the master (`None`: `default`).
    pub username: Option<String>,
    /// Password on the master.
    #[serde(serialize_with = "super::redacted")]
    pub password: Option<super::Secret>,
    /// Database number on the master.
    pub db: i64,
}

impl SentinelMaster {
    /// What redis-rs logs in to the master with.
    fn connection_info(&self) -> redis::RedisConnectionInfo {
        let mut info = redis::RedisConnectionInfo::default().set_db(self.db);
        if let Some(user) = &self.username {
            info = info.set_username(user);
        }
        if let Some(password) = &self.password {
            info = info.set_password(password.expose());
        }
        info
    }
}

impl Backend {
    /// Every Redis URL of the backend (none for the memory store).
    pub fn redis_urls_mut(&mut self) -> &mut [RedisUrl] {
        match self {
            Backend::Memory => &mut [],
            Backend::Redis { url } => std::slice::from_mut(url),
            Backend::RedisCluster { urls } => urls,
            Backend::RedisSentinel { urls, .. } => urls,
        }
    }
}

/// `[store]`: where limit state lives. (`[store].on_error` is a routing default, folded into
/// every [`super::Counting::on_error`].)
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreSettings {
    /// The backend and its address(es).
    pub backend: Backend,
    /// Key namespace in Redis.
    pub prefix: String,
    /// Deadline of one limiter decision; the store owns it (see [`crate::limiter::Store`]).
    pub timeout: Duration,
    /// Answer locally while a bucket is known to be full (shared stores only; exact).
    pub local_deny_cache: bool,
    /// Memory backend: bound of the store's own accounting of keys and entries, in bytes.
    pub max_memory: u64,
    /// How long a cached denial is trusted before the shared store is asked again.
    pub deny_cache_max_age: Duration,
    /// Requests waiting for room (`max_delay`) at once, process-wide; a denial past it is
    /// answered at once.
    pub max_delayed: u32,
    /// Buckets the local fallback remembers the shared store's answers of (`fallback_buckets`).
    pub fallback_buckets: usize,
    /// Memory backend: the file its windows are written to at a stop and read from at the
    /// start (`state_file`; `crate::limiter::memory::persist`).
    pub state_file: Option<std::path::PathBuf>,
    /// TLS material for `rediss://` URLs beyond the system roots.
    pub tls: Option<RedisTls>,
    /// `partition_key_secret_file`: what the RateLimit fields' `pk` is keyed with (`None`: a
    /// random key per process, see [`crate::response::partition_key`]).
    #[serde(serialize_with = "super::redacted")]
    pub partition_key_secret: Option<super::Secret>,
}

impl StoreSettings {
    /// What the Redis store needs to connect, or `None` for the memory backend.
    pub fn redis_target(&self) -> Option<RedisTarget> {
        let nodes = match &self.backend {
            Backend::Memory => return None,
            Backend::Redis { url } => RedisNodes::Single(url.info.clone()),
            Backend::RedisCluster { urls } => {
                RedisNodes::Cluster(urls.iter().map(|u| (*u.info).clone()).collect())
            }
            Backend::RedisSentinel { urls, master } => {
                RedisNodes::Sentinel(Box::new(SentinelNodes {
                    sentinels: urls.iter().map(|u| (*u.info).clone()).collect(),
                    master_name: master.name.clone(),
                    master: master.connection_info(),
                }))
            }
        };
        Some(RedisTarget {
            nodes,
            prefix: self.prefix.clone(),
            timeout: self.timeout,
            tls: self.tls.as_ref().map(RedisTls::certificates),
        })
    }
}
