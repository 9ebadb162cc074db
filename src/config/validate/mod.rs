//! Checks what serde cannot, turning the raw schema into the typed model: unique route names,
//! upstream references, duplicate windows, listener overlaps, URL and address syntax.
//!
//! Pure: no DNS, no sockets, no clock. Upstream host names are resolved once, when the rule set
//! is built ([`crate::routes::Rules::build`]); Redis URLs are parsed here, once, into the
//! connection info the store uses. Every error names the file, the line when known, and the key.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use http::{HeaderName, Method};
use redis::IntoConnectionInfo;
use toml::Spanned;

use super::raw::{RawBackend, RawConfig, RawLog, RawRoute, RawServer, RawStore, RawUpstream};
use super::{
    AccessTarget, Backend, ClientIpSettings, Config, ConfigError, HostMatch, HostPort, KeySpec,
    LogSettings, OnError, RedisUrl, RouteSpec, RoutingSpec, ServerSettings, StoreSettings,
    TlsListenerSettings, UpstreamSpec, UpstreamTimeouts, UpstreamTls,
};
use crate::limiter::Limit;

/// 1-based line of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Would two listeners take the same socket? Same port on overlapping addresses would only
/// fail later, at bind time: an unspecified address (0.0.0.0 / ::) takes the port on every
/// interface, and `[::ffff:a.b.c.d]` is the same socket as `a.b.c.d`. Port 0 is exempt:
/// ephemeral binds never collide.
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    let overlap = a.ip().is_unspecified()
        || b.ip().is_unspecified()
        || a.ip().to_canonical() == b.ip().to_canonical();
    a.port() == b.port() && a.port() != 0 && overlap
}

/// Validates one file's raw schema; `path` and `text` are kept to name the file and line.
pub(super) struct Validator<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

type Span = std::ops::Range<usize>;

impl Validator<'_> {
    fn err<T>(
        &self,
        span: Option<Span>,
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

    /// The whole configuration.
    pub fn validate(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let server = self.server(raw.server)?;
        let default_on_error = raw.store.on_error;
        let store = self.store(raw.store)?;
        let upstreams = self.upstreams(raw.upstreams)?;
        let log = self.log(raw.log)?;
        let mut names = HashSet::new();
        let mut routes = Vec::with_capacity(raw.routes.len());
        for (i, r) in raw.routes.into_iter().enumerate() {
            routes.push(self.route(i, r, &upstreams, default_on_error, &mut names)?);
        }
        Ok(Config {
            source: self.path.to_path_buf(),
            server,
            store,
            log,
            routing: RoutingSpec {
                client_ip: ClientIpSettings {
                    trusted_proxies: raw.client_ip.trusted_proxies,
                },
                upstreams,
                routes,
            },
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
        let max_connections = *raw.max_connections.get_ref();
        if !(1..=1_000_000).contains(&max_connections) {
            return self.err(
                Some(raw.max_connections.span()),
                "server.max_connections",
                "must be between 1 and 1000000",
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
        if collide(listen, admin) {
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
        let tls = self.tls_listener(&raw, listen, admin)?;
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
            client_header_timeout: raw.client_header_timeout.0,
            keepalive_timeout: raw.keepalive_timeout.0,
            max_connections,
            tls,
            h2c: raw.h2c,
        })
    }

    /// `server.tls_listen` and its certificate: all three keys or none. The files are read
    /// when the listener is built ([`crate::tls`]), not here.
    fn tls_listener(
        &self,
        raw: &RawServer,
        listen: SocketAddr,
        admin: SocketAddr,
    ) -> Result<Option<TlsListenerSettings>, ConfigError> {
        let Some(tls_listen) = &raw.tls_listen else {
            for (field, key) in [
                (&raw.tls_cert, "server.tls_cert"),
                (&raw.tls_key, "server.tls_key"),
            ] {
                if let Some(v) = field {
                    return self.err(Some(v.span()), key, "only used with server.tls_listen");
                }
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
        let path = |field: &Option<Spanned<std::path::PathBuf>>, key: &str| match field {
            Some(p) if !p.get_ref().as_os_str().is_empty() => Ok(p.get_ref().clone()),
            Some(p) => self.err(Some(p.span()), key, "must name a PEM file"),
            None => self.err(
                Some(tls_listen.span()),
                key,
                "required with server.tls_listen",
            ),
        };
        Ok(Some(TlsListenerSettings {
            listen: addr,
            cert: path(&raw.tls_cert, "server.tls_cert")?,
            key: path(&raw.tls_key, "server.tls_key")?,
        }))
    }

    fn log(&self, raw: RawLog) -> Result<LogSettings, ConfigError> {
        let access = match raw.access.get_ref().as_str() {
            "off" => AccessTarget::Off,
            "stdout" => AccessTarget::Stdout,
            "" => {
                return self.err(
                    Some(raw.access.span()),
                    "log.access",
                    "expected \"off\", \"stdout\" or a file path",
                )
            }
            path => AccessTarget::File(path.into()),
        };
        Ok(LogSettings {
            access,
            format: raw.format,
        })
    }

    /// A key that only one backend takes, given with another: name the backend it belongs to.
    fn only_with<T>(
        &self,
        field: Option<Spanned<T>>,
        key: &str,
        hint: &str,
    ) -> Result<(), ConfigError> {
        match field {
            Some(v) => self.err(Some(v.span()), key, hint),
            None => Ok(()),
        }
    }

    fn redis_url(&self, span: Span, key: String, text: &str) -> Result<RedisUrl, ConfigError> {
        match text.into_connection_info() {
            Ok(info) => Ok(RedisUrl {
                text: text.to_string(),
                info: Box::new(info),
            }),
            Err(e) => self.err(Some(span), key, format!("invalid Redis URL: {e}")),
        }
    }

    /// A key that `backend` needs: present, or an error pointing at the backend line.
    fn required<T>(
        &self,
        field: Option<Spanned<T>>,
        backend: &Spanned<RawBackend>,
        key: &str,
        name: &str,
    ) -> Result<Spanned<T>, ConfigError> {
        match field {
            Some(v) => Ok(v),
            None => self.err(
                Some(backend.span()),
                key,
                format!("required with backend = \"{name}\""),
            ),
        }
    }

    fn store(&self, raw: RawStore) -> Result<StoreSettings, ConfigError> {
        let backend = match raw.backend.get_ref() {
            RawBackend::Memory => {
                self.only_with(raw.url, "store.url", "only used with backend = \"redis\"")?;
                self.only_with(
                    raw.urls,
                    "store.urls",
                    "only used with backend = \"redis_cluster\"",
                )?;
                Backend::Memory
            }
            RawBackend::Redis => {
                let url = self.required(raw.url, &raw.backend, "store.url", "redis")?;
                self.only_with(
                    raw.urls,
                    "store.urls",
                    "only used with backend = \"redis_cluster\"; use store.url",
                )?;
                Backend::Redis {
                    url: self.redis_url(url.span(), "store.url".into(), url.get_ref())?,
                }
            }
            RawBackend::RedisCluster => {
                let urls = self.required(raw.urls, &raw.backend, "store.urls", "redis_cluster")?;
                self.only_with(
                    raw.url,
                    "store.url",
                    "only used with backend = \"redis\"; use store.urls",
                )?;
                if urls.get_ref().is_empty() {
                    return self.err(
                        Some(urls.span()),
                        "store.urls",
                        "needs at least one seed node",
                    );
                }
                let parsed = urls
                    .get_ref()
                    .iter()
                    .enumerate()
                    .map(|(i, u)| self.redis_url(urls.span(), format!("store.urls[{i}]"), u))
                    .collect::<Result<_, _>>()?;
                Backend::RedisCluster { urls: parsed }
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
            local_deny_cache: raw.local_deny_cache,
            max_memory: raw.max_memory.0,
            deny_cache_max_age: raw.deny_cache_max_age.0,
        })
    }

    fn upstreams(
        &self,
        raw: BTreeMap<String, RawUpstream>,
    ) -> Result<Vec<UpstreamSpec>, ConfigError> {
        let mut out = Vec::with_capacity(raw.len());
        for (name, up) in raw {
            let key = format!("upstreams.{name}.servers");
            if up.servers.get_ref().is_empty() {
                return self.err(Some(up.servers.span()), key, "needs at least one server");
            }
            let mut servers = Vec::with_capacity(up.servers.get_ref().len());
            for (i, s) in up.servers.get_ref().iter().enumerate() {
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
            let timeouts = UpstreamTimeouts {
                connect: up.connect_timeout.0,
                read: up.read_timeout.0,
                write: up.write_timeout.0,
                idle: up.idle_timeout.0,
            };
            let tls_key = |k: &str| format!("upstreams.{name}.{k}");
            let tls = if up.tls {
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
                Some(UpstreamTls {
                    sni: up.sni.map(Spanned::into_inner),
                    verify: up.verify.is_none_or(Spanned::into_inner),
                    ca_file: up.ca_file.map(Spanned::into_inner),
                })
            } else {
                let stray = [
                    ("sni", up.sni.map(|v| v.span())),
                    ("verify", up.verify.map(|v| v.span())),
                    ("ca_file", up.ca_file.map(|v| v.span())),
                ];
                if let Some((k, span)) = stray.into_iter().find(|(_, s)| s.is_some()) {
                    return self.err(span, tls_key(k), "only used with tls = true");
                }
                None
            };
            out.push(UpstreamSpec {
                name,
                servers,
                timeouts,
                tls,
                h2: up.h2,
            });
        }
        Ok(out)
    }

    fn route(
        &self,
        i: usize,
        r: RawRoute,
        upstreams: &[UpstreamSpec],
        default_on_error: OnError,
        names: &mut HashSet<String>,
    ) -> Result<RouteSpec, ConfigError> {
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
            Some(h) => match HostMatch::parse(h.get_ref()) {
                Some(m) => Some(m),
                None => {
                    return self.err(
                        Some(h.span()),
                        at("host"),
                        "must be a host name or \"*.domain\"",
                    )
                }
            },
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
        Ok(RouteSpec {
            name: r.name.into_inner(),
            host,
            path_prefix: r.path_prefix.into_inner(),
            path_case_insensitive: r.path_case_insensitive,
            methods,
            upstream,
            key,
            shadow: r.shadow,
            on_error: r.on_error.unwrap_or(default_on_error),
            limits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use std::path::Path;

    /// Validation is pure: a host name that no resolver knows is accepted here (it is resolved
    /// once, when the rules are built), so `Config::from_toml` needs no network.
    #[test]
    fn validation_does_no_dns() {
        let text = r#"
[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"

[store]
backend = "redis_cluster"
urls = ["redis://seed-1.invalid:6379", "redis://seed-2.invalid:6379"]

[upstreams.app]
servers = ["app.invalid:80", "[::1]:8080"]

[[routes]]
name = "all"
upstream = "app"
"#;
        let config = Config::from_toml(Path::new("t.toml"), text).expect("valid without DNS");
        let servers: Vec<String> = config.upstreams[0]
            .servers
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(servers, ["app.invalid:80", "[::1]:8080"]);
    }

    #[test]
    fn server_syntax_is_checked_without_resolving() {
        for bad in [
            "app.invalid",
            "app.invalid:http",
            ":80",
            "app:99999",
            "a b:80",
        ] {
            let text = format!(
                "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                 [upstreams.app]\nservers = [\"{bad}\"]\n"
            );
            let err = Config::from_toml(Path::new("t.toml"), &text).unwrap_err();
            assert!(
                err.to_string().contains("upstreams.app.servers[0]"),
                "{bad}: {err}"
            );
        }
    }
}
