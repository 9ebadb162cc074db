//! What a request logs, and the batch its record is copied into (fixed-size entries plus one
//! text arena for their strings: no allocation per request once the arena has grown).

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::time::{Duration, SystemTime};

use http::Version;

use crate::metrics::Decision;

/// Longest `User-Agent` or `Referer` logged, in bytes as sent (before escaping): the rest is
/// cut, so a client cannot make one line arbitrarily long.
pub const MAX_HEADER_LOGGED: usize = 512;

/// Longest raw request line logged for a refused head, in bytes as sent: nginx's default
/// `large_client_header_buffers` size, past which nginx would not have read the line either.
pub const MAX_REQUEST_LINE: usize = 8192;

/// What is logged about one request, borrowed from the request; [`AccessLog::send`] copies it.
///
/// [`AccessLog::send`]: super::AccessLog::send
pub struct LogLine<'a> {
    /// When the request finished.
    pub time: SystemTime,
    /// The client address (after trusted `X-Forwarded-For` hops).
    pub client: Option<IpAddr>,
    /// Request method.
    pub method: &'a str,
    /// Request host without port (from the URI or `Host`), if any.
    pub host: Option<&'a str>,
    /// Request path, without the query string.
    pub path: &'a str,
    /// The request target as sent (query included): `combined`'s `$request` only.
    pub target: &'a [u8],
    /// HTTP version of the client's request.
    pub version: Version,
    /// `TLSv1.2`, `TLSv1.3` (see [`tls_version_name`]); `None` over plain TCP.
    pub tls_version: Option<&'static str>,
    /// Status sent (499 when the client went away before any response).
    pub status: u16,
    /// The matched route's name.
    pub route: Option<&'a str>,
    /// The limiter decision.
    pub decision: Option<Decision>,
    /// The policy names of the limits that had no room, comma-separated (a denial only).
    pub limits: Option<&'a str>,
    /// The partition key of the client's bucket on a limited route (the RateLimit fields'
    /// `pk`, a keyed hash: never the key itself).
    pub pk: Option<&'a str>,
    /// The cost charged at admission, on a route with cost limits.
    pub cost: Option<u32>,
    /// The cost the upstream reported (`settle`), when it reported one.
    pub settled_cost: Option<u32>,
    /// The upstream server used.
    pub upstream: Option<SocketAddr>,
    /// From choosing the upstream to its response header.
    pub upstream_time: Option<Duration>,
    /// The whole request, from its header being read to the end of the response.
    pub duration: Duration,
    /// Request body bytes read (after de-chunking).
    pub bytes_received: usize,
    /// Response body bytes sent (nginx's `$body_bytes_sent`: the head is not counted).
    pub bytes_sent: usize,
    /// `User-Agent`, as sent.
    pub user_agent: Option<&'a [u8]>,
    /// `Referer`, as sent.
    pub referer: Option<&'a [u8]>,
    /// `X-Request-Id` (see [`crate::request::id`]).
    pub request_id: Option<&'a [u8]>,
    /// The raw request line, for a head refused before it was parsed (`combined`'s
    /// `$request` is then this line, as nginx logs it; empty for `-`). `None` for a parsed one.
    pub request_line: Option<&'a [u8]>,
    /// What was wrong with a request refused before any hook ran (JSON's `error`).
    pub error: Option<&'a str>,
}

/// Pure: nginx's `$ssl_protocol` name of rustls's version name (`TLSv1_3` -> `TLSv1.3`).
pub fn tls_version_name(rustls: &str) -> Option<&'static str> {
    match rustls {
        "TLSv1_3" => Some("TLSv1.3"),
        "TLSv1_2" => Some("TLSv1.2"),
        "" => None,
        _ => Some("TLS"),
    }
}

/// A [`LogLine`] whose strings live in its batch's `text`.
pub(super) struct Entry {
    pub(super) time: SystemTime,
    pub(super) client: Option<IpAddr>,
    pub(super) method: Range<usize>,
    pub(super) host: Option<Range<usize>>,
    pub(super) path: Range<usize>,
    /// Escaped as nginx escapes (ASCII only).
    pub(super) target: Range<usize>,
    pub(super) version: Version,
    pub(super) tls_version: Option<&'static str>,
    pub(super) status: u16,
    pub(super) route: Option<Range<usize>>,
    pub(super) decision: Option<Decision>,
    pub(super) limits: Option<Range<usize>>,
    pub(super) pk: Option<Range<usize>>,
    pub(super) cost: Option<u32>,
    pub(super) settled_cost: Option<u32>,
    pub(super) upstream: Option<SocketAddr>,
    pub(super) upstream_time: Option<Duration>,
    pub(super) duration: Duration,
    pub(super) bytes_received: usize,
    pub(super) bytes_sent: usize,
    /// Escaped as nginx escapes, cut at [`MAX_HEADER_LOGGED`].
    pub(super) user_agent: Option<Range<usize>>,
    /// Escaped as nginx escapes, cut at [`MAX_HEADER_LOGGED`].
    pub(super) referer: Option<Range<usize>>,
    pub(super) request_id: Option<Range<usize>>,
    /// Escaped as nginx escapes, cut at [`MAX_REQUEST_LINE`].
    pub(super) request_line: Option<Range<usize>>,
    pub(super) error: Option<Range<usize>>,
}

/// Records on their way to the writer: fixed-size entries plus one text arena for their strings.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) text: String,
    pub(super) entries: Vec<Entry>,
}

impl Batch {
    pub(super) fn with_capacity(records: usize) -> Batch {
        Batch {
            text: String::with_capacity(records * 160),
            entries: Vec::with_capacity(records),
        }
    }

    fn push_str(&mut self, s: &str) -> Range<usize> {
        let start = self.text.len();
        self.text.push_str(s);
        start..self.text.len()
    }

    /// Append `bytes` (at most `max` of them) escaped as nginx escapes log variables.
    fn push_escaped(&mut self, bytes: &[u8], max: usize) -> Range<usize> {
        let start = self.text.len();
        escape_into(&mut self.text, &bytes[..bytes.len().min(max)]);
        start..self.text.len()
    }

    pub(super) fn push(&mut self, r: &LogLine<'_>) {
        let entry = Entry {
            time: r.time,
            client: r.client,
            method: self.push_str(r.method),
            host: r.host.map(|h| self.push_str(h)),
            path: self.push_str(r.path),
            target: self.push_escaped(r.target, usize::MAX),
            version: r.version,
            tls_version: r.tls_version,
            status: r.status,
            route: r.route.map(|n| self.push_str(n)),
            decision: r.decision,
            limits: r.limits.map(|l| self.push_str(l)),
            pk: r.pk.map(|p| self.push_str(p)),
            cost: r.cost,
            settled_cost: r.settled_cost,
            upstream: r.upstream,
            upstream_time: r.upstream_time,
            duration: r.duration,
            bytes_received: r.bytes_received,
            bytes_sent: r.bytes_sent,
            user_agent: r
                .user_agent
                .map(|v| self.push_escaped(v, MAX_HEADER_LOGGED)),
            referer: r.referer.map(|v| self.push_escaped(v, MAX_HEADER_LOGGED)),
            request_id: r.request_id.map(|v| self.push_escaped(v, usize::MAX)),
            request_line: r
                .request_line
                .map(|v| self.push_escaped(v, MAX_REQUEST_LINE)),
            error: r.error.map(|e| self.push_str(e)),
        };
        self.entries.push(entry);
    }
}

/// Pure: nginx's escaping of logged variables (`ngx_http_log_escape`): `"`, `\`, bytes below
/// 0x20 and from 0x7f up become `\xHH` (uppercase hex); the result is ASCII.
pub fn escape_into(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            out.push_str("\\x");
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        } else {
            out.push(b as char);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_nginx_s() {
        let mut s = String::new();
        escape_into(&mut s, b"a \"q\" \\ \x01\x7f\xc3\xa9 ~");
        assert_eq!(s, r#"a \x22q\x22 \x5C \x01\x7F\xC3\xA9 ~"#);
    }

    #[test]
    fn tls_names_are_nginx_s() {
        assert_eq!(tls_version_name("TLSv1_3"), Some("TLSv1.3"));
        assert_eq!(tls_version_name("TLSv1_2"), Some("TLSv1.2"));
        assert_eq!(tls_version_name(""), None);
    }
}
