//! RFC 9457 problem details: the one builder of the `application/problem+json` bodies slidegate
//! writes itself, on the proxy listener (400, 404, 429, 503) and the admin API.

use http::StatusCode;

use crate::limiter::Verdict;
use crate::response::ratelimit_headers::retry_after_secs;

/// The media type of every problem body.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// The problem type registered for quota errors (draft-ietf-httpapi-ratelimit-headers-10 §5.1:
/// "the requests sent by the client exceed one or more Quota Policies", with the extension
/// member `violated-policies`, the names of those policies).
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The title registered for [`QUOTA_EXCEEDED_TYPE`] (draft-ietf-httpapi-ratelimit-headers-10
/// §10.2.1; the longer title of the §5.1 example is not the registered one): RFC 9457 asks
/// that a type's title not vary between occurrences.
pub const QUOTA_EXCEEDED_TITLE: &str = "Quota Exceeded";

/// One problem body. Serialized from a struct, so no map is built per request, and the members
/// always come in the same order.
#[derive(Debug, serde::Serialize)]
pub struct Problem<'a> {
    /// Problem type URI (`about:blank` when the status says it all).
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// A short summary; the status's reason phrase for `about:blank`.
    pub title: &'a str,
    /// HTTP status code.
    pub status: u16,
    /// Human-readable explanation.
    pub detail: &'a str,
    /// The policies a 429 violated.
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none")]
    pub violated_policies: Option<Vec<&'a str>>,
}

impl<'a> Problem<'a> {
    /// An `about:blank` problem for `status`, titled with its reason phrase.
    pub fn new(status: StatusCode, detail: &'a str) -> Self {
        Problem::titled(status, status.canonical_reason().unwrap_or(""), detail)
    }

    /// An `about:blank` problem for `status` with its own `title`.
    pub fn titled(status: StatusCode, title: &'a str, detail: &'a str) -> Self {
        Problem {
            kind: "about:blank",
            title,
            status: status.as_u16(),
            detail,
            violated_policies: None,
        }
    }

    /// The `application/problem+json` bytes.
    pub fn to_json(&self) -> Vec<u8> {
        // Only strings and an integer: serializing cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a denial says: the route and how long to wait (the problem's `detail`, a gRPC
/// denial's `grpc-message`).
pub fn quota_detail(route: &str, verdict: &Verdict) -> String {
    format!(
        "rate limit exceeded on route {route}; retry after {} s",
        retry_after_secs(verdict)
    )
}

/// The body of a denial (429, or the route's `deny_status`): the quota-exceeded type, naming the violated policies (`names` are the
/// route's policy names, in limit order).
pub fn quota_exceeded(
    route: &str,
    names: &[String],
    verdict: &Verdict,
    status: StatusCode,
) -> Vec<u8> {
    let detail = quota_detail(route, verdict);
    Problem {
        kind: QUOTA_EXCEEDED_TYPE,
        title: QUOTA_EXCEEDED_TITLE,
        status: status.as_u16(),
        detail: &detail,
        violated_policies: Some(verdict.violated().map(|i| names[i].as_str()).collect()),
    }
    .to_json()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_exceeded_names_the_violated_policies() {
        let names = ["login-1s".to_string(), "login-60s".to_string()];
        let v = crate::limiter::fixtures::denied_by_the_first_of_two();
        let body: serde_json::Value = serde_json::from_slice(&quota_exceeded(
            "login",
            &names,
            &v,
            StatusCode::TOO_MANY_REQUESTS,
        ))
        .unwrap();
        assert_eq!(body["violated-policies"], serde_json::json!(["login-1s"]));
        assert_eq!(body["type"], QUOTA_EXCEEDED_TYPE);
        assert_eq!(body["title"], "Quota Exceeded");
        assert_eq!(body["status"], 429);
        assert_eq!(
            body["detail"],
            "rate limit exceeded on route login; retry after 2 s"
        );
    }

    /// The proxy's fixed bodies: members in RFC 9457's order, the reason phrase as title.
    #[test]
    fn about_blank_bytes() {
        let body = Problem::new(StatusCode::NOT_FOUND, "no route matches this request").to_json();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"type":"about:blank","title":"Not Found","status":404,"detail":"no route matches this request"}"#
        );
    }
}
