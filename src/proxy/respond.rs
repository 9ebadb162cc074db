//! Responses slidegate writes itself (400, 404, 429, 503: the early outcomes; 502, 503, 504
//! when an upstream fails) and the fields it adds to upstream responses.

use std::sync::LazyLock;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;

use super::answer_fields;
use super::discard::{self, Leftover, DISCARD_MAX};
use super::outcome::Outcome;
use crate::config::ResponseHeaders;
use crate::limiter::{Buckets, Verdict};
use crate::request::form::BadRequest;
use crate::response::grpc::{self, GrpcStatus};
use crate::response::partition_key::PartitionKey;
use crate::response::problem::{self, Problem};
use crate::response::ratelimit_headers::{ratelimit_field, retry_after_secs, Legacy};
use crate::routes::{Route, Rules};

/// Header names of draft-ietf-httpapi-ratelimit-headers-10 (see [`crate::response::ratelimit_headers`]),
/// parsed once, each with its case on HTTP/1: inserted as such a pair, a name added to every
/// limited response is neither parsed nor copied (`vendor/pingora-http.patch`).
const RATELIMIT_POLICY: (HeaderName, &str) = (
    HeaderName::from_static("ratelimit-policy"),
    "RateLimit-Policy",
);
const RATELIMIT: (HeaderName, &str) = (HeaderName::from_static("ratelimit"), "RateLimit");
/// Spelled out so the header goes out in its usual case (Pingora keeps the case it is given);
/// parsed once, as above.
const RETRY_AFTER: (HeaderName, &str) = (http::header::RETRY_AFTER, "Retry-After");

/// The `X-RateLimit-*` fields of `legacy_headers`, spelled as clients know them (parsed once,
/// as above).
const X_LIMIT: (HeaderName, &str) = (
    HeaderName::from_static("x-ratelimit-limit"),
    "X-RateLimit-Limit",
);
const X_REMAINING: (HeaderName, &str) = (
    HeaderName::from_static("x-ratelimit-remaining"),
    "X-RateLimit-Remaining",
);
const X_RESET: (HeaderName, &str) = (
    HeaderName::from_static("x-ratelimit-reset"),
    "X-RateLimit-Reset",
);

/// What the answers that never vary say (problem `detail`, gRPC `grpc-message`).
const NOT_FOUND: &str = "no route matches this request";
const BAD_REQUEST: &str = "malformed request";
const UNAVAILABLE: &str = "rate limiter unavailable";

/// Bodies of the responses that never vary, built once.
static NOT_FOUND_BODY: LazyLock<Bytes> = LazyLock::new(|| fixed(StatusCode::NOT_FOUND, NOT_FOUND));
static BAD_REQUEST_BODY: LazyLock<Bytes> =
    LazyLock::new(|| fixed(StatusCode::BAD_REQUEST, BAD_REQUEST));
static UNAVAILABLE_BODY: LazyLock<Bytes> =
    LazyLock::new(|| fixed(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE));

fn fixed(status: StatusCode, detail: &str) -> Bytes {
    Problem::new(status, detail).to_json().into()
}

/// Who reads an answer of the proxy's own: an HTTP client (status and problem body), or a gRPC
/// client (a trailers-only answer, see [`crate::response::grpc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    Http,
    Grpc {
        /// Over HTTP/2: the head ends the stream; over HTTP/1.1 it says `Content-Length: 0`.
        h2: bool,
    },
}

impl Reader {
    fn of(session: &mut Session) -> Reader {
        let content_type = session.req_header().headers.get(http::header::CONTENT_TYPE);
        match grpc::is_grpc(content_type) {
            true => Reader::Grpc {
                h2: session.as_downstream_mut().is_http2(),
            },
            false => Reader::Http,
        }
    }

    /// The head and body of an answer that never varies: `status` with its problem `body`, or
    /// the gRPC status of `status` saying `detail`.
    fn fixed(self, status: u16, detail: &str, body: &Bytes) -> Result<(ResponseHeader, Bytes)> {
        Ok(match self {
            Reader::Http => (ResponseHeader::build(status, Some(4))?, body.clone()),
            Reader::Grpc { h2 } => (
                grpc::answer(GrpcStatus::for_http(status), detail, h2)?,
                Bytes::new(),
            ),
        })
    }
}

/// The status of a request Pingora could not proxy: nginx's answers, which apps and alerts
/// already know. An upstream that timed out (connect, read or write) is `504`, any other
/// upstream failure `502`; a client that stopped sending in time `408`; a client whose
/// connection is gone gets nothing (`0`); the rest as Pingora decides (`400` for a bad
/// request, `500` for our own failures).
pub(super) fn failure_status(e: &pingora::Error) -> u16 {
    use pingora::{ErrorSource, ErrorType::*};
    match (e.esource(), e.etype()) {
        (_, HTTPStatus(code)) => *code,
        (ErrorSource::Upstream, ConnectTimedout | ReadTimedout | WriteTimedout) => 504,
        (ErrorSource::Upstream, _) => 502,
        (ErrorSource::Downstream, WriteError | ReadError | ConnectionClosed) => 0,
        (ErrorSource::Downstream, ReadTimedout) => 408,
        (ErrorSource::Downstream, _) => 400,
        (ErrorSource::Internal | ErrorSource::Unset, _) => 500,
    }
}

/// Write the response of an outcome slidegate answers itself (400, 404, 429, 503), the one
/// place that knows which those are; `route` is the matched route and `buckets` the buckets
/// the request was counted in, which a `429` needs for its fields. Returns whether a response was written, which is what `request_filter` returns.
/// A small unread body is read and dropped after the answer (see [`discard`]), except after a
/// `400`, which closes.
pub(super) async fn write_early(
    session: &mut Session,
    outcome: &Outcome<'_>,
    route: Option<&Route>,
    rules: &Rules,
    buckets: Option<Buckets<'_>>,
) -> Result<bool> {
    let reader = Reader::of(session);
    let (mut header, body) = match outcome {
        Outcome::BadRequest(why @ (BadRequest::Cost(_) | BadRequest::MethodOverride(_))) => {
            // Well-formed, refused for what it asks: the detail says which field and why, and
            // the connection stays open (the client's next request may be fine).
            let detail = match (why, route) {
                (BadRequest::Cost(cost), Some(route)) => cost.detail(&route.spec.cost.source),
                _ => why.to_string(),
            };
            reader.fixed(400, &detail, &fixed(StatusCode::BAD_REQUEST, &detail))?
        }
        Outcome::BadRequest(_) => {
            // Like nginx: 400 and close; nothing of this request reaches a route.
            session.set_keepalive(None);
            reader.fixed(400, BAD_REQUEST, &BAD_REQUEST_BODY)?
        }
        Outcome::NoRoute => reader.fixed(404, NOT_FOUND, &NOT_FOUND_BODY)?,
        Outcome::ErrorDenied | Outcome::Overloaded => {
            let (mut header, body) = reader.fixed(503, UNAVAILABLE, &UNAVAILABLE_BODY)?;
            header.insert_header(RETRY_AFTER, "1")?;
            (header, body)
        }
        Outcome::Denied(verdict) | Outcome::LocalDenied(verdict) => {
            let (Some(route), Some(buckets)) = (route, buckets) else {
                return Error::e_explain(ErrorType::InternalError, "a 429 without a route");
            };
            too_many_requests(route, verdict, buckets, reader)?
        }
        // The client is gone: nothing to send, the request ends as a client abort (499).
        Outcome::ClientGone => {
            return Error::e_explain(ErrorType::ConnectionClosed, "client left while delayed")
                .map_err(|e| e.into_down())
        }
        Outcome::Unlimited
        | Outcome::Exempt
        | Outcome::ErrorAllowed
        | Outcome::Shadow { .. }
        | Outcome::Allowed(_)
        | Outcome::Delayed(_)
        | Outcome::LocalAllowed(_) => return Ok(false),
    };
    let fields = route.map(|r| &r.spec.answers.response_headers);
    answer_fields::set(&mut header, rules.server_header.as_ref(), fields)?;
    if rules.request_id.echoes() {
        crate::request::id::echo(session.req_header(), &mut header)?;
    }
    let leftover = match outcome {
        Outcome::BadRequest(_) => Leftover::Close,
        _ => discard::leftover(discard::framing(session), DISCARD_MAX),
    };
    discard::prepare(session, leftover);
    match reader {
        Reader::Http => respond(session, header, body).await?,
        Reader::Grpc { .. } => trailers_only(session, header).await?,
    }
    discard::finish(session, leftover).await;
    Ok(true)
}

/// The head and body of a denial for `verdict` on `route`: the route's `deny_status` (429
/// unless configured) and its `deny_body_file`, else the problem document; to a gRPC client
/// `RESOURCE_EXHAUSTED` whatever the status. `Retry-After` and the RateLimit fields (and the
/// `X-RateLimit-*` ones with `legacy_headers`) either way.
fn too_many_requests(
    route: &Route,
    verdict: &Verdict,
    buckets: Buckets<'_>,
    reader: Reader,
) -> Result<(ResponseHeader, Bytes)> {
    let deny = &route.spec.answers.deny;
    let mut header = match reader {
        Reader::Http => ResponseHeader::build(deny.status, Some(6))?,
        Reader::Grpc { h2 } => {
            let detail = problem::quota_detail(&route.spec.name, verdict);
            grpc::answer(GrpcStatus::ResourceExhausted, &detail, h2)?
        }
    };
    if let Some(r) = ratelimit_value(route, verdict, buckets) {
        insert_ratelimit_fields(&mut header, route, r)?;
    }
    if let Some(legacy) = legacy_value(route, verdict) {
        insert_legacy_fields(&mut header, legacy)?;
    }
    header.insert_header(RETRY_AFTER, retry_after_secs(verdict))?;
    if let Reader::Grpc { .. } = reader {
        return Ok((header, Bytes::new()));
    }
    if let (Some(body), Some(kind)) = (&route.deny_body, &deny.body) {
        header.insert_header(http::header::CONTENT_TYPE, kind.content_type.clone())?;
        return Ok((header, body.clone()));
    }
    let body = problem::quota_exceeded(&route.spec.name, &route.policy_names, verdict, deny.status);
    Ok((header, body.into()))
}

/// The `RateLimit` value of `verdict` on `route` for the request counted in `buckets`: each
/// limit's `pk` is its own bucket's (one keyed hash per distinct bucket).
pub(super) fn ratelimit_value(
    route: &Route,
    verdict: &Verdict,
    buckets: Buckets<'_>,
) -> Option<HeaderValue> {
    let mut field = String::with_capacity(72 * route.spec.limits.len());
    let first = route.partition_key(buckets.first());
    let mut own: Vec<(&str, PartitionKey)> = Vec::new();
    if !buckets.is_one() {
        for i in 0..route.spec.limits.len() {
            let b = buckets.of(i);
            if b != buckets.first() && !own.iter().any(|(x, _)| *x == b) {
                own.push((b, route.partition_key(b)));
            }
        }
    }
    let pk_of = |i: usize| {
        let b = buckets.of(i);
        own.iter()
            .find(|(x, _)| *x == b)
            .map_or(&first, |(_, pk)| pk)
    };
    ratelimit_field(&mut field, &route.policy_names, verdict, pk_of);
    HeaderValue::try_from(field).ok()
}

/// The `X-RateLimit-*` values of `verdict` on `route`, when it has `legacy_headers`.
pub(super) fn legacy_value(route: &Route, verdict: &Verdict) -> Option<Legacy> {
    match route.spec.answers.legacy_headers {
        true => crate::response::ratelimit_headers::tightest(&route.spec.limits, verdict),
        false => None,
    }
}

/// Add `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds) to a response.
pub(super) fn insert_legacy_fields(header: &mut ResponseHeader, legacy: Legacy) -> Result<()> {
    // Room for the three, so that each of the head's two maps (names, their case) grows once.
    header.reserve(3);
    header.insert_header(X_LIMIT, legacy.limit)?;
    header.insert_header(X_REMAINING, legacy.remaining)?;
    header.insert_header(X_RESET, legacy.reset)
}

/// An HTTP/1.0 client cannot read chunked framing: send it the body close-delimited (no
/// `Transfer-Encoding`, connection closed at the end), as nginx does. A head without a length
/// from an HTTP/2 upstream is close-delimited already (Pingora would add chunked after this
/// hook; `vendor/pingora-proxy.patch` stops it): its connection closes too.
pub(super) fn close_delimit_for_http10(session: &mut Session, resp: &mut ResponseHeader) {
    if session.req_header().version >= http::Version::HTTP_11 {
        return;
    }
    if resp.headers.contains_key(http::header::TRANSFER_ENCODING) {
        resp.remove_header(&http::header::TRANSFER_ENCODING);
        session.set_keepalive(None);
    } else if !resp.headers.contains_key(http::header::CONTENT_LENGTH) {
        session.set_keepalive(None);
    }
}

/// Add the `RateLimit-Policy` / `RateLimit` pair of one decision to a response.
pub(super) fn insert_ratelimit_fields(
    header: &mut ResponseHeader,
    route: &Route,
    ratelimit: HeaderValue,
) -> Result<()> {
    // Room for both, so that each of the head's two maps (names, their case) grows once.
    header.reserve(1 + usize::from(route.policy_header.is_some()));
    if let Some(p) = &route.policy_header {
        header.insert_header(RATELIMIT_POLICY, p.clone())?;
    }
    header.insert_header(RATELIMIT, ratelimit)
}

/// What a failure answer's problem document says, by status (nginx's statuses, see
/// [`failure_status`]); other codes get their reason phrase.
fn failure_detail(code: u16) -> &'static str {
    match code {
        502 => "the upstream could not be reached or sent an invalid response",
        503 => "the upstream is unavailable",
        504 => "the upstream did not answer in time",
        408 => "the request was not received in time",
        _ => "the request could not be proxied",
    }
}

/// Answer a request Pingora could not proxy with `code` and a problem document, like the 429,
/// instead of Pingora's empty body and `Server: Pingora`; `server` and the route's `fields`
/// as on every response, and the request id when `echo_id`. Nothing is written when a response
/// has already started (Pingora's `write_error_response` checks), and the connection closes.
pub(super) async fn write_failure(
    session: &mut Session,
    code: u16,
    server: Option<&HeaderValue>,
    fields: Option<&ResponseHeaders>,
    echo_id: bool,
) -> Result<()> {
    if let Reader::Grpc { h2 } = Reader::of(session) {
        let mut header = grpc::answer(GrpcStatus::for_http(code), failure_detail(code), h2)?;
        answer_fields::set(&mut header, server, fields)?;
        if echo_id {
            crate::request::id::echo(session.req_header(), &mut header)?;
        }
        let downstream = session.as_downstream_mut();
        // As `write_error_response`: the connection closes, and nothing is written after a
        // response has started.
        downstream.set_keepalive(None);
        if let Some(written) = downstream.response_written() {
            if !written.status.is_informational() || written.status == 101 {
                return Ok(());
            }
        }
        return trailers_only(session, header).await;
    }
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
    let body: Bytes = Problem::new(status, failure_detail(code)).to_json().into();
    let mut header = ResponseHeader::build(status, Some(5))?;
    header.insert_header("Content-Type", problem::CONTENT_TYPE)?;
    header.insert_header("Content-Length", body.len())?;
    header.insert_header("Cache-Control", "private, no-store")?;
    answer_fields::set(&mut header, server, fields)?;
    if echo_id {
        crate::request::id::echo(session.req_header(), &mut header)?;
    }
    session
        .as_downstream_mut()
        .write_error_response(header, body)
        .await
}

/// Write a complete small problem+json response from the proxy itself.
async fn respond(session: &mut Session, mut header: ResponseHeader, body: Bytes) -> Result<()> {
    // A custom deny body brings its own type; everything else is a problem document.
    if !header.headers.contains_key(http::header::CONTENT_TYPE) {
        header.insert_header("Content-Type", problem::CONTENT_TYPE)?;
    }
    header.insert_header("Content-Length", body.len())?;
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
}

/// Write a head that is the whole response: over HTTP/2 one HEADERS frame that ends the stream
/// (the trailers-only form of a gRPC answer; Pingora's `write_response_header` always leaves
/// the stream open for a body), over HTTP/1.1 the head and the end of its empty body.
async fn trailers_only(session: &mut Session, header: ResponseHeader) -> Result<()> {
    let task = pingora::protocols::http::HttpTask::Header(Box::new(header), true);
    session
        .as_downstream_mut()
        .response_duplex_vec(vec![task])
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::failure_status;
    use pingora::{Error, ErrorSource, ErrorType};

    #[test]
    fn failure_bodies_say_what_failed() {
        for code in [502, 503, 504] {
            let status = http::StatusCode::from_u16(code).unwrap();
            let body = crate::response::problem::Problem::new(status, super::failure_detail(code))
                .to_json();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["status"], code);
            assert!(v["detail"].as_str().unwrap().contains("upstream"), "{v}");
        }
    }

    #[test]
    fn failures_get_the_status_nginx_gives() {
        let status = |source, etype| failure_status(&Error::create(etype, source, None, None));
        use ErrorSource::*;
        use ErrorType::*;
        assert_eq!(status(Upstream, ReadTimedout), 504);
        assert_eq!(status(Upstream, ConnectTimedout), 504);
        assert_eq!(status(Upstream, WriteTimedout), 504);
        assert_eq!(status(Upstream, ConnectRefused), 502);
        assert_eq!(status(Upstream, InvalidHTTPHeader), 502);
        assert_eq!(status(Downstream, ReadTimedout), 408);
        assert_eq!(status(Downstream, ConnectionClosed), 0);
        assert_eq!(status(Downstream, InvalidHTTPHeader), 400);
        assert_eq!(status(Internal, ReadTimedout), 500);
        assert_eq!(status(Upstream, HTTPStatus(503)), 503);
    }
}
