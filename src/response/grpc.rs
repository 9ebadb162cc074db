//! gRPC answers for the requests slidegate refuses itself.
//!
//! A gRPC client reads the outcome of a call from `grpc-status`, not from the HTTP status: a
//! `429` reaches its application as `UNAVAILABLE` (the gRPC mapping of HTTP statuses), which
//! clients retry at once. So a gRPC request (`content-type: application/grpc` or
//! `application/grpc+<codec>`, as Envoy recognises it) that slidegate refuses gets what a gRPC
//! server sends for a failed call: `200`, `content-type: application/grpc`, `grpc-status` and a
//! percent-encoded `grpc-message`, as a *trailers-only* response (one HEADERS frame that ends
//! the stream over HTTP/2; over HTTP/1.1 the same fields with `Content-Length: 0`, as Envoy
//! answers there too). The proxy's other fields (`RateLimit-Policy`, `RateLimit`,
//! `Retry-After`, `Server`, the route's `response_headers`) ride along as metadata.

use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::prelude::*;

/// The media type of a gRPC message stream.
pub const CONTENT_TYPE: &str = "application/grpc";

/// The gRPC status codes slidegate answers with (the numbers of the gRPC spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GrpcStatus {
    /// 2: none of the others fits.
    Unknown = 2,
    /// 3: a malformed request (slidegate's `400`): retrying it does not help.
    InvalidArgument = 3,
    /// 4: the request was not received in time (`408`).
    DeadlineExceeded = 4,
    /// 8: a rate limit denied the call (slidegate's `429`, whatever `deny_status` says).
    ResourceExhausted = 8,
    /// 12: no route takes this method (`404`).
    Unimplemented = 12,
    /// 13: slidegate's own failure (`500`).
    Internal = 13,
    /// 14: the rate limiter or the upstream cannot serve the call now (`502`, `503`, `504`):
    /// the status gRPC clients retry.
    Unavailable = 14,
}

impl GrpcStatus {
    /// The status of a refusal slidegate would answer with HTTP `code` to a non-gRPC client.
    pub fn for_http(code: u16) -> GrpcStatus {
        match code {
            400 => GrpcStatus::InvalidArgument,
            404 => GrpcStatus::Unimplemented,
            408 => GrpcStatus::DeadlineExceeded,
            429 => GrpcStatus::ResourceExhausted,
            500 => GrpcStatus::Internal,
            502..=504 => GrpcStatus::Unavailable,
            _ => GrpcStatus::Unknown,
        }
    }

    /// The `grpc-status` value.
    pub fn value(self) -> HeaderValue {
        HeaderValue::from(self as u16)
    }
}

/// The `grpc-status` of a call's trailers (or of a trailers-only answer's head), if present
/// and a number.
pub fn status_of(fields: &http::HeaderMap) -> Option<u16> {
    let value = fields.get("grpc-status")?.to_str().ok()?;
    value.trim().parse().ok()
}

/// The HTTP status a call's `grpc-status` stands for, as grpc-gateway maps them (so
/// `count_status = [401, 403]` counts `UNAUTHENTICATED` and `PERMISSION_DENIED` calls): gRPC
/// servers answer every call `200` and say how it went in `grpc-status`.
pub fn http_status(code: u16) -> http::StatusCode {
    let http = match code {
        0 => 200,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        _ => 500,
    };
    http::StatusCode::from_u16(http).expect("a valid status")
}

/// Is this request a gRPC call? Its `content-type` is `application/grpc`, or
/// `application/grpc+<codec>` (`+proto`, `+json`), case-insensitively; `application/grpc-web`
/// is not (its clients read HTTP statuses).
pub fn is_grpc(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type else {
        return false;
    };
    let bytes = value.as_bytes();
    let media = match bytes.iter().position(|&b| b == b';') {
        Some(i) => &bytes[..i],
        None => bytes,
    };
    let media = media.trim_ascii();
    let prefix = CONTENT_TYPE.as_bytes();
    if media.len() < prefix.len() || !media[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return false;
    }
    matches!(media.get(prefix.len()), None | Some(b'+'))
}

/// `message` percent-encoded as the gRPC spec asks of `grpc-message`: every byte outside
/// printable ASCII (0x20–0x7E), and `%` itself, as `%XX`.
pub fn encode_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
    out
}

/// The head of a trailers-only gRPC answer: `200`, `content-type: application/grpc`,
/// `grpc-status` and `grpc-message`; `Content-Length: 0` unless it goes out over HTTP/2 (where
/// the end of the stream says it).
pub fn answer(status: GrpcStatus, message: &str, h2: bool) -> Result<ResponseHeader> {
    let mut header = ResponseHeader::build(200, Some(8))?;
    header.insert_header("Content-Type", CONTENT_TYPE)?;
    header.insert_header("grpc-status", status.value())?;
    header.insert_header("grpc-message", encode_message(message))?;
    if !h2 {
        header.insert_header("Content-Length", "0")?;
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_grpc_status_stands_for_an_http_status() {
        let mut fields = http::HeaderMap::new();
        assert_eq!(status_of(&fields), None);
        fields.insert("grpc-status", HeaderValue::from_static("16"));
        assert_eq!(status_of(&fields), Some(16));
        fields.insert("grpc-status", HeaderValue::from_static("x"));
        assert_eq!(status_of(&fields), None);
        for (code, http) in [
            (0, 200),
            (7, 403),
            (8, 429),
            (14, 503),
            (16, 401),
            (2, 500),
            (99, 500),
        ] {
            assert_eq!(http_status(code).as_u16(), http, "{code}");
        }
    }

    #[test]
    fn grpc_content_types() {
        let yes = |v: &'static str| is_grpc(Some(&HeaderValue::from_static(v)));
        assert!(yes("application/grpc"));
        assert!(yes("application/grpc+proto"));
        assert!(yes("Application/GRPC+json"));
        assert!(yes("application/grpc; charset=utf-8"));
        assert!(!yes("application/grpc-web"));
        assert!(!yes("application/grpc-web+proto"));
        assert!(!yes("application/grpcx"));
        assert!(!yes("application/json"));
        assert!(!yes("application/gr"));
        assert!(!is_grpc(None));
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            encode_message("rate limit exceeded on route a; retry after 2 s"),
            "rate limit exceeded on route a; retry after 2 s"
        );
        assert_eq!(encode_message("100% \u{e9}\n"), "100%25 %C3%A9%0A");
    }

    #[test]
    fn http_statuses_map_to_grpc_codes() {
        assert_eq!(GrpcStatus::for_http(429), GrpcStatus::ResourceExhausted);
        assert_eq!(GrpcStatus::for_http(503), GrpcStatus::Unavailable);
        assert_eq!(GrpcStatus::for_http(504), GrpcStatus::Unavailable);
        assert_eq!(GrpcStatus::for_http(400), GrpcStatus::InvalidArgument);
        assert_eq!(GrpcStatus::for_http(404), GrpcStatus::Unimplemented);
        assert_eq!(GrpcStatus::for_http(418), GrpcStatus::Unknown);
        assert_eq!(GrpcStatus::ResourceExhausted.value(), "8");
    }

    #[test]
    fn trailers_only_head() {
        let h = answer(GrpcStatus::ResourceExhausted, "slow down", true).unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.headers["content-type"], "application/grpc");
        assert_eq!(h.headers["grpc-status"], "8");
        assert_eq!(h.headers["grpc-message"], "slow down");
        assert!(!h.headers.contains_key("content-length"));
        let h1 = answer(GrpcStatus::Unavailable, "x", false).unwrap();
        assert_eq!(h1.headers["content-length"], "0");
    }
}
