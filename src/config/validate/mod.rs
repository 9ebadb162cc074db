//! Checks what serde cannot, turning the raw schema into the typed model: unique route names,
//! upstream references, duplicate windows, listener overlaps, URL and address syntax.
//!
//! Pure: no DNS, no sockets, no clock. Upstream host names are resolved once, when the rule set
//! is built ([`crate::routes::Rules::build`]); Redis URLs are parsed here, once, into the
//! connection info the store uses. Every error names the file, the line when known, and the key.

use std::collections::HashSet;
use std::path::Path;

use toml::Spanned;

use super::raw::{RawBackend, RawClientIp, RawConfig, RawStore};
use super::{ClientIpSettings, Config, ConfigError, OnError, RoutingSpec};
use crate::keys::KeyPrefixes;

mod answers;
mod cost;
mod key;
mod limit;
mod log;
mod plan;
mod policy;
mod redis_nodes;
mod request_headers;
mod route;
mod secrets;
mod sections;
mod slots;
mod state_file;
mod tls;
mod upstream_health;

/// 1-based line of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Validates one file's raw schema; `path` and `text` are kept to name the file and line.
pub(super) struct Validator<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

type Span = std::ops::Range<usize>;

impl Validator<'_> {
    pub(super) fn err<T>(
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

    /// `[client_ip] ipv4_prefix` (0–32, default 32) and `ipv6_prefix` (0–128, default 128).
    fn key_prefixes(&self, raw: &RawClientIp) -> Result<KeyPrefixes, ConfigError> {
        let mut prefixes = KeyPrefixes::default();
        for (value, prefix, max, key) in [
            (
                &raw.ipv4_prefix,
                &mut prefixes.v4,
                32,
                "client_ip.ipv4_prefix",
            ),
            (
                &raw.ipv6_prefix,
                &mut prefixes.v6,
                128,
                "client_ip.ipv6_prefix",
            ),
        ] {
            let Some(value) = value else { continue };
            if *value.get_ref() > max {
                let message = format!("a prefix length of 0 to {max} bits");
                return self.err(Some(value.span()), key, message);
            }
            *prefix = *value.get_ref();
        }
        Ok(prefixes)
    }

    /// `[store].on_error`, the routes' default: `local` with a shared store, `allow` with the
    /// memory store (already local).
    fn route_defaults(&self, store: &RawStore) -> Result<RouteDefaults, ConfigError> {
        let shared = !matches!(store.backend.get_ref(), RawBackend::Memory);
        let value = match &store.on_error {
            Some(v) => self.on_error(v, shared, "store.on_error".into())?,
            None if shared => OnError::Local,
            None => OnError::Allow,
        };
        let deny_status = match &store.deny_status {
            Some(v) => self.deny_status(v, "store.deny_status".into())?,
            None => http::StatusCode::TOO_MANY_REQUESTS,
        };
        Ok(RouteDefaults {
            on_error: value,
            shared,
            deny_status,
            smoothing: self.smoothing_default(store)?,
        })
    }

    /// One `on_error` value: `local` needs a shared store to fall back from.
    fn on_error(
        &self,
        v: &Spanned<OnError>,
        shared: bool,
        key: String,
    ) -> Result<OnError, ConfigError> {
        if *v.get_ref() == OnError::Local && !shared {
            return self.err(
                Some(v.span()),
                key,
                "\"local\" needs a shared store (backend = \"redis\" or \"redis_cluster\"); \
                 the memory store already decides locally",
            );
        }
        Ok(*v.get_ref())
    }

    /// The whole configuration.
    pub fn validate(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let server_header = self.server_header(&raw.server.server_header)?;
        let forwarded_headers = self.forwarded_headers(&raw.server.forwarded_headers)?;
        let request_id = raw.server.request_id;
        let server = self.server(raw.server, raw.tls)?;
        let defaults = self.route_defaults(&raw.store)?;
        let store = self.store(raw.store)?;
        let upstreams = self.upstreams(raw.upstreams)?;
        let log = self.log(raw.log)?;
        let mut names = HashSet::new();
        let plans = self.plan_entries(&raw.plans)?;
        let mut routes = Vec::with_capacity(raw.routes.len());
        for (i, r) in raw.routes.into_iter().enumerate() {
            routes.push(self.route(i, r, &upstreams, defaults, &mut names, &plans)?);
        }
        Ok(Config {
            source: self.path.to_path_buf(),
            server,
            store,
            log,
            routing: RoutingSpec {
                server_header,
                forwarded_headers,
                request_id,
                client_ip: ClientIpSettings {
                    key_prefixes: self.key_prefixes(&raw.client_ip)?,
                    trusted_proxies: (raw.client_ip.trusted_proxies.into_iter())
                        .map(crate::keys::canonical_net)
                        .collect(),
                },
                upstreams,
                routes,
            },
        })
    }
}

/// What routes inherit from `[store]`: `on_error` (and whether the store is shared, so that
/// `local` is allowed), `deny_status`, `max_delay` and `max_queue`.
#[derive(Clone, Copy)]
struct RouteDefaults {
    on_error: OnError,
    shared: bool,
    deny_status: http::StatusCode,
    smoothing: policy::SmoothingDefault,
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

    /// Dual-stack listeners see IPv4 peers as `::ffff:a.b.c.d` and compare them as IPv4, so
    /// an entry written in that form is stored as its IPv4 network (it would match nothing).
    #[test]
    fn ipv4_mapped_trusted_proxies_are_stored_as_ipv4() {
        let text = "[server]\nlisten = \"[::]:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                    [client_ip]\ntrusted_proxies = [\"::ffff:10.0.0.0/104\", \"2001:db8::/32\"]\n";
        let config = Config::from_toml(Path::new("t.toml"), text).expect("valid");
        let nets: Vec<String> = (config.routing.client_ip.trusted_proxies.iter())
            .map(|n| n.to_string())
            .collect();
        assert_eq!(nets, ["10.0.0.0/8", "2001:db8::/32"]);
    }

    #[test]
    fn admin_hosts_are_host_names_without_a_port() {
        let head = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n";
        let ok = format!("{head}admin_hosts = [\"Admin.Example.com.\", \"*.ops.example\"]\n");
        let config = Config::from_toml(Path::new("t.toml"), &ok).expect("valid admin_hosts");
        let hosts = &config.server.admin_hosts;
        assert!(hosts[0].matches("admin.example.com") && hosts[1].matches("a.ops.example"));
        for bad in [
            "admin.example.com:8443",
            "",
            "a b",
            "http://admin.example.com",
        ] {
            let text = format!("{head}admin_hosts = [\"ok.example\", \"{bad}\"]\n");
            let err = Config::from_toml(Path::new("t.toml"), &text).unwrap_err();
            assert!(
                err.to_string().contains("server.admin_hosts[1]"),
                "{bad}: {err}"
            );
        }
    }
}
