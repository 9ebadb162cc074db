//! Responses slidegate writes itself (404, 400, 429, 503) and the fields it adds to upstream
//! responses.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;
use std::sync::LazyLock;

use crate::ratelimit_headers::static_problem;
use crate::routes::Route;

/// Header names of draft-ietf-httpapi-ratelimit-headers-10.
pub(super) const RATELIMIT_POLICY: &str = "RateLimit-Policy";
pub(super) const RATELIMIT: &str = "RateLimit";
/// Spelled out so the header goes out in its usual case (Pingora keeps the case it is given).
pub(super) const RETRY_AFTER: &str = "Retry-After";

/// Bodies of the responses that never vary, built once.
pub(super) static NOT_FOUND_BODY: LazyLock<Bytes> =
    LazyLock::new(|| static_problem(StatusCode::NOT_FOUND, "no route matches this request"));
pub(super) static BAD_REQUEST_BODY: LazyLock<Bytes> =
    LazyLock::new(|| static_problem(StatusCode::BAD_REQUEST, "malformed request"));
pub(super) static UNAVAILABLE_BODY: LazyLock<Bytes> =
    LazyLock::new(|| static_problem(StatusCode::SERVICE_UNAVAILABLE, "rate limiter unavailable"));

/// An HTTP/1.0 client cannot read chunked framing: send it the body close-delimited (no
/// `Transfer-Encoding`, connection closed at the end), as nginx does.
pub(super) fn close_delimit_for_http10(session: &mut Session, resp: &mut ResponseHeader) {
    if session.req_header().version == http::Version::HTTP_10
        && resp.headers.contains_key(http::header::TRANSFER_ENCODING)
    {
        resp.remove_header(&http::header::TRANSFER_ENCODING);
        session.set_keepalive(None);
    }
}

/// Add the `RateLimit-Policy` / `RateLimit` pair of one decision to a response.
pub(super) fn insert_ratelimit_fields(
    header: &mut ResponseHeader,
    route: &Route,
    ratelimit: HeaderValue,
) -> Result<()> {
    if let Some(p) = &route.policy_header {
        header.insert_header(RATELIMIT_POLICY, p.clone())?;
    }
    header.insert_header(RATELIMIT, ratelimit)
}

/// Write a complete small response from the proxy itself.
pub(super) async fn respond(
    session: &mut Session,
    mut header: ResponseHeader,
    content_type: &str,
    body: Bytes,
) -> Result<()> {
    header.insert_header("Content-Type", content_type)?;
    header.insert_header("Content-Length", body.len())?;
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
}
