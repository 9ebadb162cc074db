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

use std::net::IpAddr;

use http::header::{GetAll, FORWARDED};
use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use pingora::Result;

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

/// Rewrite the forwarding headers of a request about to go upstream.
///
/// Runs on every proxied request, so each value is built in a `Vec` of exactly its length,
/// which becomes the [`HeaderValue`] without a copy (from a `Vec` whose length is not its
/// capacity, `Bytes` allocates a second block), and addresses are written with [`IpText`]
/// rather than `fmt`. The names are `&'static str` so that Pingora's case-preserving map does
/// not copy them.
pub fn apply(req: &mut RequestHeader, hop: &Hop) -> Result<()> {
    let peer = IpText::new(hop.peer);

    // X-Forwarded-For: the client's lines (bytes as sent), joined in order, then the peer.
    let prior = req.headers.get_all(&X_FORWARDED_FOR);
    let mut value = Vec::with_capacity(joined_len(&prior) + peer.as_bytes().len());
    for prev in &prior {
        value.extend_from_slice(prev.as_bytes());
        value.extend_from_slice(b", ");
    }
    value.extend_from_slice(peer.as_bytes());
    req.insert_header("X-Forwarded-For", value)?;

    // X-Forwarded-Proto: only a trusted proxy in front of us knows the client's scheme.
    let keep_proto = hop.peer_trusted && {
        let mut values = req.headers.get_all(&X_FORWARDED_PROTO).iter();
        matches!(
            (values.next().map(|v| v.as_bytes()), values.next()),
            (Some(b"http" | b"https"), None)
        )
    };
    if !keep_proto {
        req.insert_header("X-Forwarded-Proto", hop.scheme.header_value())?;
    }

    // X-Real-IP: always ours.
    let client = if hop.client == hop.peer {
        peer.as_bytes().to_vec()
    } else {
        IpText::new(hop.client).as_bytes().to_vec()
    };
    req.insert_header("X-Real-IP", client)?;

    // Forwarded: append our hop to a trusted proxy's list, else start the list at us.
    // RFC 7239 §6: an IPv6 node is quoted and bracketed.
    let (open, close): (&[u8], &[u8]) = match hop.peer {
        IpAddr::V6(_) => (b"for=\"[", b"]\""),
        IpAddr::V4(_) => (b"for=", b""),
    };
    let proto = hop.scheme.as_str().as_bytes();
    let prior = hop.peer_trusted.then(|| req.headers.get_all(FORWARDED));
    let ours = open.len() + peer.as_bytes().len() + close.len() + b";proto=".len() + proto.len();
    let mut forwarded = Vec::with_capacity(prior.as_ref().map_or(0, joined_len) + ours);
    for prev in prior.iter().flatten() {
        forwarded.extend_from_slice(prev.as_bytes());
        forwarded.extend_from_slice(b", ");
    }
    forwarded.extend_from_slice(open);
    forwarded.extend_from_slice(peer.as_bytes());
    forwarded.extend_from_slice(close);
    forwarded.extend_from_slice(b";proto=");
    forwarded.extend_from_slice(proto);
    debug_assert_eq!(forwarded.len(), forwarded.capacity());
    req.insert_header("Forwarded", forwarded)?;
    Ok(())
}

/// Length of `values` joined, each followed by `", "`.
fn joined_len(values: &GetAll<'_, HeaderValue>) -> usize {
    values.iter().map(|v| v.len() + 2).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(peer: &str, trusted: bool, scheme: Scheme) -> Hop {
        let peer: IpAddr = peer.parse().unwrap();
        Hop {
            peer,
            client: peer,
            peer_trusted: trusted,
            scheme,
        }
    }

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        for (k, v) in headers {
            req.append_header(k.to_string(), *v).unwrap();
        }
        req
    }

    fn get<'a>(req: &'a RequestHeader, name: &str) -> Vec<&'a str> {
        req.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn untrusted_peer_cannot_set_scheme_or_real_ip() {
        let mut req = request(&[
            ("X-Forwarded-Proto", "https"),
            ("X-Real-IP", "6.6.6.6"),
            ("Forwarded", "for=6.6.6.6;proto=https"),
        ]);
        apply(&mut req, &hop("203.0.113.7", false, Scheme::Http)).unwrap();
        assert_eq!(get(&req, "x-forwarded-proto"), ["http"]);
        assert_eq!(get(&req, "x-real-ip"), ["203.0.113.7"]);
        assert_eq!(get(&req, "forwarded"), ["for=203.0.113.7;proto=http"]);
        assert_eq!(get(&req, "x-forwarded-for"), ["203.0.113.7"]);
    }

    #[test]
    fn trusted_peer_keeps_scheme_and_forwarded_chain() {
        let mut req = request(&[
            ("X-Forwarded-Proto", "https"),
            ("Forwarded", "for=198.51.100.1;proto=https"),
        ]);
        apply(&mut req, &hop("::1", true, Scheme::Http)).unwrap();
        assert_eq!(get(&req, "x-forwarded-proto"), ["https"]);
        assert_eq!(
            get(&req, "forwarded"),
            ["for=198.51.100.1;proto=https, for=\"[::1]\";proto=http"]
        );
    }

    #[test]
    fn trusted_peer_with_odd_scheme_gets_ours() {
        for bad in [
            &[("X-Forwarded-Proto", "javascript")][..],
            &[
                ("X-Forwarded-Proto", "http"),
                ("X-Forwarded-Proto", "https"),
            ],
        ] {
            let mut req = request(bad);
            apply(&mut req, &hop("10.0.0.1", true, Scheme::Https)).unwrap();
            assert_eq!(get(&req, "x-forwarded-proto"), ["https"], "{bad:?}");
        }
    }
}
