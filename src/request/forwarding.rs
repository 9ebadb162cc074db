//! The headers that tell the upstream who the client is and how it connected.
//!
//! An app behind a proxy believes these headers (Django's `SECURE_PROXY_SSL_HEADER`, Werkzeug's
//! `ProxyFix`, Rails' `request.ssl?`), so a client must not be able to set them through us:
//!
//! | header | sent upstream |
//! |---|---|
//! | `X-Forwarded-For` | every line the client sent, joined, then the socket peer (nginx's `$proxy_add_x_forwarded_for`) |
//! | `X-Forwarded-Proto` | the listener's scheme; a client's value is kept only from a peer in `trusted_proxies` |
//! | `X-Real-IP` | the resolved client address; a client's value is never passed on |
//! | `Forwarded` (RFC 7239) | from a trusted peer: its value plus our hop; otherwise only our hop |
//! | `X-Forwarded-Host`, `-Port`, `-Prefix`, `-Ssl`, `X-Original-URL`, `X-Rewrite-URL` | from a trusted peer: as sent; otherwise removed |
//!
//! The last row is what Werkzeug's `ProxyFix`, Spring's `ForwardedHeaderFilter` and IIS-style
//! rewrites read to rebuild the URL the client asked for: from any client they would let it name
//! another host, port or path than the one routed and limited (`http://evil.example:443/evil/x`).
//! Removed rather than set: without them an app falls back to `Host` and the path, which are
//! what slidegate routed on.

use std::net::IpAddr;

use http::header::{GetAll, FORWARDED};
use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use pingora::{ErrorType, OrErr, Result};

use super::additions::ForwardedHeader::{Forwarded, XForwardedFor, XForwardedProto, XRealIp};
use super::additions::ForwardedHeaders;
use crate::keys::IpText;

/// How the client reached this listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain TCP (HTTP/1.1 or h2c).
    Http,
    /// TLS (HTTP/1.1 or HTTP/2).
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The same, as a header value built without copying.
    fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }
}

/// What is known about the connection a request came in on.
#[derive(Debug, Clone, Copy)]
pub struct Hop {
    /// The socket peer.
    pub peer: IpAddr,
    /// The client address after trusted `X-Forwarded-For` hops (the rate-limit key's address).
    pub client: IpAddr,
    /// Is the peer inside `trusted_proxies`?
    pub peer_trusted: bool,
    /// The listener's scheme.
    pub scheme: Scheme,
}

/// `X-Forwarded-For`, as a map key: looking up by a `HeaderName` skips parsing the name.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`, as a map key.
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Real-IP`, as a map key.
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Headers that rebuild the client's URL, believed only from `trusted_proxies` (see the table).
const TRUSTED_ONLY: [HeaderName; 6] = [
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
];

/// The values of a connection's own hop, which depend only on its peer and scheme: built at
/// the first request of a connection and cloned (a reference count) by the following ones,
/// instead of being formatted and allocated for every request.
#[derive(Debug)]
pub struct OwnHop {
    peer: IpAddr,
    scheme: Scheme,
    /// The peer's address as text: `X-Forwarded-For` without a prior list, `X-Real-IP` of a
    /// direct client.
    addr: HeaderValue,
    /// `Forwarded` without a prior list: `for=<peer>;proto=<scheme>`.
    forwarded: HeaderValue,
}

impl OwnHop {
    /// The values for a connection from `peer` on a listener of `scheme`.
    pub fn new(peer: IpAddr, scheme: Scheme) -> Result<OwnHop> {
        let text = IpText::new(peer);
        Ok(OwnHop {
            peer,
            scheme,
            addr: value(text.as_bytes().to_vec())?,
            forwarded: value(forwarded(None, peer, text.as_bytes(), scheme))?,
        })
    }

    /// Were these values built for the connection `hop` came in on?
    fn serves(&self, hop: &Hop) -> bool {
        self.peer == hop.peer && self.scheme == hop.scheme
    }
}

/// Rewrite the forwarding headers of a request about to go upstream: those in `set`
/// (`server.forwarded_headers`) are set, the others removed; `own` are the values of its
/// connection's hop if the connection keeps them (see [`OwnHop`]).
///
/// Runs on every proxied request, so a value that is not `own`'s is built in a `Vec` of
/// exactly its length, which becomes the [`HeaderValue`] without a copy (from a `Vec` whose
/// length is not its capacity, `Bytes` allocates a second block), and addresses are written
/// with [`IpText`] rather than `fmt`. The names are `&'static str` so that Pingora's
/// case-preserving map does not copy them.
pub fn apply(
    req: &mut RequestHeader,
    hop: &Hop,
    own: Option<&OwnHop>,
    set: ForwardedHeaders,
) -> Result<()> {
    let own = own.filter(|o| o.serves(hop));
    let fresh;
    let peer = match own {
        Some(o) => o.addr.as_bytes(),
        None => {
            fresh = IpText::new(hop.peer);
            fresh.as_bytes()
        }
    };
    let wanted = |h| set.contains(h);
    let xff = (wanted(XForwardedFor).then(|| xff_value(req, own, peer))).transpose()?;
    let forwarded =
        (wanted(Forwarded).then(|| forwarded_value(req, hop, own, peer))).transpose()?;
    let real_ip = (wanted(XRealIp).then(|| real_ip_value(hop, own, peer))).transpose()?;
    // X-Forwarded-Proto: only a trusted proxy in front of us knows the client's scheme.
    let keep_proto = hop.peer_trusted && {
        let mut values = req.headers.get_all(&X_FORWARDED_PROTO).iter();
        matches!(
            (values.next().map(|v| v.as_bytes()), values.next()),
            (Some(b"http" | b"https"), None)
        )
    };
    let proto = match wanted(XForwardedProto) {
        true if keep_proto => Keep,
        true => Set(hop.scheme.header_value()),
        false => Remove,
    };

    // One pass over the names the request has (a few) instead of six removals, each hashing a
    // name the request almost never has.
    if !hop.peer_trusted && req.headers.keys().any(is_trusted_only) {
        for name in &TRUSTED_ONLY {
            req.remove_header(name);
        }
    }
    remove_underscore_spellings(req);
    // Room for what is set, so each of the head's two maps (names, their case) grows once.
    let setting = [
        xff.is_some(),
        matches!(proto, Set(_)),
        real_ip.is_some(),
        forwarded.is_some(),
    ];
    req.reserve(setting.into_iter().filter(|&s| s).count());
    write(
        req,
        &X_FORWARDED_FOR,
        "X-Forwarded-For",
        xff.map_or(Remove, Set),
    )?;
    write(req, &X_FORWARDED_PROTO, "X-Forwarded-Proto", proto)?;
    write(req, &X_REAL_IP, "X-Real-IP", real_ip.map_or(Remove, Set))?;
    write(req, &FORWARDED, "Forwarded", forwarded.map_or(Remove, Set))
}

/// What becomes of one forwarding header.
enum Field {
    /// Replace every field of the name with this value.
    Set(HeaderValue),
    /// Leave what the (trusted) client sent.
    Keep,
    /// Not in `server.forwarded_headers`: remove what a client sent.
    Remove,
}
use Field::{Keep, Remove, Set};

/// Carry out `field` for `name`, spelled `spelled` on HTTP/1 (handed to Pingora as a pair, so
/// the name is neither parsed nor copied: `vendor/pingora-http.patch`).
fn write(
    req: &mut RequestHeader,
    name: &HeaderName,
    spelled: &'static str,
    field: Field,
) -> Result<()> {
    match field {
        Set(v) => req.insert_header((name.clone(), spelled), v),
        Keep => Ok(()),
        Remove => {
            req.remove_header(name);
            Ok(())
        }
    }
}

/// `X-Forwarded-For`: the client's lines (bytes as sent), joined in order, then the peer.
fn xff_value(req: &RequestHeader, own: Option<&OwnHop>, peer: &[u8]) -> Result<HeaderValue> {
    let prior = req.headers.get_all(&X_FORWARDED_FOR);
    if let (Some(o), None) = (own, prior.iter().next()) {
        return Ok(o.addr.clone());
    }
    let mut xff = Vec::with_capacity(joined_len(&prior) + peer.len());
    for prev in &prior {
        xff.extend_from_slice(prev.as_bytes());
        xff.extend_from_slice(b", ");
    }
    xff.extend_from_slice(peer);
    value(xff)
}

/// `Forwarded`: our hop appended to a trusted proxy's list, else the list started at us.
fn forwarded_value(
    req: &RequestHeader,
    hop: &Hop,
    own: Option<&OwnHop>,
    peer: &[u8],
) -> Result<HeaderValue> {
    let prior = hop.peer_trusted.then(|| req.headers.get_all(FORWARDED));
    match own {
        Some(o) if prior.as_ref().is_none_or(|p| p.iter().next().is_none()) => {
            Ok(o.forwarded.clone())
        }
        _ => value(forwarded(prior.as_ref(), hop.peer, peer, hop.scheme)),
    }
}

/// `X-Real-IP`: always ours, the resolved client.
fn real_ip_value(hop: &Hop, own: Option<&OwnHop>, peer: &[u8]) -> Result<HeaderValue> {
    match own {
        _ if hop.client != hop.peer => value(IpText::new(hop.client).as_bytes().to_vec()),
        Some(o) => Ok(o.addr.clone()),
        None => value(peer.to_vec()),
    }
}

/// A forwarding header spelled with `_` for `-` (`X_Forwarded_Host`, `X_Real_IP`): CGI-style
/// servers (wsgiref, uWSGI, PHP's CGI) read it as the header itself, so from any peer it would
/// be a forged forwarding header past the rules above; removed, as nginx drops every header
/// with `_` by default (`underscores_in_headers off`).
fn remove_underscore_spellings(req: &mut RequestHeader) {
    let forged = |name: &HeaderName| {
        let s = name.as_str();
        s.contains('_') && {
            let dashed = s.replace('_', "-");
            [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_REAL_IP]
                .into_iter()
                .chain(&TRUSTED_ONLY)
                .any(|h| h.as_str() == dashed)
        }
    };
    let names: Vec<HeaderName> = req.headers.keys().filter(|n| forged(n)).cloned().collect();
    for name in &names {
        req.remove_header(name);
    }
}

/// Is `name` one of [`TRUSTED_ONLY`]? They all start `x-`, which most names do not.
fn is_trusted_only(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-") && TRUSTED_ONLY.contains(name)
}

/// The `Forwarded` value: `prior` (a trusted proxy's list) joined, then our hop, from `peer`
/// whose text is `text`.
fn forwarded(
    prior: Option<&GetAll<'_, HeaderValue>>,
    peer: IpAddr,
    text: &[u8],
    scheme: Scheme,
) -> Vec<u8> {
    // RFC 7239 §6: an IPv6 node is quoted and bracketed.
    let (open, close): (&[u8], &[u8]) = match peer {
        IpAddr::V6(_) => (b"for=\"[", b"]\""),
        IpAddr::V4(_) => (b"for=", b""),
    };
    let proto = scheme.as_str().as_bytes();
    let ours = open.len() + text.len() + close.len() + b";proto=".len() + proto.len();
    let mut forwarded = Vec::with_capacity(prior.map_or(0, joined_len) + ours);
    for prev in prior.into_iter().flatten() {
        forwarded.extend_from_slice(prev.as_bytes());
        forwarded.extend_from_slice(b", ");
    }
    forwarded.extend_from_slice(open);
    forwarded.extend_from_slice(text);
    forwarded.extend_from_slice(close);
    forwarded.extend_from_slice(b";proto=");
    forwarded.extend_from_slice(proto);
    debug_assert_eq!(forwarded.len(), forwarded.capacity());
    forwarded
}

/// Length of `values` joined, each followed by `", "`.
fn joined_len(values: &GetAll<'_, HeaderValue>) -> usize {
    values.iter().map(|v| v.len() + 2).sum()
}

/// A value built from header values and address text (valid bytes, so this does not fail).
fn value(bytes: Vec<u8>) -> Result<HeaderValue> {
    HeaderValue::try_from(bytes).explain_err(ErrorType::InvalidHTTPHeader, |_| {
        "invalid forwarding header value"
    })
}

#[cfg(test)]
mod tests;
