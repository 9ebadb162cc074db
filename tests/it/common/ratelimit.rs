//! Reading slidegate's rate-limit answers: the `RateLimit` field, `Retry-After` and the
//! problem+json body of a 429, each parsed strictly so a malformed answer fails the test.

use super::proxy::Reply;

/// One item of a `RateLimit` field: `"<name>";r=<remaining>;t=<secs>;pk=:<base64>:`.
#[derive(Debug, PartialEq, Eq)]
pub struct RateLimitItem {
    /// Policy name, e.g. `login-1s`.
    pub name: String,
    /// Remaining quota.
    pub r: u64,
    /// Seconds until room frees.
    pub t: u64,
    /// The partition key: the bytes of the RFC 9651 Byte Sequence (12 of them).
    pub pk: Vec<u8>,
}

/// Bytes of a partition key as slidegate sends them (96 bits of a keyed hash).
pub const PK_BYTES: usize = 12;

/// Parse a `RateLimit` field value.
pub fn parse_ratelimit(field: &str) -> Vec<RateLimitItem> {
    use base64::Engine as _;
    field
        .split(", ")
        .map(|item| {
            let parse = || -> Option<RateLimitItem> {
                let (name, rest) = item.strip_prefix('"')?.split_once("\";r=")?;
                let (r, rest) = rest.split_once(";t=")?;
                let (t, pk) = rest.split_once(";pk=:")?;
                let pk = base64::engine::general_purpose::STANDARD
                    .decode(pk.strip_suffix(':')?)
                    .ok()
                    .filter(|pk| pk.len() == PK_BYTES)?;
                Some(RateLimitItem {
                    name: name.to_string(),
                    r: r.parse().ok()?,
                    t: t.parse().ok()?,
                    pk,
                })
            };
            parse().unwrap_or_else(|| panic!("malformed RateLimit item {item:?} in {field:?}"))
        })
        .collect()
}

/// The `RateLimit` field of a reply, parsed.
pub fn ratelimit(reply: &Reply) -> Vec<RateLimitItem> {
    parse_ratelimit(
        reply
            .header("ratelimit")
            .unwrap_or_else(|| panic!("no RateLimit field: {reply:?}")),
    )
}

/// The partition key of a reply: every item's, which are one while a route's limits share its
/// key.
pub fn pk(reply: &Reply) -> Vec<u8> {
    let items = ratelimit(reply);
    assert!(items.windows(2).all(|w| w[0].pk == w[1].pk), "{items:?}");
    items[0].pk.clone()
}

/// `(r, t)` of the named policy.
pub fn policy(reply: &Reply, name: &str) -> (u64, u64) {
    let items = ratelimit(reply);
    let item = items
        .iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("no policy {name:?} in {items:?}"));
    (item.r, item.t)
}

/// Retry-After as whole seconds.
pub fn retry_after(reply: &Reply) -> u64 {
    reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {reply:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is not delta-seconds: {reply:?}"))
}

/// The `violated-policies` of a problem+json 429, after checking the body's shape.
pub fn violated(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{reply:?}"
    );
    let body: serde_json::Value = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("429 body is not JSON ({e}): {:?}", reply.body));
    assert_eq!(body["status"], 429, "{body}");
    assert_eq!(
        body["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "{body}"
    );
    // The title the draft registers with the type (RFC 9457: a type's title does not vary).
    assert_eq!(body["title"], "Quota Exceeded", "{body}");
    serde_json::from_value(body["violated-policies"].clone())
        .unwrap_or_else(|e| panic!("violated-policies is not a list of strings ({e}): {body}"))
}
