//! `X-Request-Id`: every request carries one, to its upstream, back to its client (on upstream
//! responses and slidegate's own 4xx/5xx alike) and into the access log.
//!
//! A client's (or a front proxy's) id is kept when it is one `X-Request-Id` field of 1 to
//! [`MAX_LEN`] visible ASCII characters (`!` to `~` but `"` and `\`: no spaces, no control
//! bytes, nothing a log line would have to escape); otherwise slidegate replaces it with 32 lowercase hex
//! characters (128 random bits). The id is written into the request head itself, so the
//! upstream request (a copy of it) and every later hook see the same one.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};

/// `x-request-id`, as a map key.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The name as written on HTTP/1. Inserted as `(X_REQUEST_ID, SPELLED)`, it is neither parsed
/// nor copied (`vendor/pingora-http.patch`).
const SPELLED: &str = "X-Request-Id";

/// Longest id kept as sent.
pub const MAX_LEN: usize = 128;

/// Pure: is `value` an id to keep?
pub fn acceptable(value: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&value.len())
        && (value.iter()).all(|&b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

/// Pure: the id a request arrives with, if it is one to keep (exactly one field, acceptable).
pub fn incoming(headers: &HeaderMap) -> Option<&HeaderValue> {
    let mut values = headers.get_all(X_REQUEST_ID).iter();
    let first = values.next()?;
    (values.next().is_none() && acceptable(first.as_bytes())).then_some(first)
}

/// A new id: 32 lowercase hex characters from 128 random bits (fastrand: cheap, not
/// cryptographic; an id names a request, it grants nothing).
pub fn generate() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = fastrand::u128(..);
    let mut text = [0u8; 32];
    for (i, c) in text.iter_mut().enumerate() {
        *c = HEX[((bits >> (4 * i)) & 0xf) as usize];
    }
    // One allocation, shared by reference count with the clones Pingora makes (the upstream
    // request is a copy of this head) and the response's copy; `from_bytes` would copy into a
    // `Bytes` whose first clone allocates a second block.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(text))
        .expect("hex is a valid header value")
}

/// Keep the request's id or give it one, in the request head.
pub fn assign(req: &mut RequestHeader) {
    if incoming(&req.headers).is_none() {
        // Replaces every field of the name: one id per request.
        let _ = req.insert_header((X_REQUEST_ID, SPELLED), generate());
    }
}

/// The request's id (after [`assign`]).
pub fn of(req: &RequestHeader) -> Option<&HeaderValue> {
    req.headers.get(X_REQUEST_ID)
}

/// Return the request's id on a response to it.
pub fn echo(req: &RequestHeader, resp: &mut ResponseHeader) -> pingora::Result<()> {
    match of(req) {
        Some(id) => resp.insert_header((X_REQUEST_ID, SPELLED), id.clone()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_ascii_up_to_the_limit_is_kept() {
        assert!(acceptable(b"abc-123_XYZ.~!"));
        assert!(acceptable(&[b'a'; MAX_LEN]));
        assert!(!acceptable(&[b'a'; MAX_LEN + 1]));
        assert!(!acceptable(b""));
        assert!(!acceptable(b"has space"));
        assert!(!acceptable(b"quote\"d"));
        assert!(!acceptable(b"tab\there"));
        assert!(!acceptable(b"back\\slash"));
        assert!(!acceptable("é".as_bytes()));
    }

    #[test]
    fn two_fields_are_no_id() {
        let mut h = HeaderMap::new();
        h.append(X_REQUEST_ID, HeaderValue::from_static("a"));
        assert_eq!(incoming(&h).unwrap(), "a");
        h.append(X_REQUEST_ID, HeaderValue::from_static("b"));
        assert!(incoming(&h).is_none());
    }

    #[test]
    fn generated_ids_are_32_hex_and_differ() {
        let (a, b) = (generate(), generate());
        assert_eq!(a.len(), 32);
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert!(acceptable(a.as_bytes()));
        assert_ne!(a, b);
    }

    #[test]
    fn assign_keeps_a_good_id_and_replaces_a_bad_one() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header(X_REQUEST_ID, "keep-me").unwrap();
        assign(&mut req);
        assert_eq!(of(&req).unwrap(), "keep-me");
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header(X_REQUEST_ID, "not kept").unwrap();
        assign(&mut req);
        assert_eq!(of(&req).unwrap().len(), 32);
        assert_eq!(req.headers.get_all(X_REQUEST_ID).iter().count(), 1);
    }
}
