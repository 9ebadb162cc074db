//! The per-section checks: `[server]` (listeners, client limits; TLS in `tls`), `[log]`, `[store]` and
//! `[upstreams.*]`. Routes, which refer to the others, are checked in `route.rs`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use redis::IntoConnectionInfo;
use toml::Spanned;

use super::super::raw::{RawBackend, RawServer, RawStore, RawTls, RawUpstream};
use super::super::{
    Backend, ConfigError, HostMatch, HostPort, RedisUrl, ServerSettings, StoreSettings,
    UpstreamSpec, UpstreamTimeouts, UpstreamTls,
};
use super::{redis_nodes, Span, Validator};

/// Would two listeners take the same socket? Same port on overlapping addresses would only
/// fail later, at bind time: an unspecified address (0.0.0.0 / ::) takes the port on every
/// interface, and `[::ffff:a.b.c.d]` is the same socket as `a.b.c.d`. Port 0 is exempt:
/// ephemeral binds never collide.
pub(super) fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    let overlap = a.ip().is_unspecified()
        || b.ip().is_unspecified()
        || a.ip().to_canonical() == b.ip().to_canonical();
    a.port() == b.port() && a.port() != 0 && overlap
}

impl Validator<'_> {
    /// `[server]`: listeners, threads, client limits and the paths derived from the listener.
    pub(super) fn server(
        &self,
        raw: RawServer,
        tls: Option<RawTls>,
    ) -> Result<ServerSettings, ConfigError> {
        let (threads, max_connections) = self.server_counts(&raw)?;
        let keepalive_requests = self.keepalive_requests(&raw)?;
        let top_clients = self.top_clients(&raw)?;
        let (listen, admin) = self.listeners(&raw)?;
        let admin_token = self.admin_token(&raw)?;
        let admin_hosts = self.admin_hosts(&raw.admin_hosts)?;
        let tls = self.tls_listener(&raw, tls, listen, admin)?;
        // Per-instance defaults: two slidegates on one host must not share pingora's fixed
        // /tmp paths, or the second one's upgrade socket would hijack the first's.
        let tag = format!("slidegate-{}", listen.port());
        let dir = std::env::temp_dir();
        Ok(ServerSettings {
            listen,
            admin_listen: admin,
            threads: threads as usize,
            grace_period: raw.grace_period.0,
            shutdown_delay: raw.shutdown_delay.0,
            pid_file: raw
                .pid_file
                .unwrap_or_else(|| dir.join(format!("{tag}.pid"))),
            upgrade_sock: raw
                .upgrade_sock
                .unwrap_or_else(|| dir.join(format!("{tag}.sock"))),
            admin_token,
            admin_hosts,
            admin_show_keys: raw.admin_show_keys,
            top_clients,
            client_header_timeout: raw.client_header_timeout.0,
            keepalive_timeout: raw.keepalive_timeout.0,
            client_body_timeout: raw.client_body_timeout.0,
            send_timeout: raw.send_timeout.0,
            max_connections,
            keepalive_requests,
            tls,
            h2c: raw.h2c,
        })
    }

    /// `threads` (with `"auto"` resolved) and `max_connections`, each in its range.
    fn server_counts(&self, raw: &RawServer) -> Result<(u64, u32), ConfigError> {
        // "auto" is resolved here, once: the model holds the count this host runs.
        let threads = raw.threads.get_ref().resolve();
        if threads == 0 || threads > 1024 {
            return self.err(
                Some(raw.threads.span()),
                "server.threads",
                "must be between 1 and 1024",
            );
        }
        let max_connections = *raw.max_connections.get_ref();
        if !(1..=1_000_000).contains(&max_connections) {
            return self.err(
                Some(raw.max_connections.span()),
                "server.max_connections",
                "must be between 1 and 1000000",
            );
        }
        Ok((threads, max_connections))
    }

    /// `top_clients`: 10 to 10 000 counters per route (memory: about 17 times that many
    /// clients' bucket keys per route).
    fn top_clients(&self, raw: &RawServer) -> Result<usize, ConfigError> {
        match *raw.top_clients.get_ref() {
            n @ 10..=10_000 => Ok(n as usize),
            _ => self.err(
                Some(raw.top_clients.span()),
                "server.top_clients",
                "must be between 10 and 10000",
            ),
        }
    }

    /// `keepalive_requests`: at least 1.
    fn keepalive_requests(&self, raw: &RawServer) -> Result<u32, ConfigError> {
        match *raw.keepalive_requests.get_ref() {
            0 => self.err(
                Some(raw.keepalive_requests.span()),
                "server.keepalive_requests",
                "must be at least 1 (keepalive_timeout = \"0s\" turns keep-alive off)",
            ),
            n => Ok(n),
        }
    }

    /// `listen` and `admin_listen`: two sockets that can both be bound.
    fn listeners(&self, raw: &RawServer) -> Result<(SocketAddr, SocketAddr), ConfigError> {
        let (listen, admin) = (*raw.listen.get_ref(), *raw.admin_listen.get_ref());
        if listen == admin {
            return self.err(
                Some(raw.admin_listen.span()),
                "server.admin_listen",
                "must differ from server.listen",
            );
        }
        if collide(listen, admin) {
            return self.err(
                Some(raw.admin_listen.span()),
                "server.admin_listen",
                format!("{admin} overlaps server.listen {listen}: use a different port"),
            );
        }
        Ok((listen, admin))
    }

    /// `server.admin_hosts`: host names as a `Host` header carries them, without a port.
    fn admin_hosts(&self, raw: &[Spanned<String>]) -> Result<Vec<HostMatch>, ConfigError> {
        raw.iter()
            .enumerate()
            .map(|(i, h)| match HostMatch::parse(h.get_ref()) {
                Some(m) => Ok(m),
                None => self.err(
                    Some(h.span()),
                    format!("server.admin_hosts[{i}]"),
                    format!(
                        "{:?} is not a host name such as \"admin.example.com\" (no port)",
                        h.get_ref()
                    ),
                ),
            })
            .collect()
    }

    pub(super) fn redis_url(
        &self,
        span: Span,
        key: String,
        text: &str,
    ) -> Result<RedisUrl, ConfigError> {
        match text.into_connection_info() {
            Ok(info) => Ok(RedisUrl::new(text, info)),
            Err(e) => self.err(Some(span), key, format!("invalid Redis URL: {e}")),
        }
    }

    /// A key that `backend` needs: present, or an error pointing at the backend line.
    pub(super) fn required<'a, T>(
        &self,
        field: Option<&'a Spanned<T>>,
        backend: &Spanned<RawBackend>,
        key: &str,
    ) -> Result<&'a Spanned<T>, ConfigError> {
        match field {
            Some(v) => Ok(v),
            None => self.err(
                Some(backend.span()),
                key,
                format!(
                    "required with backend = \"{}\"",
                    backend_name(*backend.get_ref())
                ),
            ),
        }
    }

    /// `[store]`: the backend with its own keys, then the keys every backend shares.
    pub(super) fn store(&self, raw: RawStore) -> Result<StoreSettings, ConfigError> {
        let mut backend = self.backend(&raw)?;
        self.store_password(&raw, &mut backend)?;
        let tls = self.store_tls(&raw, &mut backend)?;
        let partition_key_secret = self.partition_key_secret(&raw)?;
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
        let max_delayed = *raw.max_delayed.get_ref();
        if max_delayed > crate::config::MAX_MAX_DELAYED {
            return self.err(
                Some(raw.max_delayed.span()),
                "store.max_delayed",
                format!("at most {}", crate::config::MAX_MAX_DELAYED),
            );
        }
        let fallback_buckets = *raw.fallback_buckets.get_ref();
        if !(1024..=16_777_216).contains(&fallback_buckets) {
            return self.err(
                Some(raw.fallback_buckets.span()),
                "store.fallback_buckets",
                "from 1024 to 16777216",
            );
        }
        let state_file = self.state_file(&raw, &backend)?;
        Ok(StoreSettings {
            backend,
            state_file,
            max_delayed,
            fallback_buckets: fallback_buckets as usize,
            prefix: raw.prefix.into_inner(),
            timeout: raw.timeout.0,
            local_deny_cache: raw.local_deny_cache,
            max_memory: raw.max_memory.0,
            deny_cache_max_age: raw.deny_cache_max_age.0,
            tls,
            partition_key_secret,
        })
    }

    /// The backend and its keys. A key of another backend is an error naming the backends
    /// that take it, so a new backend adds one arm here and one in [`backend_keys`].
    fn backend(&self, raw: &RawStore) -> Result<Backend, ConfigError> {
        let chosen = *raw.backend.get_ref();
        let given = [
            ("store.url", raw.url.as_ref().map(Spanned::span)),
            ("store.urls", raw.urls.as_ref().map(Spanned::span)),
        ];
        for (key, span) in given.into_iter().chain(redis_nodes::sentinel_given(raw)) {
            if let Some(span) = span.filter(|_| !backend_keys(chosen).contains(&key)) {
                return self.err(Some(span), key, foreign_key_hint(key, chosen));
            }
        }
        Ok(match chosen {
            RawBackend::Memory => Backend::Memory,
            RawBackend::Redis => {
                let url = self.required(raw.url.as_ref(), &raw.backend, "store.url")?;
                Backend::Redis {
                    url: self.redis_url(url.span(), "store.url".into(), &url.get_ref().0)?,
                }
            }
            RawBackend::RedisCluster => Backend::RedisCluster {
                urls: self.redis_urls(raw, "seed node")?,
            },
            RawBackend::RedisSentinel => self.sentinel(raw)?,
        })
    }

    /// `[upstreams.*]`, sorted by name.
    pub(super) fn upstreams(
        &self,
        raw: BTreeMap<String, RawUpstream>,
    ) -> Result<Vec<UpstreamSpec>, ConfigError> {
        let mut out = Vec::with_capacity(raw.len());
        for (name, up) in raw {
            let servers = self.upstream_servers(&name, &up)?;
            let tls = self.upstream_tls(&name, &up)?;
            let health = self.upstream_health(&name, &up)?;
            out.push(UpstreamSpec {
                name,
                servers,
                timeouts: UpstreamTimeouts {
                    connect: up.connect_timeout.0,
                    read: up.read_timeout.0,
                    write: up.write_timeout.0,
                    idle: up.idle_timeout.0,
                },
                tls,
                h2: up.h2,
                health,
            });
        }
        Ok(out)
    }

    /// `upstreams.<name>.servers`: at least one, each `host:port` (resolved later, not here).
    fn upstream_servers(&self, name: &str, up: &RawUpstream) -> Result<Vec<HostPort>, ConfigError> {
        let key = format!("upstreams.{name}.servers");
        if up.servers.get_ref().is_empty() {
            return self.err(Some(up.servers.span()), key, "needs at least one server");
        }
        let mut servers = Vec::with_capacity(up.servers.get_ref().len());
        for (i, s) in up.servers.get_ref().iter().map(|s| &s.0).enumerate() {
            match s.parse::<HostPort>() {
                Ok(hp) => servers.push(hp),
                Err(why) => {
                    return self.err(
                        Some(up.servers.span()),
                        format!("{key}[{i}]"),
                        format!("{s:?} is not host:port: {why}"),
                    )
                }
            }
        }
        Ok(servers)
    }

    /// `tls` and the keys only it uses (`sni`, `verify`, `ca_file`), refused without it.
    fn upstream_tls(
        &self,
        name: &str,
        up: &RawUpstream,
    ) -> Result<Option<UpstreamTls>, ConfigError> {
        let tls_key = |k: &str| format!("upstreams.{name}.{k}");
        if !up.tls {
            let stray = [
                ("sni", up.sni.as_ref().map(|v| v.span())),
                ("verify", up.verify.as_ref().map(|v| v.span())),
                ("ca_file", up.ca_file.as_ref().map(|v| v.span())),
            ];
            if let Some((k, span)) = stray.into_iter().find(|(_, s)| s.is_some()) {
                return self.err(span, tls_key(k), "only used with tls = true");
            }
            return Ok(None);
        }
        if let Some(sni) = &up.sni {
            let ok = !sni.get_ref().is_empty()
                && rustls::pki_types::ServerName::try_from(sni.get_ref().as_str()).is_ok();
            if !ok {
                return self.err(
                    Some(sni.span()),
                    tls_key("sni"),
                    "not a DNS name or IP address",
                );
            }
        }
        Ok(Some(UpstreamTls {
            sni: up.sni.as_ref().map(|v| v.get_ref().clone()),
            verify: up.verify.as_ref().is_none_or(|v| *v.get_ref()),
            ca_file: up.ca_file.as_ref().map(|v| v.get_ref().clone()),
        }))
    }
}

/// Every backend, for naming the ones that take a key.
const BACKENDS: [RawBackend; 4] = [
    RawBackend::Memory,
    RawBackend::Redis,
    RawBackend::RedisCluster,
    RawBackend::RedisSentinel,
];

/// The name of `backend` as written in the file.
fn backend_name(backend: RawBackend) -> &'static str {
    match backend {
        RawBackend::Memory => "memory",
        RawBackend::Redis => "redis",
        RawBackend::RedisCluster => "redis_cluster",
        RawBackend::RedisSentinel => "redis_sentinel",
    }
}

/// The `[store]` keys that only `backend` (among others, perhaps) takes.
fn backend_keys(backend: RawBackend) -> &'static [&'static str] {
    match backend {
        RawBackend::Memory => &[],
        RawBackend::Redis => &["store.url"],
        RawBackend::RedisCluster => &["store.urls"],
        RawBackend::RedisSentinel => &redis_nodes::SENTINEL_KEYS,
    }
}

/// `key` given with a backend that does not take it: which backends do, and what to use.
fn foreign_key_hint(key: &str, chosen: RawBackend) -> String {
    let takers: Vec<String> = BACKENDS
        .iter()
        .filter(|b| backend_keys(**b).contains(&key))
        .map(|b| format!("backend = \"{}\"", backend_name(*b)))
        .collect();
    let mut hint = format!("only used with {}", takers.join(" or "));
    let own = backend_keys(chosen);
    if !own.is_empty() {
        hint.push_str(&format!("; use {}", own.join(", ")));
    }
    hint
}
