//! The response fields of a decision: `RateLimit-Policy` / `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-11 (as -10 on the wire), RFC 9651 structured fields; the partition key in
//! [`crate::response::partition_key`]), `Retry-After`, and
//! the older `X-RateLimit-*` trio a route may opt into (`legacy_headers`). The body of a 429 is
//! built in [`crate::response::problem`].

use std::time::Duration;

use crate::keys::KeySpec;
use crate::limiter::{Kind, Limit, Verdict};
use crate::response::partition_key::PartitionKey;

/// Policy name of one limit: `<route>-<window>`, e.g. `login-1s`, `api-60s`, `burst-250ms`;
/// a limit with a key of its own (`limits[].key`) adds `-<key>` ([`key_suffix`]):
/// `chat-60s-global`, `chat-60s-header-x-org`.
pub fn policy_name(route: &str, limit: &Limit, own_key: Option<&KeySpec>) -> String {
    match own_key {
        None => format!("{route}-{}", limit.id().policy_suffix()),
        Some(key) => format!("{route}-{}-{}", limit.id().policy_suffix(), key_suffix(key)),
    }
}

/// A key as a policy name's suffix: its config text lower-cased, every run of characters other
/// than ASCII letters and digits one `-`, none at either end: `global`, `client-ip`,
/// `header-x-org`, and for a list its parts joined (`header-x-api-key-client-ip`). Two keys
/// may come out the same (`header:a_b`, `header:a-b`): the config refuses a route whose
/// policy names repeat.
pub fn key_suffix(key: &KeySpec) -> String {
    let text = match key {
        KeySpec::Composite(parts) => (parts.iter().map(ToString::to_string))
            .collect::<Vec<_>>()
            .join("-"),
        other => other.to_string(),
    };
    let mut out = String::with_capacity(text.len());
    for c in text.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Whole seconds, rounded up: a client told to wait `t` seconds must not come back early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub use crate::limiter::algo::{QuotaUnit, COST_UNIT_PARAM};

/// The unit `limit` counts in: its kind's ([`Kind::quota_unit`]).
pub fn quota_unit(limit: &Limit) -> QuotaUnit {
    limit.kind.quota_unit()
}

/// Append `"name";a=x` to an RFC 9651 list in `out` (`, ` before every item but the first).
fn push_item(out: &mut String, name: &str, param: &str, value: u64) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    out.push('"');
    out.push_str(name);
    out.push('"');
    push_param(out, param, value);
}

/// Append `;a=x`. push_str + itoa: `write!` costs ~10x more here, and this runs on every
/// response.
fn push_param(out: &mut String, param: &str, value: u64) {
    out.push(';');
    out.push_str(param);
    out.push('=');
    out.push_str(itoa::Buffer::new().format(value));
}

/// The `RateLimit-Policy` value for a route's limits (computed once per route at load):
/// `"name";q=<quota>;qu="<unit>";w=<secs>` per limit, `qu` only for a unit other than requests
/// (a cost limit: `slidegate-unit="cost"` instead, see [`QuotaUnit::Cost`]).
/// It carries no `pk`: the field is the same for every client of the route (the draft asks that
/// it stay consistent over a sequence of responses), and the `RateLimit` items carry the `pk`.
pub fn policy_field(names: &[String], limits: &[Limit]) -> String {
    let mut out = String::new();
    for (name, limit) in names.iter().zip(limits) {
        push_item(&mut out, name, "q", u64::from(limit.requests));
        if let Some((param, unit)) = quota_unit(limit).param() {
            out.push(';');
            out.push_str(param);
            out.push_str("=\"");
            out.push_str(unit);
            out.push('"');
        }
        // `w` is an integer number of seconds (sub-second windows round up to 1), when the
        // kind has a fixed window.
        if let Some(w) = limit.kind.policy_window_s(limit.window) {
            push_param(&mut out, "w", w);
        }
    }
    out
}

/// The `RateLimit` value for one decision: `"name";r=<remaining>;t=<secs>;pk=:<base64>:` per
/// limit, the remaining quota, seconds until room frees, and the partition key of the bucket
/// counted in, `pk_of(i)` for limit `i` (one for every limit while a route's limits share its
/// key; a limit with a key of its own, such as `global`, has its own bucket's).
pub fn ratelimit_field<'a>(
    out: &mut String,
    names: &[String],
    verdict: &Verdict,
    pk_of: impl Fn(usize) -> &'a PartitionKey,
) {
    out.clear();
    for (i, (name, state)) in names.iter().zip(&verdict.states).enumerate() {
        push_item(out, name, "r", u64::from(state.remaining));
        push_param(out, "t", ceil_secs(state.reset));
        out.push_str(";pk=:");
        out.push_str(pk_of(i).as_str());
        out.push(':');
    }
}

/// The `X-RateLimit-*` fields of one decision (a route's `legacy_headers`): the values of its
/// tightest limit, the one with the fewest requests left (of those, the one that frees last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Legacy {
    /// `X-RateLimit-Limit`: that limit's quota.
    pub limit: u32,
    /// `X-RateLimit-Remaining`: requests it still admits.
    pub remaining: u32,
    /// `X-RateLimit-Reset`: seconds (rounded up) until room in it frees; on a denial the
    /// `Retry-After` of a limit that denied.
    pub reset: u64,
}

/// The tightest of `limits` in `verdict` (see [`Legacy`]); `None` without limits.
pub fn tightest(limits: &[Limit], verdict: &Verdict) -> Option<Legacy> {
    let (limit, state) = limits
        .iter()
        .zip(&verdict.states)
        .min_by(|(_, a), (_, b)| a.remaining.cmp(&b.remaining).then(b.reset.cmp(&a.reset)))?;
    Some(Legacy {
        limit: limit.requests,
        remaining: state.remaining,
        reset: ceil_secs(state.reset),
    })
}

/// `Retry-After` for a denied verdict: whole seconds, at least 1.
pub fn retry_after_secs(verdict: &Verdict) -> u64 {
    verdict.retry_after().map(ceil_secs).unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_with_its_own_key_names_it_in_its_policy() {
        let limit = Limit::log(2000, Duration::from_secs(60));
        let named = |key: &str| {
            let spec = match key {
                "global" => KeySpec::Global,
                list if list.contains(',') => {
                    KeySpec::from_parts(list.split(',').map(|p| p.parse().unwrap()).collect())
                        .unwrap()
                }
                one => KeySpec::One(one.parse().unwrap()),
            };
            policy_name("chat", &limit, Some(&spec))
        };
        assert_eq!(policy_name("chat", &limit, None), "chat-60s");
        assert_eq!(named("global"), "chat-60s-global");
        assert_eq!(named("header:X-Org"), "chat-60s-header-x-org");
        assert_eq!(named("client_ip"), "chat-60s-client-ip");
        assert_eq!(
            named("header:X-Api-Key,client_ip"),
            "chat-60s-header-x-api-key-client-ip"
        );
    }

    #[test]
    fn fields_are_structured() {
        let limits = [
            Limit::log(5, Duration::from_secs(1)),
            Limit::log(100, Duration::from_secs(60)),
        ];
        let names: Vec<String> = limits
            .iter()
            .map(|l| policy_name("login", l, None))
            .collect();
        assert_eq!(
            policy_field(&names, &limits),
            "\"login-1s\";q=5;w=1, \"login-60s\";q=100;w=60"
        );
        let v = crate::limiter::fixtures::denied_by_the_first_of_two();
        let mut out = String::new();
        let pk =
            crate::response::partition_key::PartitionKeys::new(None, "p").of("login:ip:192.0.2.1");
        ratelimit_field(&mut out, &names, &v, |_| &pk);
        let pk = pk.as_str();
        assert_eq!(
            out,
            format!("\"login-1s\";r=0;t=2;pk=:{pk}:, \"login-60s\";r=40;t=30;pk=:{pk}:")
        );
        assert_eq!(retry_after_secs(&v), 2);
    }

    #[test]
    fn units_other_than_requests_are_named() {
        assert_eq!(QuotaUnit::Requests.param(), None);
        assert_eq!(
            QuotaUnit::ContentBytes.param(),
            Some(("qu", "content-bytes"))
        );
        assert_eq!(
            QuotaUnit::ConcurrentRequests.param(),
            Some(("qu", "concurrent-requests"))
        );
        assert_eq!(QuotaUnit::Cost.param(), Some(("slidegate-unit", "cost")));
        assert_eq!(QuotaUnit::Requests.name(), Some("requests"));
        assert_eq!(QuotaUnit::Cost.name(), None);
        let limit = Limit::log(5, Duration::from_secs(1));
        assert_eq!(quota_unit(&limit), QuotaUnit::Requests);
        let cost = Limit::cost(777, Duration::from_secs(3600), Duration::from_secs(60));
        assert_eq!(quota_unit(&cost), QuotaUnit::Cost);
        assert_eq!(
            policy_field(&["chat-3600s@60s-cost".into()], &[cost]),
            "\"chat-3600s@60s-cost\";q=777;slidegate-unit=\"cost\";w=3600"
        );
    }

    #[test]
    fn the_tightest_limit_has_the_fewest_left() {
        let limits = [
            Limit::log(5, Duration::from_secs(1)),
            Limit::log(100, Duration::from_secs(60)),
        ];
        let v = crate::limiter::fixtures::denied_by_the_first_of_two();
        let legacy = tightest(&limits, &v).unwrap();
        assert_eq!(
            legacy,
            Legacy {
                limit: 5,
                remaining: 0,
                reset: 2
            }
        );
        assert_eq!(legacy.reset, retry_after_secs(&v));
        // A tie on what is left: the limit that frees last.
        let mut tie = v.clone();
        tie.states[1].remaining = 0;
        assert_eq!(tightest(&limits, &tie).unwrap().limit, 100);
        assert_eq!(tightest(&[], &v), None);
    }
}
