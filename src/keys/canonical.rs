//! One identity per value, however a client writes it: how a header, query parameter or
//! cookie is read for a key, and when a request names its key ambiguously.
//!
//! The app behind the proxy reads these values through its framework, and the frameworks
//! differ: Express decodes cookies with `decodeURIComponent` (`+` stays `+`), PHP with
//! `urldecode` (`+` is a space), Python's `http.cookies` drops surrounding quotes, Rails and
//! PHP take the *last* of two parameters of one name while Express and Django take the first
//! or a list. A key that read the raw bytes would give one app identity many buckets
//! (`sid="abc"`, `sid=abc`, `sid=a%62c`), each with a fresh quota. So every value is read in
//! one canonical form that merges all the spellings any of them treats as one:
//!
//! - percent-escapes are decoded (`%62` is `b`, any hex case);
//! - `+` and space are one character (a space);
//! - one pair of surrounding double quotes is dropped, before and after decoding
//!   (`"abc"`, `%22abc%22`), and inside them backslash escapes are resolved as Python's
//!   `http.cookies` reads them (`"a\142c"`, `"a\bc"`);
//! - surrounding whitespace (SP, HTAB) is dropped, before and after decoding;
//! - a query's pairs are split at `;` as well as `&` (Rack 2, Go before 1.17 and older
//!   Python split at both);
//! - parameter and cookie names are compared as PHP registers them: leading spaces dropped,
//!   ` `, `.` and `[` read as `_` (`api.key` is `api_key` to PHP);
//! - a header named like the key's with `_` for `-` (`X_Api_Key`) is the key's header too: CGI
//!   servers (wsgiref, PHP's CGI, old Puma) read both as `HTTP_X_API_KEY`, so beside the real
//!   one it makes the key repeated (`400`).
//!
//! For `Basic` credentials the key reads the base64 as the bytes it decodes to, spelled one
//! way: apps decode them leniently (Python's `b64decode` drops what is not base64, Node's
//! `Buffer` stops at `=`, both ignore the padding bits), so junk bytes, padding or other
//! trailing bits in the same credentials would otherwise each be a fresh bucket. Header values
//! lose surrounding whitespace in the widest sense an app's `strip()` or `trim()` gives it
//! (also VT, FF, the separators 0x1C to 0x1F, NEL 0x85 and NBSP 0xA0 as obs-text bytes).
//!
//! Merging spellings two apps would keep apart only over-counts (two clients whose values
//! differ only by quoting share a bucket): stricter, never looser. A request that carries the
//! key's parameter or cookie twice with *different* canonical values is ambiguous: the app may
//! read either, so no one bucket is right, and it is refused (`400`). The same value twice is
//! one identity and fine.
//!
//! Header values are taken as sent but for surrounding whitespace (HTTP/1.1 parsing drops it;
//! an HTTP/2 field that carries it is malformed and refused before any key is read), and
//! for `Authorization` and `Proxy-Authorization` the scheme, which is case-insensitive
//! (RFC 9110 §11.1), is lower-cased and separated from the credentials by one space.

use std::borrow::Cow;

use http::header::{AUTHORIZATION, PROXY_AUTHORIZATION};
use http::{HeaderMap, HeaderName};

/// A key part a request names more than once with different values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    /// The key's header on more than one line (one field value per line in HTTP/2).
    #[error("the key header {0} is repeated")]
    Header(HeaderName),
    /// The key's query parameter twice, with different values.
    #[error("the key parameter {0:?} is given twice with different values")]
    Query(Box<str>),
    /// The key's cookie twice, with different values.
    #[error("the key cookie {0:?} is given twice with different values")]
    Cookie(Box<str>),
}

/// The value of header `name`, as the key reads it; an error if the header is repeated.
pub fn header_value<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<Cow<'a, [u8]>>, Ambiguous> {
    let aliases = (headers.keys()).filter(|k| *k != name && cgi_same(k.as_str(), name.as_str()));
    let mut all = (headers.get_all(name).iter()).chain(aliases.flat_map(|k| headers.get_all(k)));
    let Some(first) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(Ambiguous::Header(name.clone()));
    }
    Ok(Some(header_text(name, first.as_bytes())))
}

/// A value of header `name` as the key reads it: without surrounding whitespace, and for the
/// credentials headers with the scheme folded.
pub fn header_text<'a>(name: &HeaderName, value: &'a [u8]) -> Cow<'a, [u8]> {
    let value = trim_app_space(value);
    match name == AUTHORIZATION || name == PROXY_AUTHORIZATION {
        true => credentials(value),
        false => Cow::Borrowed(value),
    }
}

/// The value of query parameter `name` (compared decoded), canonical; an error if it is given
/// twice with different values.
pub fn query_value<'a>(query: &'a str, name: &str) -> Result<Option<Cow<'a, [u8]>>, Ambiguous> {
    let pairs = query.split(['&', ';']).filter_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        php_same(&canonical(k.as_bytes()), name.as_bytes()).then(|| canonical(v.as_bytes()))
    });
    one_value(pairs).map_err(|()| Ambiguous::Query(name.into()))
}

/// The value of cookie `name` (case-sensitive, RFC 6265; compared decoded) over every
/// `Cookie` field (HTTP/2 may send one field per cookie, RFC 9113 §8.2.3), canonical; an error
/// if it is given twice with different values.
pub fn cookie_value<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<Cow<'a, [u8]>>, Ambiguous> {
    let pairs = headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|field| field.as_bytes().split(|b| *b == b';'))
        .filter_map(|pair| {
            let eq = pair.iter().position(|b| *b == b'=')?;
            php_same(&canonical(&pair[..eq]), name.as_bytes()).then(|| canonical(&pair[eq + 1..]))
        });
    one_value(pairs).map_err(|()| Ambiguous::Cookie(name.into()))
}

/// Two header names (lower-case) a CGI server reads as one: equal with `_` for `-`.
pub(crate) fn cgi_same(a: &str, b: &str) -> bool {
    let fold = |c: u8| if c == b'_' { b'-' } else { c };
    a.len() == b.len() && a.bytes().map(fold).eq(b.bytes().map(fold))
}

/// Two parameter or cookie names PHP registers as one: leading spaces dropped, ` `, `.` and
/// `[` read as `_`.
pub(crate) fn php_same(a: &[u8], b: &[u8]) -> bool {
    fn fold(n: &[u8]) -> impl Iterator<Item = u8> + '_ {
        let start = n.iter().position(|c| *c != b' ').unwrap_or(n.len());
        (n[start..].iter()).map(|&c| {
            if matches!(c, b' ' | b'.' | b'[') {
                b'_'
            } else {
                c
            }
        })
    }
    a == b || fold(a).eq(fold(b))
}

/// The one value of `values`: none, or the first if every other equals it.
fn one_value<'a>(
    mut values: impl Iterator<Item = Cow<'a, [u8]>>,
) -> Result<Option<Cow<'a, [u8]>>, ()> {
    let Some(first) = values.next() else {
        return Ok(None);
    };
    match values.all(|v| v == first) {
        true => Ok(Some(first)),
        false => Err(()),
    }
}

/// A query or cookie value (or name) in its canonical form (see the module documentation);
/// borrowed when nothing changes, as for most values.
pub fn canonical(raw: &[u8]) -> Cow<'_, [u8]> {
    let outer = unquote(trim_ows(raw));
    if !outer.iter().any(|b| matches!(b, b'%' | b'+' | b' ')) {
        return outer;
    }
    let mut decoded = Vec::with_capacity(outer.len());
    let mut i = 0;
    while i < outer.len() {
        let b = match outer[i] {
            b'%' => match (hex(outer.get(i + 1)), hex(outer.get(i + 2))) {
                (Some(hi), Some(lo)) => {
                    i += 2;
                    hi << 4 | lo
                }
                _ => b'%',
            },
            b => b,
        };
        decoded.push(if b == b'+' { b' ' } else { b });
        i += 1;
    }
    let inner = unquote(trim_ows(&decoded));
    Cow::Owned(inner.into_owned())
}

/// The value of one hex digit.
fn hex(b: Option<&u8>) -> Option<u8> {
    (*b? as char).to_digit(16).map(|d| d as u8)
}

/// Without one pair of surrounding double quotes, whose inside has its escapes resolved.
fn unquote(v: &[u8]) -> Cow<'_, [u8]> {
    match v {
        [b'"', inner @ .., b'"'] => unescape(trim_ows(inner)),
        _ => Cow::Borrowed(v),
    }
}

/// A quoted string's backslash escapes resolved as Python's `http.cookies` does (Werkzeug and
/// Django read cookies with it): `\ooo`, three octal digits, is that byte; `\c` is `c`.
fn unescape(v: &[u8]) -> Cow<'_, [u8]> {
    if !v.contains(&b'\\') {
        return Cow::Borrowed(v);
    }
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        let (b, next) = match (v[i], v.get(i + 1..i + 4)) {
            (b'\\', Some(&[a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7'])) => {
                ((a - b'0') << 6 | (b - b'0') << 3 | (c - b'0'), i + 4)
            }
            (b'\\', _) if i + 1 < v.len() => (v[i + 1], i + 2),
            (b, _) => (b, i + 1),
        };
        out.push(b);
        i = next;
    }
    Cow::Owned(out)
}

/// Without surrounding whitespace in the widest sense an app trims a header value with
/// (Python's `str.strip()` over a Latin-1 decoded value, JavaScript's `trim()`): SP, HTAB, VT,
/// FF, 0x1C to 0x1F, NEL (0x85) and NBSP (0xA0). CR and LF never reach here.
fn trim_app_space(v: &[u8]) -> &[u8] {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | 0x0b | 0x0c | 0x1c..=0x1f | 0x85 | 0xa0);
    let start = v.iter().position(|b| !is_space(b)).unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !is_space(b))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// Without surrounding SP and HTAB (RFC 9110 §5.5 OWS).
pub fn trim_ows(v: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !is_ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !is_ows(b)).map_or(start, |e| e + 1);
    &v[start..end]
}

/// `Scheme  credentials` as `scheme credentials`: the scheme is case-insensitive, and the
/// whitespace after it is not part of the credentials.
fn credentials(value: &[u8]) -> Cow<'_, [u8]> {
    let Some(sp) = value.iter().position(|b| *b == b' ' || *b == b'\t') else {
        return Cow::Borrowed(value);
    };
    let (scheme, rest) = (&value[..sp], trim_app_space(&value[sp..]));
    if scheme.eq_ignore_ascii_case(b"basic") {
        let mut out = b"basic ".to_vec();
        out.extend_from_slice(&basic_credentials(rest));
        return Cow::Owned(out);
    }
    let plain = !scheme.iter().any(u8::is_ascii_uppercase)
        && value[sp] == b' '
        && sp + 1 + rest.len() == value.len();
    if plain {
        return Cow::Borrowed(value);
    }
    let mut out = scheme.to_ascii_lowercase();
    out.push(b' ');
    out.extend_from_slice(rest);
    Cow::Owned(out)
}

/// `Basic` credentials in one spelling: the base64 digits up to the first `=` (the URL-safe
/// `-` and `_` read as `+` and `/`, anything else dropped), decoded ignoring the padding bits,
/// encoded again in standard form. What does not decode (a lone last digit) is left out.
fn basic_credentials(text: &[u8]) -> Vec<u8> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
    use base64::engine::DecodePaddingMode;
    use base64::Engine as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireNone),
    );
    let mut digits: Vec<u8> = (text.iter().take_while(|b| **b != b'='))
        .filter_map(|&b| match b {
            b'-' => Some(b'+'),
            b'_' => Some(b'/'),
            b'+' | b'/' => Some(b),
            b if b.is_ascii_alphanumeric() => Some(b),
            _ => None,
        })
        .collect();
    if digits.len() % 4 == 1 {
        digits.pop();
    }
    match LENIENT.decode(&digits) {
        Ok(bytes) => STANDARD.encode(bytes).into_bytes(),
        Err(_) => digits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(raw: &str) -> String {
        String::from_utf8(canonical(raw.as_bytes()).into_owned()).unwrap()
    }

    #[test]
    fn spellings_of_one_value_are_one() {
        for raw in [
            "abc",
            "\"abc\"",
            "a%62c",
            "%61bc",
            "%61%62%63",
            "%22abc%22",
            " abc\t",
            "\" abc \"",
            "\"a%62c\"",
        ] {
            assert_eq!(c(raw), "abc", "{raw:?}");
        }
        for raw in ["a b", "a+b", "a%2Bb", "a%2bb", "a%20b", "\"a+b\""] {
            assert_eq!(c(raw), "a b", "{raw:?}");
        }
        // Not an escape: kept as sent.
        assert_eq!(c("100%"), "100%");
        assert_eq!(c("%zz"), "%zz");
        assert_eq!(c("\"abc"), "\"abc");
        assert!(matches!(canonical(b"plain-value"), Cow::Borrowed(_)));
    }

    #[test]
    fn repeated_names_with_different_values_are_ambiguous() {
        let q = |query: &str| {
            query_value(query, "user")
                .map(|v| v.map(|v| String::from_utf8(v.into_owned()).unwrap()))
        };
        assert_eq!(q("user=abc"), Ok(Some("abc".into())));
        assert_eq!(q("user=abc&user=a%62c"), Ok(Some("abc".into())));
        assert_eq!(q("u%73er=abc&x=1"), Ok(Some("abc".into())));
        assert_eq!(q("x=1"), Ok(None));
        assert!(q("user=abc&user=abd").is_err());
        assert!(q("user=&user=abc").is_err());
        assert!(q("user=abc&us%65r=abd").is_err());

        let mut h = HeaderMap::new();
        h.append("cookie", "a=1; sid=\"abc\"".parse().unwrap());
        h.append("cookie", "sid=a%62c".parse().unwrap());
        assert_eq!(
            cookie_value(&h, "sid").unwrap().as_deref(),
            Some(&b"abc"[..])
        );
        h.append("cookie", "sid=abd".parse().unwrap());
        assert!(cookie_value(&h, "sid").is_err());
        assert_eq!(cookie_value(&h, "SID"), Ok(None));
    }

    #[test]
    fn headers_are_trimmed_and_authorization_schemes_folded() {
        let mut h = HeaderMap::new();
        h.insert("x-k", " k1\t".parse().unwrap());
        let name = HeaderName::from_static("x-k");
        assert_eq!(
            header_value(&h, &name).unwrap().as_deref(),
            Some(&b"k1"[..])
        );
        for raw in ["Bearer abc", "bearer abc", "BEARER \t abc", "bearer abc "] {
            h.insert(AUTHORIZATION, raw.parse().unwrap());
            let got = header_value(&h, &AUTHORIZATION).unwrap().unwrap();
            assert_eq!(&*got, b"bearer abc", "{raw:?}");
        }
        h.append("x-k", "k1".parse().unwrap());
        assert!(header_value(&h, &name).is_err());
    }

    #[test]
    fn basic_credentials_are_the_bytes_they_decode_to() {
        // "user:pw" in base64, and spellings a lenient decoder reads as the same bytes.
        let one = "basic dXNlcjpwdw==";
        for raw in [
            "Basic dXNlcjpwdw==",
            "basic dXNlcjpwdw",
            "BASIC  dXNlcjpwdw=",
            "Basic dXNlcjpwdx==",
            "Basic dXNl.cjp*wdw==",
            "Basic dXNl cjpwdw==",
            "Basic dXNlcjpwdw==junk",
            "Basic dXNlcjpwdw=ZZZZ",
            "Basic dXNlcjpwdw\u{a0}",
        ] {
            let got = header_text(&AUTHORIZATION, raw.as_bytes());
            assert_eq!(String::from_utf8_lossy(&got), one, "{raw:?}");
        }
        // Other bytes are another identity; another scheme keeps its text.
        let other = header_text(&AUTHORIZATION, b"Basic dXNlcjpweA==");
        assert_ne!(&*other, one.as_bytes());
        let bearer = header_text(&AUTHORIZATION, b"Bearer dXNl.cjpwdw==");
        assert_eq!(&*bearer, b"bearer dXNl.cjpwdw==");
    }

    #[test]
    fn quoted_escapes_and_app_whitespace_and_semicolons_are_one_spelling() {
        for raw in ["\"ab\\143\"", "\"a\\b\\c\"", "\"abc\"", "%22ab\\143%22"] {
            assert_eq!(c(raw), "abc", "{raw:?}");
        }
        // Unquoted, a backslash is the value's own.
        assert_eq!(c("a\\bc"), "a\\bc");
        let name = HeaderName::from_static("x-k");
        for raw in [&b"k1\xa0"[..], b"\x85k1", b"k1\x0b\x1f", b" \xa0k1\xa0\t"] {
            assert_eq!(&*header_text(&name, raw), b"k1", "{raw:?}");
        }
        let q = |query| query_value(query, "user");
        assert_eq!(q("user=abc;x=1"), Ok(Some(b"abc".into())));
        assert!(q("user=abc;user=abd").is_err());
    }

    #[test]
    fn names_php_or_a_cgi_server_reads_as_one_are_one() {
        let q = |query| query_value(query, "api_key");
        for query in [
            "api.key=K",
            "api%20key=K",
            "api[key=K",
            "%20api_key=K",
            "api_key=K",
        ] {
            assert_eq!(q(query), Ok(Some(b"K".into())), "{query}");
        }
        assert!(q("api_key=X&api.key=K").is_err());
        assert_eq!(q("apikey=K"), Ok(None));
        let mut h = HeaderMap::new();
        h.append("cookie", "sess.id=K; sess_id=X".parse().unwrap());
        assert!(cookie_value(&h, "sess_id").is_err());

        let name = HeaderName::from_static("x-api-key");
        let mut h = HeaderMap::new();
        h.insert("x_api_key", "K".parse().unwrap());
        assert_eq!(header_value(&h, &name).unwrap().as_deref(), Some(&b"K"[..]));
        h.insert("x-api_key", "X".parse().unwrap());
        assert!(header_value(&h, &name).is_err());
        let mut h = HeaderMap::new();
        h.insert("x-api-keys", "X".parse().unwrap());
        assert_eq!(header_value(&h, &name), Ok(None));
    }
}
