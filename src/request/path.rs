//! A request's path as routes match it, and the paths refused because apps read them apart.
//!
//! Upstream frameworks decode and normalise paths before routing, so matching the raw path
//! would let `/%6cogin` or `//login` reach `/login` without its limits: routes match the
//! normalised path ([`normalize_path`]: percent-escapes decoded, empty segments dropped, each
//! segment's `;parameters` dropped as servlet containers (Tomcat, Jetty) drop them). The
//! request is still forwarded with its raw path.
//!
//! Some spellings no single reading can match, because apps disagree on them: a dot segment
//! (`/api/..`, `/x/%2e%2e/login`, `/x/..;/login`) is resolved by Node's `URL` and by servlet
//! containers but served as it is by Flask, Express or Django (`/api/<path>` with `p = ".."`),
//! and a backslash is a separator to WHATWG URL parsers (Node, Deno, Bun: `/x\..\login` is
//! `/login`) and an ordinary byte to others. Real clients never send either: browsers and HTTP
//! libraries resolve dot segments before sending (RFC 3986 §5.2), and a backslash is not
//! allowed in a request-target. So a path with one is refused ([`ambiguous`]: `400`), where
//! matching it one way would let an app that reads it the other way serve a limited route's
//! handler without its limits.

use std::borrow::Cow;

/// True when `path` (the request-target's path, raw) has a backslash, raw or percent-encoded,
/// or a `.` or `..` segment once decoded and stripped of its `;parameters`.
pub fn ambiguous(path: &str) -> bool {
    let bytes = path.as_bytes();
    // Most paths: nothing to decode and no dot at a segment's start.
    if !bytes.contains(&b'%') && !bytes.contains(&b'\\') && !has_dot_segment_start(bytes) {
        return false;
    }
    let decoded = decode(bytes);
    decoded.contains(&b'\\')
        || decoded
            .split(|b| *b == b'/')
            .map(without_parameters)
            .any(|seg| seg == b"." || seg == b"..")
}

/// Does a segment of `bytes` begin with a dot (`/.`)?
fn has_dot_segment_start(bytes: &[u8]) -> bool {
    bytes.first() == Some(&b'.') || bytes.windows(2).any(|w| w == b"/.")
}

/// A segment without its `;parameters` (`..;x` is `..`, `;a` is empty).
fn without_parameters(segment: &[u8]) -> &[u8] {
    match segment.iter().position(|b| *b == b';') {
        Some(i) => &segment[..i],
        None => segment,
    }
}

/// The path routes are matched against: percent-escapes decoded, empty and `.` segments
/// dropped, each segment's `;parameters` dropped, `..` resolved (never above the root; a
/// request whose path has one is refused before matching, see [`ambiguous`], but the admin
/// inspector reads paths here too).
pub fn normalize_path(raw: &str) -> Cow<'_, str> {
    let bytes = raw.as_bytes();
    let clean = !raw.contains(['%', ';'])
        && !raw.contains("//")
        && !bytes.windows(2).any(|w| w == b"/.")
        && raw.starts_with('/');
    if clean {
        return Cow::Borrowed(raw);
    }
    let decoded = decode(bytes);
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        let seg = seg.split(';').next().unwrap_or_default();
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for seg in &segments {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() || (decoded.ends_with('/') && !segments.is_empty()) {
        out.push('/');
    }
    Cow::Owned(out)
}

/// `bytes` with every valid percent-escape decoded (an invalid one is kept as it is).
fn decode(bytes: &[u8]) -> Vec<u8> {
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                decoded.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        decoded.push(b);
        i += 1;
    }
    decoded
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_before_matching() {
        for (raw, want) in [
            ("/login", "/login"),
            ("/%6cogin", "/login"),
            ("//login", "/login"),
            ("/x/../login", "/login"),
            ("/./login/", "/login/"),
            ("/../../login", "/login"),
            ("/a%2F..%2Flogin", "/login"),
            ("/bad%zzescape%", "/bad%zzescape%"),
            ("/%", "/%"),
            ("/..", "/"),
            ("", "/"),
            ("/;a/login", "/login"),
            ("/login;jsessionid=1", "/login"),
            ("/login%3Bx", "/login"),
            ("/a;b/c;d/", "/a/c/"),
        ] {
            assert_eq!(normalize_path(raw), want, "{raw}");
        }
    }

    #[test]
    fn dot_segments_and_backslashes_are_ambiguous() {
        for raw in [
            "/api/..",
            "/api/v1/../..",
            "/api/%2e%2e",
            "/api/%2E%2e/x",
            "/./login",
            "/x/..;/login",
            "/x/..%3B/login",
            "/x/.;a/login",
            "/x\\..\\login",
            "/x%5clogin",
            "/a/%2e",
            "..",
        ] {
            assert!(ambiguous(raw), "{raw}");
        }
        for raw in [
            "/",
            "/login",
            "/.well-known/acme-challenge/x",
            "/a/.hidden",
            "/a/...",
            "/a/..b",
            "/a.b/c.d",
            "/%6cogin",
            "/login;jsessionid=1",
            "/a%2Fb",
        ] {
            assert!(!ambiguous(raw), "{raw}");
        }
    }
}
