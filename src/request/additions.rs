//! What slidegate adds to a request it forwards: `server.forwarded_headers` (which of the
//! forwarding headers it sets) and `server.request_id` (whether it gives the request an
//! `X-Request-Id`, and returns it).
//!
//! Each added field is a custom header name that Pingora's `insert_header` parses and copies
//! per request (see docs/benchmarks.md): a deployment whose app reads only `X-Forwarded-For`
//! need not pay for four.

use serde::{Deserialize, Serialize};

/// One of the forwarding headers slidegate writes (see [`crate::request::forwarding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For`: the client's list plus the socket peer.
    XForwardedFor,
    /// `X-Forwarded-Proto`: the listener's scheme.
    XForwardedProto,
    /// `X-Real-IP`: the resolved client address.
    XRealIp,
    /// `Forwarded` (RFC 7239).
    Forwarded,
}

impl ForwardedHeader {
    /// All of them, in the order the docs list them.
    pub const ALL: [ForwardedHeader; 4] = [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::XForwardedProto,
        ForwardedHeader::XRealIp,
        ForwardedHeader::Forwarded,
    ];

    /// The name as `server.forwarded_headers` spells it (lowercase; matched in any case).
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::XForwardedProto => "x-forwarded-proto",
            ForwardedHeader::XRealIp => "x-real-ip",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }

    /// The header named `name`, in any case.
    pub fn parse(name: &str) -> Option<ForwardedHeader> {
        Self::ALL
            .into_iter()
            .find(|h| h.name().eq_ignore_ascii_case(name))
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// `server.forwarded_headers`: the forwarding headers set on every proxied request. One not in
/// the set is removed from the request instead, so a client can never set it through us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardedHeaders(u8);

impl ForwardedHeaders {
    /// None: every forwarding header a client sends is removed, none is added.
    pub const NONE: ForwardedHeaders = ForwardedHeaders(0);

    /// All four (the default).
    pub fn all() -> ForwardedHeaders {
        ForwardedHeader::ALL
            .into_iter()
            .fold(Self::NONE, Self::with)
    }

    /// This set and `h`.
    pub fn with(self, h: ForwardedHeader) -> ForwardedHeaders {
        ForwardedHeaders(self.0 | h.bit())
    }

    /// Is `h` set on requests?
    pub fn contains(self, h: ForwardedHeader) -> bool {
        self.0 & h.bit() != 0
    }
}

impl Default for ForwardedHeaders {
    fn default() -> Self {
        Self::all()
    }
}

/// `server.request_id`: what slidegate does with `X-Request-Id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestIdMode {
    /// Keep a valid incoming id or generate one, send it upstream, return it on every
    /// response (the default).
    #[default]
    On,
    /// The same, but not on responses (Envoy's default).
    Upstream,
    /// Neither add nor check one: a client's field goes upstream as sent (nginx's default).
    Off,
}

impl RequestIdMode {
    /// Does the request get an id (kept or generated)?
    pub fn assigns(self) -> bool {
        self != RequestIdMode::Off
    }

    /// Does the response carry the request's id?
    pub fn echoes(self) -> bool {
        self == RequestIdMode::On
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_any_case_and_the_default_is_all_four() {
        for h in ForwardedHeader::ALL {
            assert_eq!(ForwardedHeader::parse(&h.name().to_uppercase()), Some(h));
            assert!(ForwardedHeaders::default().contains(h));
            assert!(!ForwardedHeaders::NONE.contains(h));
        }
        assert_eq!(ForwardedHeader::parse("x-forwarded-host"), None);
        let one = ForwardedHeaders::NONE.with(ForwardedHeader::XRealIp);
        assert!(one.contains(ForwardedHeader::XRealIp));
        assert!(!one.contains(ForwardedHeader::Forwarded));
    }

    #[test]
    fn request_id_modes() {
        use RequestIdMode::*;
        assert_eq!(
            [On, Upstream, Off].map(|m| (m.assigns(), m.echoes())),
            [(true, true), (true, false), (false, false)]
        );
    }
}
