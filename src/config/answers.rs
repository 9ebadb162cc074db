//! What slidegate adds to the answers of a route: `server.server_header` and a route's
//! `response_headers`, parsed once into header names and values.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

/// A route's `response_headers`: fields set on every response of the route, replacing a field
/// of the same name the upstream sent (like nginx's `add_header ... always` after
/// `proxy_hide_header`, or Envoy's `response_headers_to_add` with `OVERWRITE_IF_EXISTS`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResponseHeaders(Vec<ResponseField>);

/// One `response_headers` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseField {
    /// The name, for comparisons.
    pub name: HeaderName,
    /// The name as the file spells it: HTTP/1 sends it so (Pingora keeps the case it is
    /// given; a [`HeaderName`] alone would go out in lower case).
    pub spelled: Bytes,
    /// The value.
    pub value: HeaderValue,
}

impl ResponseHeaders {
    /// The fields, each name once (checked by the validator).
    pub(super) fn new(fields: Vec<ResponseField>) -> Self {
        ResponseHeaders(fields)
    }

    /// Each field, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &ResponseField> {
        self.0.iter()
    }

    /// No field configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why a field may not be a route's `response_headers` entry, or `None` when it may.
///
/// Hop-by-hop fields (RFC 9110 §7.6.1) describe one connection, and HTTP/2 forbids them; the
/// framing fields are the proxy's to write (a wrong `Content-Length` desynchronises the
/// client); `Server` has its own key, so that one place says what it is.
pub fn refused_response_header(name: &HeaderName) -> Option<&'static str> {
    const HOP_BY_HOP: [&str; 6] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    ];
    match name.as_str() {
        "content-length" | "transfer-encoding" => {
            Some("frames the body, which the proxy writes itself")
        }
        "server" => Some("is set by `server.server_header`"),
        n if HOP_BY_HOP.contains(&n) => Some("is hop-by-hop: it describes one connection"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::refused_response_header;
    use http::HeaderName;

    #[test]
    fn framing_hop_by_hop_and_server_fields_are_refused() {
        for name in [
            "Content-Length",
            "transfer-encoding",
            "Connection",
            "Keep-Alive",
            "Proxy-Connection",
            "TE",
            "Trailer",
            "Upgrade",
            "Server",
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(refused_response_header(&name).is_some(), "{name}");
        }
        for name in [
            "Strict-Transport-Security",
            "X-Frame-Options",
            "Cache-Control",
            "Content-Security-Policy",
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(refused_response_header(&name), None, "{name}");
        }
    }
}
