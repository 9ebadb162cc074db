//! Who is the client? Client address resolution (`X-Forwarded-For` from trusted proxies only),
//! how a route groups clients ([`KeySpec`]: its text in the config, its JSON in the admin API, the
//! client it picks from a request or from an admin query) and the bucket key a request is
//! counted under.
//!
//! A new kind of key is a new [`KeySpec`] variant and its arms here; the config parses it through
//! [`FromStr`], the admin API and page read it through [`Display`](std::fmt::Display) and
//! [`Serialize`].

use std::fmt::Write as _;
use std::net::IpAddr;
use std::str::FromStr;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use serde::ser::{Serialize, SerializeStruct, Serializer};

/// Header values longer than this, or with bytes outside `is_plain`, are replaced by a hash so
/// that key material stays bounded whatever a client sends.
pub const MAX_PLAIN_KEY_LEN: usize = 64;

/// Resolves the client address of a request.
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
}

impl ClientIpResolver {
    /// A resolver that believes `X-Forwarded-For` only from peers inside `trusted`.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        ClientIpResolver { trusted }
    }

    /// Is `ip` inside `trusted_proxies`?
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address. When the socket peer is a trusted proxy, walk `X-Forwarded-For`
    /// from the right and return the first address that is not trusted: entries to its left
    /// were written by the client itself and prove nothing. If every hop is trusted, the
    /// left-most one is the client; an unparsable entry ends the walk at the last good hop.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        // Several X-Forwarded-For lines are one list, in order.
        let values: Vec<&[u8]> = headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        for value in values.iter().rev() {
            for hop in value.rsplit(|b| *b == b',') {
                let Some(ip) = parse_hop(hop) else {
                    return client;
                };
                client = ip;
                if !self.is_trusted(ip) {
                    return ip;
                }
            }
        }
        client
    }
}

/// One `X-Forwarded-For` element: an IP, optionally `[v6]` or with a `:port`.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(hop).ok()?.trim();
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    s.rsplit_once(':').and_then(|(ip, _port)| ip.parse().ok())
}

/// Bytes kept verbatim in a key; anything else (including `{`, `}` which would break Redis
/// Cluster hash tags, and `#` which marks hashed values) forces hashing.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'@' | b'=' | b'+' | b'/')
}

/// Who a bucket belongs to, as far as the key is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketClient<'a> {
    /// The route-wide bucket (`key = "global"`).
    Global,
    /// A client address (`key = "client_ip"`, or a header key whose header is missing).
    Ip(IpAddr),
    /// A non-empty header value (`key = "header:<Name>"`), as sent.
    Header(&'a [u8]),
}

/// Write the bucket key of `client` on `route` into `out` (cleared first):
/// `<route>:<kind>:<value>`.
///
/// `ip:<addr>` for client addresses, `h:<value>` for header values, `h:#<xxh3-128 hex>` for
/// header values that are long or contain unusual bytes, and `global` for the route-wide bucket.
/// The result is at most route name + 3 + [`MAX_PLAIN_KEY_LEN`] bytes. The proxy (through
/// [`bucket_key`]) and the admin inspector both build keys here, so they always agree.
pub fn write_bucket_key(out: &mut String, route: &str, client: BucketClient<'_>) {
    out.clear();
    // Sized before the first push: a key grown push by push reallocates several times, and
    // this runs on every limited request.
    match client {
        BucketClient::Global => {
            out.reserve(route.len() + ":global".len());
            out.push_str(route);
            out.push_str(":global");
        }
        BucketClient::Header(bytes) => {
            // The longer of a plain value and `#` + 32 hex digits.
            out.reserve(route.len() + ":h:".len() + MAX_PLAIN_KEY_LEN.max(33));
            out.push_str(route);
            out.push_str(":h:");
            if bytes.len() <= MAX_PLAIN_KEY_LEN && bytes.iter().all(|b| is_plain(*b)) {
                // Plain bytes are ASCII, so this cannot fail.
                out.push_str(std::str::from_utf8(bytes).unwrap_or_default());
            } else {
                let _ = write!(out, "#{:032x}", xxhash_rust::xxh3::xxh3_128(bytes));
            }
        }
        BucketClient::Ip(ip) => {
            let text = IpText::new(ip);
            out.reserve(route.len() + ":ip:".len() + text.as_bytes().len());
            out.push_str(route);
            out.push_str(":ip:");
            out.push_str(text.as_str());
        }
    }
}

/// Append `ip` as `Display` would write it; see [`IpText`].
pub fn push_ip(out: &mut String, ip: IpAddr) {
    out.push_str(IpText::new(ip).as_str());
}

/// An address written as `Display` writes it, on the stack: no allocation, and IPv4, by far the
/// common case, is written digit by digit (`fmt` machinery costs about 1,500 instructions per
/// address, this under 100).
pub struct IpText {
    buf: [u8; IpText::MAX_LEN],
    len: usize,
}

impl IpText {
    /// The longest text of an address (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
    const MAX_LEN: usize = 45;

    /// Write `ip`.
    pub fn new(ip: IpAddr) -> Self {
        let mut text = IpText {
            buf: [0; Self::MAX_LEN],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(v6) => {
                // Cannot fail: no IPv6 text is longer than MAX_LEN.
                let _ = write!(text, "{v6}");
            }
        }
        text
    }

    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // SAFETY: only whole `str`s and ASCII digits and dots are ever written (`write_str`
        // refuses what does not fit whole), so the bytes are UTF-8; checking them again costs
        // more than writing an IPv4 address.
        unsafe { std::str::from_utf8_unchecked(&self.buf[..self.len]) }
    }

    /// The text as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// How a route groups requests into buckets: the `key` of a `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// `client_ip`: the client address (see [`ClientIpResolver`]).
    ClientIp,
    /// `header:<Name>`: the value of a request header; requests without it are keyed by client
    /// address.
    Header(HeaderName),
    /// `global`: one bucket for every client.
    Global,
}

/// Why a `key` text names no [`KeySpec`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    /// `header:<Name>` with a name that is not a header name.
    #[error("invalid header name {0:?}")]
    HeaderName(String),
    /// None of the known kinds.
    #[error("unknown key {0:?}; expected \"client_ip\", \"global\" or \"header:<Name>\"")]
    Unknown(String),
}

impl FromStr for KeySpec {
    type Err = KeySpecError;

    fn from_str(text: &str) -> Result<KeySpec, KeySpecError> {
        match text {
            "client_ip" => Ok(KeySpec::ClientIp),
            "global" => Ok(KeySpec::Global),
            other => match other.strip_prefix("header:") {
                Some(h) => HeaderName::from_bytes(h.as_bytes())
                    .map(KeySpec::Header)
                    .map_err(|_| KeySpecError::HeaderName(h.to_string())),
                None => Err(KeySpecError::Unknown(other.to_string())),
            },
        }
    }
}

/// The text as configured; header names are case-insensitive and written lower-case.
impl std::fmt::Display for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySpec::ClientIp => f.write_str("client_ip"),
            KeySpec::Header(name) => write!(f, "header:{name}"),
            KeySpec::Global => f.write_str("global"),
        }
    }
}

/// As JSON for the admin API, so the page never parses the text: `{"kind":"client_ip"}`,
/// `{"kind":"header","name":"x-api-key"}`, `{"kind":"global"}`.
impl Serialize for KeySpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (kind, name) = match self {
            KeySpec::ClientIp => ("client_ip", None),
            KeySpec::Header(name) => ("header", Some(name.as_str())),
            KeySpec::Global => ("global", None),
        };
        let mut out = s.serialize_struct("KeySpec", 1 + usize::from(name.is_some()))?;
        out.serialize_field("kind", kind)?;
        if let Some(name) = name {
            out.serialize_field("name", name)?;
        }
        out.end()
    }
}

/// Why an admin query's `client` names no bucket of a route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientQueryError {
    /// A `global` route was given a client.
    #[error("keys globally: leave \"client\" empty")]
    NotEmpty,
    /// A `client_ip` route was given something else than an address.
    #[error("keys by client IP: \"client\" must be an IP address")]
    NotAnIp,
    /// A `header:<Name>` route was given no value.
    #[error("keys by header {0}: \"client\" must be its value")]
    NoHeaderValue(HeaderName),
}

impl KeySpec {
    /// The client a request is counted as. A request without the header of a `header:<Name>`
    /// key is keyed by its client address, so those requests are never pooled into one shared
    /// bucket nor left unlimited.
    pub fn client_of_request<'a>(&self, headers: &'a HeaderMap, ip: IpAddr) -> BucketClient<'a> {
        match self {
            KeySpec::Global => BucketClient::Global,
            KeySpec::Header(name) => match headers.get(name) {
                Some(v) if !v.is_empty() => BucketClient::Header(v.as_bytes()),
                _ => BucketClient::Ip(ip),
            },
            KeySpec::ClientIp => BucketClient::Ip(ip),
        }
    }

    /// The client an admin query's `client` parameter names (the inspector and reset).
    pub fn client_of_query<'a>(
        &self,
        client: &'a str,
    ) -> Result<BucketClient<'a>, ClientQueryError> {
        match self {
            KeySpec::Global if client.is_empty() => Ok(BucketClient::Global),
            KeySpec::Global => Err(ClientQueryError::NotEmpty),
            KeySpec::ClientIp => client
                .trim()
                .parse()
                .map(BucketClient::Ip)
                .map_err(|_| ClientQueryError::NotAnIp),
            KeySpec::Header(name) if client.is_empty() => {
                Err(ClientQueryError::NoHeaderValue(name.clone()))
            }
            KeySpec::Header(_) => Ok(BucketClient::Header(client.as_bytes())),
        }
    }
}

/// Write the bucket key for a request into `out` (cleared first); see [`write_bucket_key`] and
/// [`KeySpec::client_of_request`].
pub fn bucket_key(
    out: &mut String,
    route: &str,
    spec: &KeySpec,
    headers: &HeaderMap,
    client: IpAddr,
) {
    write_bucket_key(out, route, spec.client_of_request(headers, client));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn push_ip_writes_what_display_writes() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "255.255.255.255",
            "10.20.3.4",
            "::1",
            "2001:db8::7",
            "::ffff:255.255.255.255",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "1:2:3:4:5:6:7:8",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = String::from("x");
            push_ip(&mut out, ip);
            assert_eq!(out, format!("x{ip}"));
        }
    }

    #[test]
    fn untrusted_peer_ignores_xff() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(r.resolve(peer, &headers(&["1.2.3.4"])), peer);
    }

    #[test]
    fn trusted_peer_takes_rightmost_untrusted() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        // The client forged 6.6.6.6 on the left; 203.0.113.9 is what our proxy saw.
        let got = r.resolve(peer, &headers(&["6.6.6.6, 203.0.113.9", "10.1.1.1"]));
        assert_eq!(got, "203.0.113.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn garbage_hop_stops_at_last_good() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let got = r.resolve(peer, &headers(&["nonsense, 10.2.2.2"]));
        assert_eq!(got, "10.2.2.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn long_header_values_are_hashed_and_bounded() {
        let spec = KeySpec::Header(http::HeaderName::from_static("x-api-key"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "a".repeat(10_000).parse().unwrap());
        let mut out = String::new();
        bucket_key(&mut out, "api", &spec, &h, "127.0.0.1".parse().unwrap());
        assert!(
            out.starts_with("api:h:#") && out.len() == "api:h:#".len() + 32,
            "{out}"
        );
        h.insert("x-api-key", "{tag}".parse().unwrap());
        bucket_key(&mut out, "api", &spec, &h, "127.0.0.1".parse().unwrap());
        assert!(!out.contains('{'), "{out}");
    }

    #[test]
    fn key_text_round_trips_and_header_names_are_lower_cased() {
        for text in ["client_ip", "global", "header:x-api-key"] {
            assert_eq!(text.parse::<KeySpec>().unwrap().to_string(), text);
        }
        let spec: KeySpec = "header:X-Api-Key".parse().unwrap();
        assert_eq!(spec.to_string(), "header:x-api-key");
        assert_eq!(
            "cookie:session".parse::<KeySpec>(),
            Err(KeySpecError::Unknown("cookie:session".into()))
        );
        assert_eq!(
            "header:X Api Key".parse::<KeySpec>(),
            Err(KeySpecError::HeaderName("X Api Key".into()))
        );
    }

    #[test]
    fn key_json_names_the_kind() {
        let json = |text: &str| serde_json::to_string(&text.parse::<KeySpec>().unwrap()).unwrap();
        assert_eq!(json("client_ip"), r#"{"kind":"client_ip"}"#);
        assert_eq!(json("global"), r#"{"kind":"global"}"#);
        assert_eq!(
            json("header:X-Api-Key"),
            r#"{"kind":"header","name":"x-api-key"}"#
        );
    }

    #[test]
    fn admin_queries_name_the_client_their_kind_takes() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(
            KeySpec::Global.client_of_query(""),
            Ok(BucketClient::Global)
        );
        assert_eq!(
            KeySpec::Global.client_of_query("x"),
            Err(ClientQueryError::NotEmpty)
        );
        assert_eq!(
            KeySpec::ClientIp.client_of_query(" 192.0.2.7 "),
            Ok(BucketClient::Ip(ip))
        );
        assert_eq!(
            KeySpec::ClientIp.client_of_query("nope"),
            Err(ClientQueryError::NotAnIp)
        );
        let header = KeySpec::Header(http::HeaderName::from_static("x-api-key"));
        assert_eq!(
            header.client_of_query("k1"),
            Ok(BucketClient::Header(b"k1"))
        );
        assert!(matches!(
            header.client_of_query(""),
            Err(ClientQueryError::NoHeaderValue(_))
        ));
    }

    #[test]
    fn missing_header_falls_back_to_client_ip() {
        let spec = KeySpec::Header(http::HeaderName::from_static("x-api-key"));
        let mut out = String::new();
        bucket_key(
            &mut out,
            "api",
            &spec,
            &HeaderMap::new(),
            "192.0.2.7".parse().unwrap(),
        );
        assert_eq!(out, "api:ip:192.0.2.7");
    }
}
