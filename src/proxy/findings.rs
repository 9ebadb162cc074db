//! Finding out what a request's outcome needs, in the order the hooks learn it: the request
//! form, the client, the route, the bucket key and the store's answer ([`SlideGate::find_out`]);
//! then counting the outcome and keeping what the later hooks need of it
//! ([`SlideGate::account`]).

use pingora::proxy::Session;

use super::outcome::{DecidedBy, Findings, Outcome};
use super::{respond, RequestCtx, SlideGate};
use crate::keys::{Ambiguous, KeyInput, KeySpec, PartValue};
use crate::limiter::settle::Ticket;
use crate::limiter::{StoreError, Verdict};
use crate::metrics::METRICS;
use crate::proxy::bench_switch::{on, Layer};
use crate::request::form::{self, BadRequest};
use crate::request::method_override::Methods;
use crate::request::path::normalize_path;
use crate::routes::{Route, Rules};

impl SlideGate {
    /// Find out what [`outcome`] needs, in order: the request form, the route, and for a
    /// limited route the store's answer. Leaves the client, route and key in `ctx`.
    pub(super) async fn find_out(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        rules: &Rules,
    ) -> Findings {
        // The client first: a refused request is logged with its address too.
        let peer = peer_ip(session).unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        let client = rules.client_ip.resolve(peer, &session.req_header().headers);
        ctx.client = Some(client);
        if on(Layer::RequestForm) {
            ctx.form = match form::parse(session.req_header_mut()) {
                Ok(form) => form,
                Err(why) => return Findings::BadForm(why),
            };
        }
        let req = session.req_header();
        let host = ctx.form.host.as_deref();
        let path = normalize_path(form::match_path(req));
        let methods = match Methods::of(&req.method, &req.headers, req.uri.query()) {
            Ok(methods) => methods,
            Err(why) => return Findings::BadForm(why.into()),
        };
        let Some((idx, route)) = rules.find(host, &path, &methods) else {
            return Findings::NoRoute;
        };
        ctx.route = Some(idx);
        // A route with plans is limited as its client's plan says, known after the key.
        if !route.spec.is_limited() && route.plans.is_none() {
            return Findings::Unlimited;
        }
        let exempt = &route.spec.counting.exempt;
        if exempt.iter().any(|net| net.contains(&client)) {
            return Findings::Exempt;
        }
        let input = KeyInput {
            headers: &req.headers,
            query: req.uri.query(),
            method: &req.method,
            path: &path,
            ip: rules.client_ip.key_address(client),
        };
        let key = (route.spec.key).write_request_key(&mut ctx.key, &route.spec.name, &input);
        if key.is_err() {
            return Findings::BadForm(BadRequest::AmbiguousKey);
        }
        let route = match &route.plans {
            None => route,
            Some(plans) => {
                let client = plan_client(&route.spec.key, &input);
                let store = self.limiter.fallback().shared();
                let plan = plans.directory.plan_of(client.as_deref(), &**store).await;
                plans.directory.count(plan);
                let idx = plans.routes.get(plan).copied().unwrap_or(idx);
                ctx.route = Some(idx);
                let route = &rules.routes[idx];
                if !route.spec.is_limited() {
                    return Findings::Unlimited;
                }
                route
            }
        };
        if own_keys(route, &mut ctx.limit_keys, &input).is_err() {
            return Findings::BadForm(BadRequest::AmbiguousKey);
        }
        if route.spec.cost.is_weighted() {
            ctx.cost = match route.spec.cost.of(&req.headers) {
                Ok(cost) => cost,
                Err(why) => return Findings::BadForm(why.into()),
            };
        }
        let max_delayed = rules.max_delayed;
        let buckets = ctx.buckets(route);
        self.limiter
            .decide(session, &buckets, route, max_delayed, ctx.cost)
            .await
    }

    /// Count an outcome and keep what the later hooks need of it; `store_error` is why the
    /// store gave no verdict, if it did not (named in the route's state log line).
    pub(super) fn account(
        &self,
        ctx: &mut RequestCtx,
        route: Option<&Route>,
        outcome: &Outcome<'_>,
        store_error: Option<&StoreError>,
    ) {
        if let (Some(route), Some(decision)) = (route, outcome.decision()) {
            ctx.record(route, decision);
        }
        if let (Some(route), Some(state)) = (route, outcome.limiter_state()) {
            let cause = store_error.map(|e| e as &dyn std::fmt::Display);
            route.state_log.note_cause(&route.spec.name, state, cause);
        }
        match (outcome, route) {
            (Outcome::BadRequest(why), _) => {
                log::debug!("400: {why}");
                ctx.refused = Some(*why);
                METRICS.bad_requests.inc();
            }
            (Outcome::NoRoute, _) => METRICS.no_route.inc(),
            (Outcome::Shadow { denied: true, .. }, Some(route)) => {
                log::debug!("route {}: shadow deny for {}", route.spec.name, ctx.key);
            }
            // A shadow route's admission holds its leases too, or they would count until
            // their deadline.
            (Outcome::Shadow { verdict, by, .. }, Some(route)) => {
                self.take_leases(ctx, route, verdict, *by);
            }
            (
                Outcome::Allowed(verdict)
                | Outcome::Delayed(verdict)
                | Outcome::LocalAllowed(verdict),
                Some(route),
            ) => {
                ctx.ratelimit = respond::ratelimit_value(route, verdict, ctx.buckets(route));
                ctx.legacy = respond::legacy_value(route, verdict);
                let by = match outcome {
                    Outcome::LocalAllowed(_) => DecidedBy::Local,
                    _ => DecidedBy::Store,
                };
                // `count_status` or `settle` may correct the admission once the upstream answers.
                let corrected =
                    route.spec.counting.count_status.is_some() || route.spec.cost.settle.is_some();
                if let (true, Some(recorded_at)) = (corrected, verdict.recorded_times()) {
                    ctx.ticket = Some(Ticket::new(recorded_at, by, ctx.cost));
                }
                self.take_leases(ctx, route, verdict, by);
            }
            _ => {}
        }
        if let Some(route) = route {
            ctx.refused_by = count_limits(route, outcome, ctx.cost);
            note_top(route, outcome, &ctx.key, ctx.refused_by);
        }
        if let Some(route) = route.filter(|r| r.spec.cost.is_weighted()) {
            count_cost(route, outcome, ctx.cost);
        }
    }

    /// An admission of a route with concurrency limits holds their leases until the request
    /// ends (see [`crate::limiter::lease`]).
    fn take_leases(&self, ctx: &mut RequestCtx, route: &Route, verdict: &Verdict, by: DecidedBy) {
        if let (true, Some(recorded_at)) = (route.spec.has_leases(), verdict.recorded_times()) {
            let bucket = (ctx.key.as_str(), ctx.limit_keys.as_slice());
            ctx.lease = self.limiter.hold_leases(route, bucket, recorded_at, by);
        }
    }
}

/// `slidegate_limit_admissions_total` / `_denials_total`: an admission in every limit of its
/// route, a denial under each limit that had no room for it (its remaining below what the
/// request weighs there: 1, or a cost limit's cost). Shadow verdicts are not counted: nothing
/// was refused. Returns the refusing limits, one bit each (see `RequestCtx::refused_by`).
fn count_limits(route: &Route, outcome: &Outcome<'_>, cost: u32) -> u64 {
    let (verdict, admitted) = match outcome {
        Outcome::Allowed(v) | Outcome::Delayed(v) | Outcome::LocalAllowed(v) => (v, true),
        Outcome::Denied(v) | Outcome::LocalDenied(v) => (v, false),
        _ => return 0,
    };
    let mut refused = 0;
    let limits = route.spec.limits.iter().zip(&verdict.states);
    for (i, ((limit, state), (admissions, denials))) in
        limits.zip(&route.metrics.limits).enumerate()
    {
        if admitted {
            admissions.inc();
        } else if state.remaining < limit.weighted(cost.max(1)).weight {
            denials.inc();
            refused |= 1u64.checked_shl(i as u32).unwrap_or(0);
        }
    }
    refused
}

/// The route's top limited clients: a decided request of its client, O(1) under the route's
/// summary's lock (see [`crate::top`]). Shadow verdicts refused nothing.
fn note_top(route: &Route, outcome: &Outcome<'_>, bucket: &str, refused: u64) {
    let denied = match outcome {
        Outcome::Allowed(_) | Outcome::Delayed(_) | Outcome::LocalAllowed(_) => false,
        Outcome::Denied(_) | Outcome::LocalDenied(_) => true,
        _ => return,
    };
    if let (true, Some(top)) = (on(Layer::Metrics), &route.top) {
        let refused = refused.checked_shl(route.top_offset).unwrap_or(0);
        top.record(bucket, denied, refused);
    }
}

/// `slidegate_cost_admitted_total` / `_denied_total`: a decided request's cost in each of its
/// route's cost limits.
fn count_cost(route: &Route, outcome: &Outcome<'_>, cost: u32) {
    let counter = match outcome {
        Outcome::Allowed(_) | Outcome::Delayed(_) | Outcome::LocalAllowed(_) => {
            &METRICS.cost_admitted
        }
        Outcome::Denied(_) | Outcome::LocalDenied(_) => &METRICS.cost_denied,
        _ => return,
    };
    let spec = &route.spec;
    for (limit, policy) in spec.limits.iter().zip(&route.policy_names) {
        if limit.unit() == crate::limiter::Unit::Cost {
            (counter.with_label_values(&[spec.name.as_str(), policy.as_str()]))
                .inc_by(u64::from(cost));
        }
    }
}

/// The customer a route with plans counts: its key's value (`None` for a request without one,
/// keyed by its address, which takes the default plan). The config allows only one-part keys
/// there.
fn plan_client<'a>(key: &KeySpec, input: &KeyInput<'a>) -> Option<std::borrow::Cow<'a, [u8]>> {
    match key {
        KeySpec::One(part) => match part.value_of(input).ok()? {
            PartValue::Text(_, bytes) => Some(bytes),
            PartValue::Ip(_) => None,
        },
        KeySpec::Global | KeySpec::Composite(_) => None,
    }
}

/// The buckets of `route`'s limits with keys of their own (`limits[].key`), each distinct key
/// computed once, into `out` (nothing for a route without any: no allocation).
fn own_keys(route: &Route, out: &mut Vec<String>, input: &KeyInput<'_>) -> Result<(), Ambiguous> {
    let keys = &route.spec.limit_keys.keys;
    out.resize_with(keys.len(), String::new);
    for (key, text) in keys.iter().zip(out.iter_mut()) {
        key.write_request_key(text, &route.spec.name, input)?;
    }
    Ok(())
}

/// The socket peer's address. An IPv4 client of a dual-stack listener (`[::]:8080`) arrives as
/// `::ffff:a.b.c.d`; it is its IPv4 address everywhere (trusted proxies, keys, logs, forwarding
/// headers), or `trusted_proxies = ["10.0.0.0/8"]` would never match behind a dual-stack bind.
pub(super) fn peer_ip(session: &Session) -> Option<std::net::IpAddr> {
    let inet = session.client_addr()?.as_inet()?;
    Some(inet.ip().to_canonical())
}
