//! What a request says about where it goes, checked before any route is matched: the method, the
//! form of the request-target, the Host, and `Content-Length`.
//!
//! Pingora 0.9 already refuses (400) duplicate `Host` lines, a `Host` that differs from an
//! absolute-form authority, userinfo in either, differing `Content-Length` values,
//! `Transfer-Encoding` on HTTP/1.0 and CONNECT (405). What it lets through, and an upstream may
//! route differently from the way slidegate matched it, is handled here, as nginx does:
//!
//! - a method that is not upper-case (`post`): nginx answers 400; Werkzeug upper-cases it and
//!   would serve a `POST` route the limit never saw;
//! - a target that is neither origin-form (`/…`) nor absolute-form (`http://host/…`), except
//!   `OPTIONS *`: nginx answers 400; `GET login` was matched as `/` and served as `/login`;
//! - an absolute-form target: its authority *is* the host (RFC 9112 §3.2.2), so routes match on
//!   it and the upstream gets it as `Host` with an origin-form target;
//! - a `Host` that is not `host[:digits]` or `[IPv6][:digits]`: 400 (nginx cuts at the first
//!   colon and would route `admin.example.com:abc` to the admin vhost);
//! - an HTTP/2 request names its host in `:authority` (the URI authority), usually without a
//!   `Host`: the authority is the host, and a `Host` beside it must agree (RFC 9113 §8.3.1);
//! - an HTTP/1.1 request without `Host` (and not absolute-form): 400 (RFC 9112 §3.2);
//! - a path with a dot segment or a backslash (raw or encoded), which apps resolve differently
//!   ([`crate::request::path::ambiguous`]): 400;
//! - a field value with leading or trailing whitespace: HTTP/1 parsing drops it, HTTP/2 makes
//!   such a field malformed (RFC 9113 §8.2.1) but Pingora's h2 passes it on, so a key header
//!   `" k1"` would be a bucket apart from `"k1"`: 400;
//! - `Content-Length: 5, 5` (or two equal lines): forwarded as one `Content-Length: 5`, so a
//!   lenient upstream cannot read the list differently (request smuggling);
//! - `Connection` naming a header the request carries (`Connection: close, X-Api-Key`): Pingora
//!   would strip that header from what the app gets (RFC 9110 §7.6.1), after the limiter keyed
//!   the request by it, so the app would see another identity than the one counted (the key,
//!   the `Cookie`, the `Authorization`); only connection options stay in `Connection`
//!   (`connection_options_only`) and the named header is forwarded like any other (a token
//!   naming one of Pingora's own headers, `X-Forwarded-For`, used to be a `400` and an ERROR
//!   line per request: a client could fill the process log's budget).

use http::header::{CONNECTION, CONTENT_LENGTH, HOST};
use http::{Method, Version};
use pingora::http::RequestHeader;

/// Why a request is refused before it is counted (all but the last before routing); every
/// variant is answered `400 Bad Request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// The method has bytes other than `A-Z`, `-`, `_`.
    #[error("method must be upper-case")]
    Method,
    /// The target is neither `/…`, `http(s)://…` nor `*` with OPTIONS.
    #[error("request-target must be origin-form (/path) or absolute-form (http://host/path)")]
    Target,
    /// The Host (header or absolute-form authority) is not `host[:port]`.
    #[error("invalid host")]
    Host,
    /// HTTP/1.1 without a Host.
    #[error("HTTP/1.1 request without Host")]
    MissingHost,
    /// `Content-Length` values that are not all the same number.
    #[error("invalid Content-Length")]
    ContentLength,
    /// A part of the route's key named twice: its header on more than one line, or its query
    /// parameter or cookie twice with different values. The bucket would be one value's and
    /// the app may read another (see [`crate::keys::canonical`]).
    #[error("the route's key is given twice with different values")]
    AmbiguousKey,
    /// A path with a `.` or `..` segment (decoded, `;parameters` dropped) or a backslash: apps
    /// disagree on what it names (see [`crate::request::path`]).
    #[error("the path has a dot segment or a backslash")]
    Path,
    /// A field value with leading or trailing whitespace: malformed in HTTP/2 (RFC 9113
    /// §8.2.1), and never sent by an HTTP/1 parser, which drops it. Read as sent, `" k1"` and
    /// `"k1"` would be two identities of one client.
    #[error("a field value has leading or trailing whitespace")]
    FieldWhitespace,
    /// Method overrides naming two different methods (`DELETE, GET`): apps differ on which
    /// they serve, so no one route is right (see [`crate::request::method_override`]).
    #[error("{0}")]
    MethodOverride(#[from] crate::request::method_override::AmbiguousOverride),
    /// The request's `cost` is malformed, given twice, over `max_cost` or over every window.
    #[error("{0}")]
    Cost(#[from] crate::request::cost::CostError),
}

/// A request that passed the checks: the host routes match on and, for absolute-form, the
/// authority to forward as `Host`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestForm {
    /// Lower-case host without port or trailing dot; `None` for HTTP/1.0 without one.
    pub host: Option<String>,
    /// The authority of an absolute-form target, as sent: becomes the upstream `Host`.
    pub absolute_authority: Option<String>,
}

/// Read and check the request head's form and normalise `Content-Length` in place.
pub fn parse(req: &mut RequestHeader) -> Result<RequestForm, BadRequest> {
    if !valid_method(&req.method) {
        return Err(BadRequest::Method);
    }
    let target = req.raw_path();
    let mut form = RequestForm::default();
    if let Some(authority) = absolute_authority(target) {
        let authority = std::str::from_utf8(authority).map_err(|_| BadRequest::Host)?;
        form.host = Some(host_of(authority).ok_or(BadRequest::Host)?);
        form.absolute_authority = Some(authority.to_string());
    } else {
        let asterisk = target == b"*" && req.method == Method::OPTIONS;
        if !target.starts_with(b"/") && !asterisk {
            return Err(BadRequest::Target);
        }
        form.host = authority_host(req)?;
        if form.host.is_none() && req.version == Version::HTTP_11 {
            return Err(BadRequest::MissingHost);
        }
    }
    if crate::request::path::ambiguous(req.uri.path()) {
        return Err(BadRequest::Path);
    }
    if req.headers.values().any(|v| padded(v.as_bytes())) {
        return Err(BadRequest::FieldWhitespace);
    }
    normalize_content_length(req)?;
    connection_options_only(req);
    Ok(form)
}

/// The tokens `Connection` keeps: connection options.
const CONNECTION_OPTIONS: [&str; 5] = ["close", "keep-alive", "upgrade", "te", "http2-settings"];

/// Drop from `Connection` every token but a connection option: a header it named then goes to
/// the app as the limiter read it.
fn connection_options_only(req: &mut RequestHeader) {
    let values = req.headers.get_all(CONNECTION);
    let tokens = || {
        (values.iter())
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|t| t.trim_ascii())
            .filter(|t| !t.is_empty())
    };
    let option = |t: &[u8]| {
        CONNECTION_OPTIONS
            .iter()
            .any(|o| t.eq_ignore_ascii_case(o.as_bytes()))
    };
    if tokens().all(option) {
        return;
    }
    let kept: Vec<&[u8]> = tokens().filter(|t| option(t)).collect();
    let value = kept.join(&b", "[..]);
    let value = http::HeaderValue::from_bytes(&value).ok();
    let _ = req.remove_header(&CONNECTION);
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        let _ = req.insert_header(CONNECTION, v);
    }
}

/// The host of an origin-form request: its `Host`, else its URI authority (HTTP/2's
/// `:authority`, which h2 clients send instead of `Host`). When both are present they must name
/// the same host (RFC 9113 §8.3.1); Pingora refuses most disagreements already, but the route a
/// request matches must never depend on which of the two is read.
fn authority_host(req: &RequestHeader) -> Result<Option<String>, BadRequest> {
    let header = match req.headers.get(HOST) {
        Some(h) => Some(h.to_str().map_err(|_| BadRequest::Host)?),
        None => None,
    };
    let authority = req.uri.authority().map(|a| a.as_str());
    let host = |value: &str| host_of(value).ok_or(BadRequest::Host);
    match (header, authority) {
        (Some(h), Some(a)) if !h.eq_ignore_ascii_case(a) => Err(BadRequest::Host),
        (Some(value), _) | (None, Some(value)) => host(value).map(Some),
        (None, None) => Ok(None),
    }
}

/// Does a field value begin or end with SP or HTAB?
fn padded(v: &[u8]) -> bool {
    let ows = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    ows(v.first()) || ows(v.last())
}

/// Upper-case letters, `-` and `_` only (what nginx accepts in a method).
fn valid_method(m: &Method) -> bool {
    let s = m.as_str().as_bytes();
    !s.is_empty()
        && s.iter()
            .all(|b| b.is_ascii_uppercase() || *b == b'-' || *b == b'_')
}

/// The authority of an absolute-form target (`http://` or `https://`, any case), if it is one.
fn absolute_authority(target: &[u8]) -> Option<&[u8]> {
    let rest = [&b"http://"[..], b"https://"].iter().find_map(|scheme| {
        let head = target.get(..scheme.len())?;
        head.eq_ignore_ascii_case(scheme)
            .then(|| &target[scheme.len()..])
    })?;
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The host routes match on, from a `Host` value or an authority: `host[:digits]` or
/// `[IPv6][:digits]`, lower-cased, without port or trailing dot; `None` if malformed.
pub fn host_of(value: &str) -> Option<String> {
    let port_ok = |p: &[u8]| p.iter().all(|b| b.is_ascii_digit());
    if let Some(rest) = value.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        let after = after.as_bytes();
        let port_ok = after.is_empty() || after.strip_prefix(b":").is_some_and(port_ok);
        return port_ok.then(|| v6.to_ascii_lowercase());
    }
    // One pass over the bytes (this runs on every request): the host ends at the first ':'.
    let bytes = value.as_bytes();
    let (host, port) = match bytes.iter().position(|&b| b == b':') {
        Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
        None => (bytes, None),
    };
    if port.is_some_and(|p| !port_ok(p)) {
        return None;
    }
    let host = host_name(host)?;
    // `host` is a prefix of `value`, ending before an ASCII byte or at the end.
    Some(value[..host.len()].to_ascii_lowercase())
}

/// A host name as routes compare it: `name` without one trailing dot, if it is letters, digits,
/// '-', '_' and dots between non-empty labels (what DNS names and IPv4 literals use); `None`
/// otherwise. '/', '\\', '@', '%' and ".." would let one Host mean two things. The request side
/// ([`host_of`]) and the config's `host` ([`crate::config::HostMatch::parse`]) both check here,
/// so a configured host is always one a request can name.
pub fn host_name(name: &[u8]) -> Option<&[u8]> {
    let name = name.strip_suffix(b".").unwrap_or(name);
    let mut label_empty = true;
    for &b in name {
        if b == b'.' {
            if label_empty {
                return None;
            }
            label_empty = true;
        } else if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            label_empty = false;
        } else {
            return None;
        }
    }
    // Empty, or ending in an empty label, names no host.
    (!label_empty).then_some(name)
}

/// Collapse `Content-Length: 5, 5` (or several equal lines) to one value; refuse values that
/// are not all the same number (Pingora refuses most of those already).
fn normalize_content_length(req: &mut RequestHeader) -> Result<(), BadRequest> {
    let values = req.headers.get_all(CONTENT_LENGTH);
    let mut iter = values.iter();
    let (Some(first), second) = (iter.next(), iter.next()) else {
        return Ok(());
    };
    if second.is_none() && !first.as_bytes().contains(&b',') {
        return Ok(());
    }
    let mut value: Option<u64> = None;
    for v in values {
        for token in v.as_bytes().split(|b| *b == b',') {
            let token = std::str::from_utf8(token).map_err(|_| BadRequest::ContentLength)?;
            let token = token.trim_matches([' ', '\t']);
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BadRequest::ContentLength);
            }
            let n: u64 = token.parse().map_err(|_| BadRequest::ContentLength)?;
            if value.is_some_and(|v| v != n) {
                return Err(BadRequest::ContentLength);
            }
            value = Some(n);
        }
    }
    let n = value.ok_or(BadRequest::ContentLength)?;
    req.insert_header(CONTENT_LENGTH, n.to_string())
        .map_err(|_| BadRequest::ContentLength)
}

/// The path routes match on, before normalisation: for an absolute-form target Pingora keeps
/// only the path in the URI; `OPTIONS *` is matched as `/` (it asks about the server itself).
pub fn match_path(req: &RequestHeader) -> &str {
    if req.raw_path() == b"*" {
        return "/";
    }
    req.uri.path()
}

/// Make the upstream request say what was matched: an absolute-form target is sent in
/// origin-form with its authority as `Host` (nginx does the same). A request that named no host
/// at all (HTTP/1.0 allows that; HTTP/1.1 upstreams must get one, RFC 9112 §3.2) goes with
/// `Host: <upstream name>`, as nginx sends its `$proxy_host`, when that name is a valid host.
pub fn forward(
    form: &RequestForm,
    upstream: &mut RequestHeader,
    upstream_name: &str,
) -> pingora::Result<()> {
    if let Some(authority) = &form.absolute_authority {
        let pq = upstream
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let pq = if pq.starts_with('/') {
            pq
        } else {
            format!("/{pq}")
        };
        upstream.set_raw_path(pq.as_bytes())?;
        upstream.insert_header(HOST, authority.as_str())?;
    }
    let named = upstream.headers.contains_key(HOST) || upstream.uri.authority().is_some();
    if !named && host_name(upstream_name.as_bytes()).is_some_and(|h| h.len() == upstream_name.len())
    {
        upstream.insert_header(HOST, upstream_name)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "form_tests.rs"]
mod tests;
