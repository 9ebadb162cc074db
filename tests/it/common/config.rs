//! Config text for the binary under test: [`ConfigBuilder`] for the part below `[server]`
//! (which [`super::proxy::Proxy::start`] writes itself), and the lines of a route tests repeat.

use std::fmt::Write as _;

/// `limits = [...]` with one limit, as a line of a `[[routes]]` entry.
pub fn limit(requests: u32, window: &str) -> String {
    format!("limits = [ {{ requests = {requests}, window = \"{window}\" }} ]")
}

/// `path_prefix` and one limit, as the lines of a `[[routes]]` entry.
pub fn limited(path: &str, requests: u32, window: &str) -> String {
    format!("path_prefix = \"{path}\"\n{}", limit(requests, window))
}

/// The lines of an upstream reached with HTTP/2 over TLS (`h2 = true`) as `localhost`,
/// verified against the CA in `ca_file`.
pub fn h2_tls_upstream(ca_file: &std::path::Path) -> String {
    format!("tls = true\nsni = \"localhost\"\nca_file = {ca_file:?}\nh2 = true")
}

/// The lines of a route at `prefix` to `upstream`, keyed by `X-Client`, whose cost is
/// `X-Cost` and settles from `X-Tokens-Used`, with `extra` lines (`max_cost`, `limits`).
pub fn settle_route(prefix: &str, upstream: &str, extra: &str) -> String {
    format!(
        "path_prefix = \"{prefix}\"\nupstream = \"{upstream}\"\nkey = \"header:X-Client\"\n\
         cost = \"header:X-Cost\"\nsettle = \"header:X-Tokens-Used\"\n{extra}"
    )
}

/// Builds the part of a slidegate config below `[server]` (which [`Proxy::start`] writes itself,
/// with run-time ports and per-test paths), so tests state only what they are about.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    store: Option<String>,
    trusted_proxies: Vec<String>,
    client_ip_extra: String,
    upstreams: Vec<(String, Vec<String>, String)>,
    routes: Vec<(String, String)>,
    raw: String,
}

impl ConfigBuilder {
    /// An empty config: memory store, no trusted proxies, no upstreams, no routes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The config many tests need, built: upstream `app` at `addr` and one route, `all`, for
    /// every request, with no limits.
    pub fn unlimited(addr: impl std::fmt::Display) -> String {
        Self::new().upstream("app", addr).route("all", "").build()
    }

    /// Raw lines of the `[store]` table (default: the memory store).
    pub fn store(mut self, lines: &str) -> Self {
        self.store = Some(lines.to_string());
        self
    }

    /// `[client_ip] trusted_proxies`, as CIDRs.
    pub fn trusted_proxies(mut self, cidrs: &[&str]) -> Self {
        self.trusted_proxies = cidrs.iter().map(|c| c.to_string()).collect();
        self
    }

    /// More `[client_ip]` lines (TOML), e.g. `ipv6_prefix = 64`.
    pub fn client_ip(mut self, lines: &str) -> Self {
        self.client_ip_extra.push_str(lines);
        self.client_ip_extra.push('\n');
        self
    }

    /// `[upstreams.<name>]` with one server.
    pub fn upstream(self, name: &str, addr: impl std::fmt::Display) -> Self {
        self.upstream_servers(name, &[addr.to_string()])
    }

    /// `[upstreams.<name>]` with several servers.
    pub fn upstream_servers(mut self, name: &str, servers: &[String]) -> Self {
        self.upstreams
            .push((name.to_string(), servers.to_vec(), String::new()));
        self
    }

    /// `[upstreams.<name>]` with one server and `lines` as its other keys (e.g. `tls = true`).
    pub fn upstream_with(mut self, name: &str, addr: impl std::fmt::Display, lines: &str) -> Self {
        self.upstreams
            .push((name.to_string(), vec![addr.to_string()], lines.to_string()));
        self
    }

    /// Raw TOML appended after everything else, e.g. a `[log]` table.
    pub fn raw(mut self, toml: &str) -> Self {
        self.raw.push_str(toml);
        self.raw.push('\n');
        self
    }

    /// A `[[routes]]` entry named `name`, with `lines` as its other keys (TOML, one per line).
    /// Unless `lines` sets `upstream`, the route uses the first upstream added.
    pub fn route(mut self, name: &str, lines: &str) -> Self {
        self.routes.push((name.to_string(), lines.to_string()));
        self
    }

    /// The TOML text, for [`super::proxy::Proxy::start`].
    pub fn build(&self) -> String {
        let mut out = String::new();
        out.push_str("[store]\n");
        out.push_str(self.store.as_deref().unwrap_or("backend = \"memory\""));
        out.push_str("\n\n[client_ip]\ntrusted_proxies = [");
        for (i, c) in self.trusted_proxies.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            let _ = write!(out, "{sep}{c:?}");
        }
        out.push_str("]\n");
        out.push_str(&self.client_ip_extra);
        for (name, servers, lines) in &self.upstreams {
            let _ = write!(
                out,
                "\n[upstreams.{name}]\nservers = {servers:?}\n{lines}\n"
            );
        }
        let default_upstream = self.upstreams.first().map(|(n, _, _)| n.as_str());
        for (name, lines) in &self.routes {
            let _ = writeln!(out, "\n[[routes]]\nname = {name:?}");
            let sets_upstream = lines
                .lines()
                .any(|l| l.trim_start().starts_with("upstream"));
            if let (false, Some(up)) = (sets_upstream, default_upstream) {
                let _ = writeln!(out, "upstream = {up:?}");
            }
            out.push_str(lines);
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&self.raw);
        out
    }
}

/// `text` is refused by `Config::from_toml` naming `key` at `line`, with a message that
/// contains `message` (`text` is shown on failure).
pub fn assert_invalid(text: &str, key: &str, line: usize, message: &str) {
    use slidegate::config::{Config, ConfigError};
    match Config::from_toml(std::path::Path::new("t.toml"), text) {
        Err(ConfigError::Invalid {
            line: l,
            key: k,
            message: m,
            ..
        }) => {
            assert_eq!((k.as_str(), l), (key, Some(line)), "{text}\n{m}");
            assert!(m.contains(message), "{text}\n{m}");
        }
        other => panic!("{text}\n{other:?}"),
    }
}
