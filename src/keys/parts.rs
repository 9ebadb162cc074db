//! The parts a key is made of (`client_ip`, `header:<Name>`, `query:<name>`, `cookie:<name>`,
//! `method`, `path`), alone or in a list, and the value each one reads from a request.

use std::borrow::Cow;
use std::net::IpAddr;
use std::str::FromStr;

use http::{HeaderMap, HeaderName, Method};

use super::canonical::{cookie_value, header_value, query_value, Ambiguous};
use serde::ser::{Serialize, SerializeStruct, Serializer};

use super::KeySpecError;

/// One part of a key: what it reads from a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// `client_ip`: the client address (see [`super::ClientIpResolver`]).
    ClientIp,
    /// `header:<Name>`: a request header's value, as sent but for surrounding whitespace.
    Header(HeaderName),
    /// `query:<name>`: a query parameter's value, decoded (`%XX` escapes, `+` as a space),
    /// so `?k=a%62` and `?k=ab` are one client; see [`super::canonical`].
    Query(Box<str>),
    /// `cookie:<name>`: a cookie's value over every `Cookie` field, unquoted and decoded as a
    /// query value is; see [`super::canonical`].
    Cookie(Box<str>),
    /// `method`: the request method.
    Method,
    /// `path`: the normalised path the routes were matched against
    /// ([`crate::request::path::normalize_path`]), not the raw request target.
    Path,
}

/// What a request's value is, for the parts read as bytes; its tag in the bucket key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    /// A header value (`h`).
    Header,
    /// A decoded query value (`q`).
    Query,
    /// A cookie value (`c`).
    Cookie,
    /// The method (`m`).
    Method,
    /// The normalised path (`p`).
    Path,
}

impl TextKind {
    /// Its tag in bucket keys.
    pub fn tag(self) -> &'static str {
        match self {
            TextKind::Header => "h",
            TextKind::Query => "q",
            TextKind::Cookie => "c",
            TextKind::Method => "m",
            TextKind::Path => "p",
        }
    }
}

/// The value one part takes for one request (or one admin query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartValue<'a> {
    /// A client address: a `client_ip` part, or a header, query or cookie part the request
    /// lacks.
    Ip(IpAddr),
    /// A non-empty value read from the request.
    Text(TextKind, Cow<'a, [u8]>),
}

/// What a key reads of a request: borrowed, so building one costs nothing.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The raw query (after `?`), if any.
    pub query: Option<&'a str>,
    /// The method.
    pub method: &'a Method,
    /// The normalised path the routes matched.
    pub path: &'a str,
    /// The client address, as keyed (its network under `[client_ip]` prefixes).
    pub ip: IpAddr,
}

impl<'a> KeyInput<'a> {
    /// Only headers and an address (method GET, path `/`, no query): for tests and callers that
    /// key by those alone.
    pub fn headers(headers: &'a HeaderMap, ip: IpAddr) -> Self {
        KeyInput {
            headers,
            query: None,
            method: &Method::GET,
            path: "/",
            ip,
        }
    }
}

impl Part {
    /// The value of this part for `req`, read in its canonical form
    /// ([`super::canonical`]). A header, query parameter or cookie that is missing or empty is
    /// the client address instead: such requests are never pooled into one shared bucket, nor
    /// left unlimited, nor given a fresh bucket each. A request naming the part twice with
    /// different values has no one value: [`Ambiguous`].
    pub fn value_of<'a>(&self, req: &KeyInput<'a>) -> Result<PartValue<'a>, Ambiguous> {
        let text = |kind, bytes: Option<Cow<'a, [u8]>>| match bytes {
            Some(b) if !b.is_empty() => PartValue::Text(kind, b),
            _ => PartValue::Ip(req.ip),
        };
        Ok(match self {
            Part::ClientIp => PartValue::Ip(req.ip),
            Part::Header(name) => text(TextKind::Header, header_value(req.headers, name)?),
            Part::Query(name) => {
                let value = match req.query {
                    Some(q) => query_value(q, name)?,
                    None => None,
                };
                text(TextKind::Query, value)
            }
            Part::Cookie(name) => text(TextKind::Cookie, cookie_value(req.headers, name)?),
            Part::Method => text(
                TextKind::Method,
                Some(req.method.as_str().as_bytes().into()),
            ),
            Part::Path => text(TextKind::Path, Some(req.path.as_bytes().into())),
        })
    }

    /// The kind of value an admin query gives for this part (`None`: an address).
    pub fn text_kind(&self) -> Option<TextKind> {
        match self {
            Part::ClientIp => None,
            Part::Header(_) => Some(TextKind::Header),
            Part::Query(_) => Some(TextKind::Query),
            Part::Cookie(_) => Some(TextKind::Cookie),
            Part::Method => Some(TextKind::Method),
            Part::Path => Some(TextKind::Path),
        }
    }

    /// Can a request lack this part (and so be keyed by its address in its place)?
    pub fn may_be_missing(&self) -> bool {
        matches!(self, Part::Header(_) | Part::Query(_) | Part::Cookie(_))
    }
}

impl FromStr for Part {
    type Err = KeySpecError;

    fn from_str(text: &str) -> Result<Part, KeySpecError> {
        let named = |prefix: &str| text.strip_prefix(prefix);
        match text {
            "client_ip" => return Ok(Part::ClientIp),
            "method" => return Ok(Part::Method),
            "path" => return Ok(Part::Path),
            "global" => return Err(KeySpecError::GlobalInList),
            _ => {}
        }
        if let Some(h) = named("header:") {
            return HeaderName::from_bytes(h.as_bytes())
                .map(Part::Header)
                .map_err(|_| KeySpecError::HeaderName(h.to_string()));
        }
        if let Some(q) = named("query:") {
            return match q.is_empty() {
                true => Err(KeySpecError::EmptyName(text.to_string())),
                false => Ok(Part::Query(q.into())),
            };
        }
        if let Some(c) = named("cookie:") {
            // A cookie name is an RFC 9110 token: a header name's characters, any case.
            let token = !c.is_empty() && HeaderName::from_bytes(c.as_bytes()).is_ok();
            return match token {
                true => Ok(Part::Cookie(c.into())),
                false => Err(KeySpecError::CookieName(c.to_string())),
            };
        }
        Err(KeySpecError::Unknown(text.to_string()))
    }
}

/// The text as configured; header names are case-insensitive and written lower-case.
impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Part::ClientIp => f.write_str("client_ip"),
            Part::Header(name) => write!(f, "header:{name}"),
            Part::Query(name) => write!(f, "query:{name}"),
            Part::Cookie(name) => write!(f, "cookie:{name}"),
            Part::Method => f.write_str("method"),
            Part::Path => f.write_str("path"),
        }
    }
}

/// `{"kind":"client_ip"}`, `{"kind":"header","name":"x-api-key"}`, `{"kind":"query",...}`,
/// `{"kind":"cookie",...}`, `{"kind":"method"}`, `{"kind":"path"}`.
impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (kind, name) = match self {
            Part::ClientIp => ("client_ip", None),
            Part::Header(name) => ("header", Some(name.as_str())),
            Part::Query(name) => ("query", Some(&**name)),
            Part::Cookie(name) => ("cookie", Some(&**name)),
            Part::Method => ("method", None),
            Part::Path => ("path", None),
        };
        let mut out = s.serialize_struct("Part", 1 + usize::from(name.is_some()))?;
        out.serialize_field("kind", kind)?;
        if let Some(name) = name {
            out.serialize_field("name", name)?;
        }
        out.end()
    }
}
