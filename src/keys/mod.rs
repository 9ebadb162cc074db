//! Who is the client? How a route groups clients ([`KeySpec`]: its text in the config, its JSON
//! in the admin API, the client it picks from a request or from an admin query) and the bucket
//! key a request is counted under; the client address (`client_ip.rs`: `X-Forwarded-For` from
//! trusted proxies only) and addresses written without allocating (`ip_text.rs`).
//!
//! A new kind of key is a new [`KeySpec`] variant and its arms here; the config parses it through
//! [`FromStr`], the admin API and page read it through [`Display`](std::fmt::Display) and
//! [`Serialize`].

use std::fmt::Write as _;
use std::net::IpAddr;
use std::str::FromStr;

use http::{HeaderMap, HeaderName};
use serde::ser::{Serialize, SerializeStruct, Serializer};

pub use client_ip::{canonical_net, ClientIpResolver, KeyPrefixes};
pub use ip_text::{push_ip, IpText};

mod client_ip;
mod ip_text;

/// Header values longer than this, or with bytes outside `is_plain`, are replaced by a hash so
/// that key material stays bounded whatever a client sends.
pub const MAX_PLAIN_KEY_LEN: usize = 64;

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

    /// Does `headers` repeat the header this key reads? Then the request has no one client:
    /// it is refused (400, as for a repeated `Host`) rather than counted under its first line
    /// while the app, as most do, reads the lines joined (`a,b`), so that a client could vary
    /// the second line and keep one bucket while the app saw a new key each time.
    pub fn repeats_header(&self, headers: &HeaderMap) -> bool {
        match self {
            KeySpec::Header(name) => headers.get_all(name).iter().nth(1).is_some(),
            KeySpec::ClientIp | KeySpec::Global => false,
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

    #[test]
    fn only_a_repeated_key_header_repeats() {
        let mut h = HeaderMap::new();
        h.append("x-api-key", "a".parse().unwrap());
        h.append("x-other", "1".parse().unwrap());
        h.append("x-other", "2".parse().unwrap());
        let spec: KeySpec = "header:X-Api-Key".parse().unwrap();
        assert!(!spec.repeats_header(&h));
        assert!(!KeySpec::ClientIp.repeats_header(&h));
        assert!(!"header:x-other"
            .parse::<KeySpec>()
            .unwrap()
            .repeats_header(&HeaderMap::new()));
        assert!("header:x-other"
            .parse::<KeySpec>()
            .unwrap()
            .repeats_header(&h));
        h.append("x-api-key", "b".parse().unwrap());
        assert!(spec.repeats_header(&h));
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
