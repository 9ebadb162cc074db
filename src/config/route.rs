//! One `[[routes]]` entry, validated: [`RouteSpec`], grouped by what each part decides: which
//! requests it takes ([`RouteMatch`]), how they are keyed and limited, which of them count
//! ([`Counting`]), what the proxy answers ([`Answers`]) and whether denials wait
//! ([`Smoothing`]). A new route option goes in the group its users read, so a user takes one
//! group rather than the whole entry.

use std::path::PathBuf;
use std::time::Duration;

use http::Method;
use ipnet::IpNet;

use super::{HostMatch, KeySpec, OnError, ResponseHeaders};
use crate::limiter::Limit;
use crate::response::ratelimit_headers::policy_name;

/// One `[[routes]]` entry, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    /// Unique name; used in metric labels and policy names.
    pub name: String,
    /// Which requests the route takes: host, path prefix, methods.
    pub matching: RouteMatch,
    /// Index into [`super::RoutingSpec::upstreams`].
    pub upstream: usize,
    /// How clients are grouped.
    pub key: KeySpec,
    /// Limits, all decided together; empty: the route only proxies (see
    /// [`RouteSpec::is_limited`]).
    pub limits: Vec<Limit>,
    /// `limits[].key`: which limits count under a key of their own instead of `key`.
    pub limit_keys: LimitKeys,
    /// Which requests the limits count, and what happens when they cannot be counted.
    pub counting: Counting,
    /// What the proxy adds to or answers for the route's requests.
    pub answers: Answers,
    /// `max_delay` and `max_queue`: denials for which room frees soon wait for it (`None`: every
    /// denial answers at once).
    pub smoothing: Option<Smoothing>,
    /// `cost`, `max_cost`: what a request weighs in the cost limits (`unit = "cost"`).
    pub cost: crate::request::cost::Cost,
    /// `plan`: the limits above are those of one customer plan ([`RoutePlans::chosen`]); the
    /// rules hold the route once per plan and pick the client's after its key.
    pub plans: Option<RoutePlans>,
}

/// A route's `plan`: where a client's plan is read, and every plan's limits as the route
/// counts them (the plan's own, then the route's `limits`, which every plan shares).
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePlans {
    /// Where each client's plan is read.
    pub source: PlanSource,
    /// The plan of a client the source does not name (an index into `each`).
    pub default: usize,
    /// The plan whose limits the route's `limits` are (an index into `each`).
    pub chosen: usize,
    /// Every `[plans.<name>]`, in name order.
    pub each: Vec<PlanLimits>,
}

impl RoutePlans {
    /// The name of the plan whose limits the route holds.
    pub fn chosen_name(&self) -> &str {
        &self.each[self.chosen].name
    }
}

/// One plan's limits on one route.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanLimits {
    /// The `[plans.<name>]` name.
    pub name: String,
    /// Its limits, then the route's own.
    pub limits: Vec<Limit>,
    /// Which of them count under keys of their own.
    pub limit_keys: LimitKeys,
    /// What a request weighs in its cost limits (the route's `cost` against this plan's quotas).
    pub cost: crate::request::cost::Cost,
}

/// `plan.from`: where a client's plan is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanSource {
    /// `"file:<path>"`: a TOML table of client key to plan name, read with the rules (at start,
    /// on every reload, and when `--watch` sees it change).
    File(PathBuf),
    /// `"redis"`: the hash `<prefix>:plans` (field: the client's key, value: the plan name),
    /// which a billing system writes; each client's entry is read again after `refresh`.
    Redis {
        /// How long a plan read is used before it is read again.
        refresh: Duration,
    },
}

impl RouteSpec {
    /// Whether the route has limits to decide. A route without any only proxies: no store
    /// call, no RateLimit fields, nothing in the inspector to reset. The one place that rule
    /// is written, so that "unlimited" cannot come to mean two things.
    pub fn is_limited(&self) -> bool {
        !self.limits.is_empty()
    }

    /// Whether the route has a concurrency limit, whose leases each request gives back when it
    /// ends.
    pub fn has_leases(&self) -> bool {
        self.limits.iter().any(Limit::is_lease)
    }

    /// Each limit's policy name, in order (`RateLimit-Policy`, `RateLimit`, the inspector):
    /// see [`policy_name`].
    pub fn policy_names(&self) -> Vec<String> {
        let prefix = self.policy_prefix();
        (self.limits.iter().enumerate())
            .map(|(i, l)| policy_name(&prefix, l, self.limit_keys.key_of(i)))
            .collect()
    }

    /// What the policy names start with: the route's name, and on a route with plans the
    /// plan's too (`api-pro`), so that the RateLimit fields and the metrics name the plan.
    pub fn policy_prefix(&self) -> String {
        match &self.plans {
            None => self.name.clone(),
            Some(plans) => format!("{}-{}", self.name, plans.chosen_name()),
        }
    }
}

/// `limits[].key`: the keys a route's limits count under besides the route's own. Each distinct
/// key is computed once per request; a limit without a key of its own (or with the route's)
/// counts under the route's key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitKeys {
    /// The distinct keys other than the route's, in the order limits first name them (at most
    /// [`LimitKeys::MAX`]).
    pub keys: Vec<KeySpec>,
    /// Per limit: 0 for the route's key, `k` for `keys[k - 1]`. Empty when every limit counts
    /// under the route's key (the common case: nothing to compute or look up per limit).
    pub of_limit: Vec<u8>,
}

impl LimitKeys {
    /// Most distinct `limits[].key` per route besides the route's own: each is read from every
    /// request of the route.
    pub const MAX: usize = 8;

    /// The key of its own limit `i` counts under; `None`: the route's.
    pub fn key_of(&self, i: usize) -> Option<&KeySpec> {
        match self.of_limit.get(i).copied().unwrap_or(0) {
            0 => None,
            k => self.keys.get(usize::from(k) - 1),
        }
    }
}

/// `host`, `path_prefix`, `path_case_insensitive` and `methods`: which requests a route takes.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteMatch {
    /// Optional host match.
    pub host: Option<HostMatch>,
    /// Path prefix (default `/`).
    pub path_prefix: String,
    /// Compare the path prefix ignoring ASCII case (for upstreams that route that way, e.g.
    /// Express by default); otherwise paths match case-sensitively, like nginx `location`.
    pub path_case_insensitive: bool,
    /// Methods matched; empty means any.
    ///
    /// When `GET` is listed and `HEAD` is not, `HEAD` is added: as in nginx's
    /// `limit_except GET`, a HEAD request is served by the GET handler, so it must not bypass
    /// a GET-only limit.
    pub methods: Vec<Method>,
}

/// `shadow`, `exempt`, `count_status` and `on_error`: which requests the limits count, and
/// what a request gets when the store cannot count it.
#[derive(Debug, Clone, PartialEq)]
pub struct Counting {
    /// Evaluate and count, never deny.
    pub shadow: bool,
    /// Client networks that skip the limits (IPv4-mapped entries stored as IPv4).
    pub exempt: Vec<IpNet>,
    /// `count_status`: the upstream statuses for which an admission stays counted; after any
    /// other answer the admission is given back. `None`: every admission counts.
    pub count_status: Option<Vec<http::StatusCode>>,
    /// Failure policy for this route (the store default when not overridden).
    pub on_error: OnError,
}

/// `deny_*`, `response_headers` and `legacy_headers`: what the proxy answers or adds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Answers {
    /// What a denied request gets.
    pub deny: DenyAnswer,
    /// `response_headers`: set on every response of the route, proxied or the proxy's own.
    pub response_headers: ResponseHeaders,
    /// `legacy_headers`: also send `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` of the tightest limit wherever the RateLimit fields go.
    pub legacy_headers: bool,
}

/// Smoothing bursts, as nginx's `limit_req burst=.. delay=..`: a request the limits deny, for
/// which room frees within `max_delay`, waits for it and is decided again instead of being
/// denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Smoothing {
    /// The longest a request waits, from its first denial (more than zero, at most 60 s).
    pub max_delay: Duration,
    /// Requests of one bucket waiting at once (1 to [`Smoothing::MAX_QUEUE`]); further
    /// denials of that bucket answer at once.
    pub max_queue: u32,
}

impl Smoothing {
    /// `max_queue` when not configured: 8. A waiter costs a timer and its client's connection
    /// (or HTTP/2 stream) for up to `max_delay`, and the queue is per bucket (per client on a
    /// `client_ip` route): 8 covers the 6 parallel connections a browser opens to one host,
    /// while one client cannot park more than 8 requests on the proxy.
    pub const DEFAULT_QUEUE: u32 = 8;
    /// The largest `max_queue`: beyond it a client parks more requests than any smoothing needs.
    pub const MAX_QUEUE: u32 = 1000;
}

/// What a request the limits deny gets (`deny_status`, `deny_body_file`, `deny_content_type`).
/// `Retry-After` and the RateLimit fields are sent whatever the status and body.
#[derive(Debug, Clone, PartialEq)]
pub struct DenyAnswer {
    /// 429 unless configured (400–599, as nginx's `limit_req_status`).
    pub status: http::StatusCode,
    /// A body of the operator's instead of the problem document; read when the rules are
    /// built (at start and on every reload).
    pub body: Option<DenyBody>,
}

/// A custom deny body: where it is read from and its `Content-Type`.
#[derive(Debug, Clone, PartialEq)]
pub struct DenyBody {
    /// The file, as configured.
    pub file: PathBuf,
    /// Its media type (`deny_content_type`, default `text/plain; charset=utf-8`).
    pub content_type: http::HeaderValue,
}

impl Default for DenyAnswer {
    fn default() -> Self {
        DenyAnswer {
            status: http::StatusCode::TOO_MANY_REQUESTS,
            body: None,
        }
    }
}
