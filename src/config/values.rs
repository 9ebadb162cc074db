//! Small value types of the model, parsed from what users write: an upstream's `host:port`
//! its timeouts, and a route's host match.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// `host:port` of an upstream server, checked for syntax only (resolved when rules are built).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or IP address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl FromStr for HostPort {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, port) = match s.strip_prefix('[') {
            Some(rest) => {
                let (v6, port) = rest.split_once("]:").ok_or("expected [IPv6]:port")?;
                v6.parse::<std::net::Ipv6Addr>()
                    .map_err(|_| "invalid IPv6 address")?;
                (v6, port)
            }
            None => {
                let (host, port) = s.rsplit_once(':').ok_or("missing :port")?;
                if host.is_empty()
                    || host.contains(|c: char| c.is_whitespace() || "/[]:@".contains(c))
                {
                    return Err("invalid host");
                }
                (host, port)
            }
        };
        let port = port
            .parse()
            .map_err(|_| "port must be a number from 0 to 65535")?;
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Per-upstream timeouts (nginx `proxy_connect_timeout`, `proxy_read_timeout`,
/// `proxy_send_timeout`, `keepalive_timeout` of an upstream block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTimeouts {
    /// TCP connect to one server.
    pub connect: Duration,
    /// Longest silence while reading the upstream's response.
    pub read: Duration,
    /// Longest stall while writing the request to the upstream.
    pub write: Duration,
    /// How long an idle pooled upstream connection is kept.
    pub idle: Duration,
}

/// A host match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub enum HostMatch {
    /// `example.com`: that host only (case-insensitive, port ignored).
    Exact(String),
    /// `*.example.com`: any subdomain of `example.com`, stored as `.example.com`.
    Suffix(String),
}

impl HostMatch {
    /// Parse a configured host: lower-cased, without a trailing dot; `None` if it names no host
    /// a request could send (the same rule as the request side:
    /// [`crate::request::form::host_name`]).
    pub fn parse(text: &str) -> Option<HostMatch> {
        let (wildcard, bare) = match text.strip_prefix("*.") {
            Some(bare) => (true, bare),
            None => (false, text),
        };
        // "api.example.com." is the same host in absolute form: stored without the dot, as the
        // request side strips it too.
        let name = crate::request::form::host_name(bare.as_bytes())?;
        // `name` is ASCII (checked), a prefix of `bare`.
        let name = bare[..name.len()].to_ascii_lowercase();
        Some(if wildcard {
            HostMatch::Suffix(format!(".{name}"))
        } else {
            HostMatch::Exact(name)
        })
    }

    /// Does `host` (any case, no port, no trailing dot) match?
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => h.eq_ignore_ascii_case(host),
            HostMatch::Suffix(s) => {
                host.len() > s.len() && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostMatch;

    #[test]
    fn hosts_no_request_can_send_are_refused() {
        for bad in [
            "a@b.com", "a/b", "a b", "é.com", "a..b", ".", "*.", "*", "a.*.com", "[::1]",
        ] {
            assert_eq!(HostMatch::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hosts_are_lower_cased_without_the_trailing_dot() {
        assert_eq!(
            HostMatch::parse("API.Example.com."),
            Some(HostMatch::Exact("api.example.com".into()))
        );
        assert_eq!(
            HostMatch::parse("*.Example.com"),
            Some(HostMatch::Suffix(".example.com".into()))
        );
    }
}

/// An upstream's health settings: active checks, passive ejection and name re-resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHealth {
    /// `health_check`: active checks, off when `None`.
    pub check: Option<ActiveCheck>,
    /// `max_fails`: failed connects or 502/504-class failures within `fail_timeout` that take
    /// a server out for `fail_timeout` (nginx's); 0 never takes one out.
    pub max_fails: u32,
    /// `fail_timeout`.
    pub fail_timeout: Duration,
    /// `resolve_interval`: how often the servers' names are looked up again; `None`: once.
    pub resolve_interval: Option<Duration>,
}

/// `health_check`: what is asked of each server, how often, and how many answers flip it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveCheck {
    /// `GET` this path and expect `200`; `None`: a TCP connect.
    pub path: Option<String>,
    /// Time between two checks of a server.
    pub interval: Duration,
    /// Longest time one check may take.
    pub timeout: Duration,
    /// Consecutive passed checks that bring a server back.
    pub healthy: u32,
    /// Consecutive failed checks that take a server out.
    pub unhealthy: u32,
}
