//! What slidegate does to an upstream's response head before a client sees it, beyond
//! hop-by-hop fields (`crate::response::hop_by_hop`): on a route it limits, the rate-limit fields are
//! its own, so the upstream's go (a forged `r=999` must not reach a client beside or instead of
//! slidegate's); and an interim `1xx` never carries slidegate's fields, which belong to the
//! final response (RFC 9110 §15.2: a `1xx` is not the answer).

use http::{HeaderName, StatusCode};
use pingora::http::ResponseHeader;

use crate::metrics::Decision;
use crate::routes::Route;

/// Whether `name` is a rate-limit field: the draft's `RateLimit` and `RateLimit-Policy`, the
/// earlier drafts' `RateLimit-Limit`, `-Remaining`, `-Reset` (Kong still sends them), and the
/// whole `X-RateLimit-*` / `X-Rate-Limit-*` families (GitHub's `X-RateLimit-Used`, Kong's
/// `X-RateLimit-Remaining-Minute`, Twitter's `X-Rate-Limit-Limit`). `HeaderName`s are lower
/// case.
pub(super) fn is_ratelimit_field(name: &HeaderName) -> bool {
    let n = name.as_str();
    n == "ratelimit"
        || n.starts_with("ratelimit-")
        || n.starts_with("x-ratelimit")
        || n.starts_with("x-rate-limit")
}

/// Remove every rate-limit field ([`is_ratelimit_field`]) from `head`; how many names went.
pub(super) fn drop_ratelimit_fields(head: &mut ResponseHeader) -> usize {
    // Names first: the head cannot change while its names are borrowed. No allocation when
    // the upstream sent none (the common case).
    let found: Vec<HeaderName> = (head.headers.keys())
        .filter(|n| is_ratelimit_field(n))
        .cloned()
        .collect();
    for name in &found {
        head.remove_header(name);
    }
    found.len()
}

/// Whether slidegate owns the rate-limit fields of `route`'s responses to a request it decided
/// as `decision`: on a limited route, unless the route is a shadow one (it changes nothing a
/// client sees, so the app's own fields pass as they would without slidegate) or the client
/// is exempt (not limited here, like a request on a route without limits). A request the store
/// could not decide (`error_allowed`, `local_*`) is still on a route slidegate limits: the
/// app's fields would otherwise show only during an outage.
pub(super) fn owns_ratelimit_fields(route: &Route, decision: Option<Decision>) -> bool {
    route.spec.is_limited() && !route.spec.counting.shadow && decision != Some(Decision::Exempt)
}

/// An interim response (`1xx` but `101`, which is the final response of an upgrade): it is
/// followed by the real head, which takes the decision's fields.
pub(super) fn is_interim(status: StatusCode) -> bool {
    status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rate_limit_family_is_dropped_and_nothing_else() {
        let mut h = ResponseHeader::build(200, None).unwrap();
        for (name, value) in [
            ("RateLimit", "\"x\";r=999"),
            ("RateLimit-Policy", "\"x\";q=1000"),
            ("RateLimit-Remaining", "999"),
            ("X-RateLimit-Limit", "1000"),
            ("x-ratelimit-remaining-minute", "999"),
            ("X-RateLimit-Used", "1"),
            ("X-Rate-Limit-Reset", "1"),
            ("X-Kept", "k"),
            ("Retry-After", "5"),
            ("X-Ratelimited-By", "app"),
        ] {
            h.append_header(name, value).unwrap();
        }
        h.append_header("RateLimit", "\"y\";r=1").unwrap();
        // `X-Ratelimited-By` is of the family by its prefix: dropped too.
        assert_eq!(drop_ratelimit_fields(&mut h), 8);
        let mut left: Vec<&str> = h.headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["retry-after", "x-kept"]);
        assert_eq!(drop_ratelimit_fields(&mut h), 0);
    }

    #[test]
    fn only_a_101_is_final_among_1xx() {
        assert!(is_interim(StatusCode::CONTINUE));
        assert!(is_interim(StatusCode::from_u16(103).unwrap()));
        assert!(is_interim(StatusCode::from_u16(199).unwrap()));
        assert!(!is_interim(StatusCode::SWITCHING_PROTOCOLS));
        assert!(!is_interim(StatusCode::OK));
    }
}
