//! Who is the client? How a route groups clients ([`KeySpec`]: its text in the config, its JSON
//! in the admin API, the client it picks from a request or from an admin query) and the bucket
//! key a request is counted under (`bucket.rs`); one identity per value however a client writes
//! it (`canonical.rs`); the parts a key is made of and what each reads
//! from a request (`parts.rs`); the client an admin query names (`query.rs`); the client address
//! (`client_ip.rs`: `X-Forwarded-For` from trusted proxies only) and addresses written without
//! allocating (`ip_text.rs`).
//!
//! A new kind of part is a new [`Part`] variant and its arms in `parts.rs`; the config parses
//! it through [`Part`]'s [`FromStr`](std::str::FromStr), the admin API and page read it through
//! [`Display`](std::fmt::Display) and [`Serialize`].

use serde::ser::{Serialize, SerializeStruct, Serializer};

pub use bucket::{write_bucket_key, write_tag, BucketClient, CompositeKey, MAX_TAG_LEN};
pub use canonical::Ambiguous;
pub use client_ip::{canonical_net, ClientIpResolver, KeyPrefixes};
pub use ip_text::{push_ip, IpText};
pub use parts::{KeyInput, Part, PartValue, TextKind};
pub use query::ClientQueryError;

mod bucket;
pub mod canonical;
mod client_ip;
mod client_text;
mod ip_text;
mod parts;
mod query;
#[cfg(test)]
mod tests;

/// Values longer than this, or with bytes outside `is_plain`, are replaced by a hash so that
/// key material stays bounded whatever a client sends; a composite key's text too.
pub const MAX_PLAIN_KEY_LEN: usize = 64;

/// Most parts in one composite key: each is read from every request of the route.
pub const MAX_KEY_PARTS: usize = 8;

/// Bytes kept verbatim in a key; anything else (including `{`, `}` which would break Redis
/// Cluster hash tags, `#` which marks hashed values, and `,` which separates a composite's
/// parts) forces hashing.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'@' | b'=' | b'+' | b'/')
}

/// How a route groups requests into buckets: the `key` of a `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// `global`: one bucket for every client.
    Global,
    /// One part: `key = "client_ip"` (the default), `"header:X-Api-Key"`, …
    One(Part),
    /// A list of two or more distinct parts, `key = ["header:X-Api-Key", "client_ip"]`: one
    /// bucket per combination of their values.
    Composite(Box<[Part]>),
}

/// Why a `key` names no [`KeySpec`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySpecError {
    /// `header:<Name>` with a name that is not a header name.
    #[error("invalid header name {0:?}")]
    HeaderName(String),
    /// `cookie:<name>` with a name that is not a cookie name (an RFC 9110 token).
    #[error("invalid cookie name {0:?}")]
    CookieName(String),
    /// `query:` with no name.
    #[error("{0:?} names no parameter")]
    EmptyName(String),
    /// None of the known kinds.
    #[error(
        "unknown key {0:?}; expected \"global\", \"client_ip\", \"header:<Name>\", \
         \"query:<name>\", \"cookie:<name>\", \"method\", \"path\" or a list of parts"
    )]
    Unknown(String),
    /// `global` inside a list.
    #[error("\"global\" cannot be combined with other parts")]
    GlobalInList,
    /// `key = []`.
    #[error("an empty list names no part")]
    Empty,
    /// More than [`MAX_KEY_PARTS`] parts.
    #[error("{0} parts; at most {MAX_KEY_PARTS}")]
    TooMany(usize),
    /// One part listed twice.
    #[error("{0} is listed twice")]
    Duplicate(String),
}

impl KeySpec {
    /// The key of a list of parts: one part is that part alone; two or more, distinct, are a
    /// composite.
    pub fn from_parts(parts: Vec<Part>) -> Result<KeySpec, KeySpecError> {
        if parts.len() > MAX_KEY_PARTS {
            return Err(KeySpecError::TooMany(parts.len()));
        }
        for (i, p) in parts.iter().enumerate() {
            if parts[..i].contains(p) {
                return Err(KeySpecError::Duplicate(p.to_string()));
            }
        }
        let mut parts = parts.into_iter();
        match (parts.next(), parts.len()) {
            (None, _) => Err(KeySpecError::Empty),
            (Some(one), 0) => Ok(KeySpec::One(one)),
            (Some(first), _) => Ok(KeySpec::Composite(
                std::iter::once(first).chain(parts).collect(),
            )),
        }
    }

    /// The parts, in order (none for `global`).
    pub fn parts(&self) -> &[Part] {
        match self {
            KeySpec::Global => &[],
            KeySpec::One(part) => std::slice::from_ref(part),
            KeySpec::Composite(parts) => parts,
        }
    }

    /// Write the bucket key of a request on `route` into `out` (cleared first); see
    /// [`write_bucket_key`] and [`Part::value_of`]. A one-part key reads its value in place; a
    /// composite writes each part's value as it reads it, with no list in between.
    ///
    /// A request that names a part of the key ambiguously (its header on two lines, its
    /// parameter or cookie twice with different values) has no one client: the error says
    /// which, and the request is refused (400, as for a repeated `Host`) rather than counted
    /// under one value while the app reads another.
    pub fn write_request_key(
        &self,
        out: &mut String,
        route: &str,
        req: &KeyInput<'_>,
    ) -> Result<(), Ambiguous> {
        match self {
            KeySpec::Global => write_bucket_key(out, route, &BucketClient::Global),
            KeySpec::One(part) => {
                write_bucket_key(out, route, &BucketClient::One(part, part.value_of(req)?))
            }
            KeySpec::Composite(parts) => {
                let mut key = CompositeKey::start(out, route);
                for part in parts.iter() {
                    key.push(part, &part.value_of(req)?);
                }
                key.finish();
            }
        }
        Ok(())
    }
}

/// The text as configured (header names lower-case); a list as `["a", "b"]`.
impl std::fmt::Display for KeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySpec::Global => f.write_str("global"),
            KeySpec::One(part) => part.fmt(f),
            KeySpec::Composite(parts) => {
                let texts: Vec<String> = parts.iter().map(Part::to_string).collect();
                // A JSON list of strings, which is also the TOML one.
                let json = serde_json::to_string(&texts).map_err(|_| std::fmt::Error)?;
                f.write_str(&json.replace("\",\"", "\", \""))
            }
        }
    }
}

/// As JSON for the admin API, so the page never parses the text: `{"kind":"client_ip"}`,
/// `{"kind":"header","name":"x-api-key"}`, `{"kind":"global"}`, and for a list
/// `{"kind":"composite","parts":[{"kind":"header",…},{"kind":"client_ip"}]}`.
impl Serialize for KeySpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KeySpec::One(part) => part.serialize(s),
            KeySpec::Global => {
                let mut out = s.serialize_struct("KeySpec", 1)?;
                out.serialize_field("kind", "global")?;
                out.end()
            }
            KeySpec::Composite(parts) => {
                let mut out = s.serialize_struct("KeySpec", 2)?;
                out.serialize_field("kind", "composite")?;
                out.serialize_field("parts", parts)?;
                out.end()
            }
        }
    }
}
