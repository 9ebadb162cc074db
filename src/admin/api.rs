//! The inspector's JSON API (the page uses it; so can scripts):
//!
//! - `GET /api/v1/routes`: every route in file order with its limits and decision counters.
//! - `GET /api/v1/window?route=R&client=C`: one bucket, read without recording anything. `C`
//!   is what the route keys by: an address, a value, nothing for `global`, and for a composite
//!   key a JSON list with one entry per part (see [`crate::keys::KeySpec::write_query_key`]).
//! - `POST /api/v1/reset?route=R&client=C`: forget one bucket (and its local deny-cache entry).
//! - `GET /api/v1/top?route=R&minutes=M`: the route's top limited clients ([`super::top`]).
//!
//! A route whose limits have keys of their own (`limits[].key`): the window shows every limit
//! in its own bucket, the one `C` names under that limit's key (a `global` one: the route-wide
//! bucket, the same for every client; a limit whose key cannot read `C` shows an `error`
//! instead of counts). A reset forgets the client's own buckets, never a `global` limit's,
//! which counts every client.
//!
//! Times are milliseconds with microsecond fractions; timestamps are on the store's clock (Redis
//! `TIME` for Redis), milliseconds since the Unix epoch. Errors are `application/problem+json`.

use std::time::Duration;

use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::keys::KeySpec;
use crate::limiter::{LimitView, Store, WindowView};
use crate::response::problem::Problem;
use crate::routes::{Route, Rules};

/// A response of `content_type` with `body`, never cached.
fn body_response(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(body)
        .expect("valid response")
}

/// A JSON response.
pub(super) fn json_response(status: StatusCode, body: &Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(body).expect("a JSON value serializes");
    body_response(status, "application/json", body)
}

/// An RFC 9457 problem response (the body built by [`Problem`], as the proxy's are).
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Response<Vec<u8>> {
    let body = Problem::titled(status, title, detail).to_json();
    body_response(status, crate::response::problem::CONTENT_TYPE, body)
}

fn bad_request(detail: &str) -> Response<Vec<u8>> {
    problem(StatusCode::BAD_REQUEST, "Bad Request", detail)
}

/// Milliseconds, with the microseconds as a fraction.
fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Each limit: its policy name, requests and window, and `key` when it has one of its own
/// (`limits[].key`; absent: the route's).
fn limits_json(route: &Route) -> Vec<Value> {
    (route.spec.limits.iter().enumerate())
        .zip(&route.policy_names)
        .map(|((i, l), name)| {
            let mut v = json!({"name": name, "requests": l.requests, "window_ms": l.window_ms()});
            if let Some(key) = route.spec.limit_keys.key_of(i) {
                v["key"] = key.to_string().into();
            }
            if l.is_lease() {
                // A concurrency limit: `requests` in flight, `window_ms` its lease_ttl.
                v["concurrent"] = true.into();
            }
            v
        })
        .collect()
}

/// `GET /api/v1/routes`.
pub fn routes(rules: &Rules) -> Response<Vec<u8>> {
    let routes: Vec<Value> = rules
        .configured_routes()
        .iter()
        .map(|r| {
            let mut v = json!({
                "name": r.spec.name,
                // The text as configured, and its kind as JSON for the page to act on.
                "key": r.spec.key.to_string(),
                "key_spec": r.spec.key,
                "shadow": r.spec.counting.shadow,
                "limits": limits_json(r),
            });
            for (decision, count) in r.metrics.decision_counts() {
                v[decision.as_str()] = count.into();
            }
            if let Some(plans) = &r.plans {
                // Each plan's limits as this route counts them; the route's own `limits` are
                // the default plan's.
                let each: Vec<Value> = (plans.directory.names().iter().zip(&plans.routes))
                    .map(
                        |(name, &i)| json!({"name": name, "limits": limits_json(&rules.routes[i])}),
                    )
                    .collect();
                v["plans"] = each.into();
                v["plan_default"] = r.spec.plans.as_ref().map(|p| p.chosen_name()).into();
            }
            v
        })
        .collect();
    json_response(StatusCode::OK, &Value::Array(routes))
}

/// The bucket a query names, or the response explaining why it names none.
struct Target<'a> {
    route: &'a Route,
    client: String,
    bucket: String,
    /// Per distinct key of the route's limits with a key of their own (`limits[].key`), in
    /// the order of [`LimitKeys::keys`](crate::config::LimitKeys::keys): its bucket, or why
    /// `client` names none under it. A `global` key's bucket is the route-wide one whatever
    /// the client.
    own: Vec<Result<String, String>>,
}

impl Target<'_> {
    /// The distinct buckets of the route's limits this query names, each with its limits'
    /// indexes, or why the client names none under their key: the client's own bucket first.
    fn groups(&self) -> Vec<(Result<&str, &str>, Vec<usize>)> {
        let spec = &self.route.spec;
        let mut groups: Vec<(Result<&str, &str>, Vec<usize>)> = Vec::new();
        for i in 0..spec.limits.len() {
            let bucket = match spec.limit_keys.of_limit.get(i).copied().unwrap_or(0) {
                0 => Ok(self.bucket.as_str()),
                k => match &self.own[usize::from(k) - 1] {
                    Ok(b) => Ok(b.as_str()),
                    Err(e) => Err(e.as_str()),
                },
            };
            match groups.iter_mut().find(|(b, _)| *b == bucket) {
                Some((_, members)) => members.push(i),
                None => groups.push((bucket, vec![i])),
            }
        }
        groups
    }
}

/// Why a query names no bucket.
enum Rejection {
    /// 400: the query is malformed.
    Bad(String),
    /// 404: no such route.
    NoRoute(String),
}

impl Rejection {
    fn response(self) -> Response<Vec<u8>> {
        match self {
            Rejection::Bad(detail) => bad_request(&detail),
            Rejection::NoRoute(detail) => problem(StatusCode::NOT_FOUND, "Not Found", &detail),
        }
    }
}

fn target<'a>(rules: &'a Rules, query: &str) -> Result<Target<'a>, Rejection> {
    let (mut route, mut client) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let field = match &*k {
            "route" => &mut route,
            "client" => &mut client,
            other => return Err(Rejection::Bad(format!("unknown query parameter {other:?}"))),
        };
        if field.replace(v.into_owned()).is_some() {
            return Err(Rejection::Bad(format!("query parameter {k:?} given twice")));
        }
    }
    let Some(name) = route.filter(|r| !r.is_empty()) else {
        return Err(Rejection::Bad("missing query parameter \"route\"".into()));
    };
    let Some(route) = rules
        .configured_routes()
        .iter()
        .find(|r| r.spec.name == name)
    else {
        return Err(Rejection::NoRoute(format!("no route named {name:?}")));
    };
    target_in(rules, route, client.unwrap_or_default())
}

/// The buckets `client` names on `route` (a configured route, or a plan's copy of one).
fn target_in<'a>(
    rules: &'a Rules,
    route: &'a Route,
    client: String,
) -> Result<Target<'a>, Rejection> {
    let name = &route.spec.name;
    let mut bucket = String::new();
    // The bucket of an address is its network's when `[client_ip]` keys by prefix.
    route
        .spec
        .key
        .write_query_key(&mut bucket, &route.spec.name, &client, |ip| {
            rules.client_ip.key_address(ip)
        })
        .map_err(|e| Rejection::Bad(format!("route {name:?} {e}")))?;
    let own = (route.spec.limit_keys.keys.iter())
        .map(|key| {
            let mut bucket = String::new();
            let client = if *key == KeySpec::Global { "" } else { &client };
            key.write_query_key(&mut bucket, &route.spec.name, client, |ip| {
                rules.client_ip.key_address(ip)
            })
            .map(|()| bucket)
            .map_err(|e| format!("key {key} {e}"))
        })
        .collect();
    Ok(Target {
        route,
        client,
        bucket,
        own,
    })
}

pub(super) fn store_error(e: &crate::limiter::StoreError) -> Response<Vec<u8>> {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Service Unavailable",
        &format!("the limit store did not answer: {e}"),
    )
}

/// On a route with plans, the target as the client's plan counts it (the plan read as a
/// request's would be, uncounted), with the plan's name.
async fn planned<'a>(
    rules: &'a Rules,
    store: &dyn Store,
    t: Target<'a>,
) -> Result<(Target<'a>, Option<&'a str>), Rejection> {
    let Some(plans) = &t.route.plans else {
        return Ok((t, None));
    };
    let client = Some(t.client.as_bytes()).filter(|c| !c.is_empty());
    let plan = plans.directory.plan_of(client, store).await;
    let name = plans.directory.names().get(plan).map(String::as_str);
    let route = plans
        .routes
        .get(plan)
        .map_or(t.route, |&i| &rules.routes[i]);
    Ok((target_in(rules, route, t.client)?, name))
}

/// `GET /api/v1/window?route=R&client=C`.
pub async fn window(rules: &Rules, store: &dyn Store, query: &str) -> Response<Vec<u8>> {
    let planned = match target(rules, query) {
        Ok(t) => planned(rules, store, t).await,
        Err(rejection) => Err(rejection),
    };
    let (t, plan) = match planned {
        Ok(planned) => planned,
        Err(rejection) => return rejection.response(),
    };
    let (now_us, views) = match inspect_all(&t, store).await {
        Ok(read) => read,
        Err(e) => return store_error(&e),
    };
    let limits: Vec<Value> = t
        .route
        .spec
        .limits
        .iter()
        .zip(&t.route.policy_names)
        .zip(&views)
        .map(|((limit, name), lv)| {
            let lv = match lv {
                Ok(lv) => lv,
                // The client names no bucket under this limit's own key.
                Err(why) => {
                    return json!({"name": name, "requests": limit.requests,
                    "window_ms": limit.window_ms(), "error": why})
                }
            };
            json!({
                "name": name,
                "requests": limit.requests,
                "window_ms": limit.window_ms(),
                "remaining": lv.remaining,
                "reset_ms": ms(lv.reset),
                "count": lv.count,
                "entries_ms": lv.entries_us.iter().map(|&t| us_to_ms(t)).collect::<Vec<_>>(),
                "resolution_ms": limit.resolution_us().map(|r| r / 1000),
                // A concurrency limit's `count` is the leases held now, `entries_ms` when each
                // was taken.
                "concurrent": limit.is_lease(),
                // A cost limit (`unit = "cost"`) counts cost units; a settlement higher than
                // the charge may take it past its quota: that excess is its debt.
                "unit": if limit.unit() == crate::limiter::Unit::Cost { "cost" } else { "requests" },
                // What the kind says beyond its entries (a calendar quota's period and its
                // end, at the store's clock), or null.
                "about": crate::limiter::Kind::about(limit.kind, now_us),
                "debt": lv.count.saturating_sub(u64::from(limit.requests)),
                "slots": lv.slots.iter().map(|&(start, count)| json!({
                    "start_ms": us_to_ms(start),
                    "count": count,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "route": t.route.spec.name,
            "client": t.client,
            "plan": plan,
            "backend": store.backend(),
            "now_ms": us_to_ms(now_us),
            "limits": limits,
        }),
    )
}

/// Every limit's view in its bucket (the store's `now` of the last read), or why the client
/// names no bucket under that limit's own key.
async fn inspect_all(
    t: &Target<'_>,
    store: &dyn Store,
) -> Result<(u64, Vec<Result<LimitView, String>>), crate::limiter::StoreError> {
    let limits = &t.route.spec.limits;
    let mut views: Vec<Result<LimitView, String>> = vec![Err(String::new()); limits.len()];
    let mut now_us = 0;
    for (bucket, members) in t.groups() {
        let bucket = match bucket {
            Ok(bucket) => bucket,
            Err(why) => {
                members.iter().for_each(|&i| views[i] = Err(why.to_owned()));
                continue;
            }
        };
        let sub: Vec<_> = members.iter().map(|&i| limits[i]).collect();
        let WindowView {
            now_us: now,
            limits: read,
        } = store.inspect(bucket, &sub).await?;
        now_us = now;
        for (i, view) in members.into_iter().zip(read) {
            views[i] = Ok(view);
        }
    }
    Ok((now_us, views))
}

/// `POST /api/v1/reset?route=R&client=C`.
pub async fn reset(rules: &Rules, store: &dyn Store, query: &str) -> Response<Vec<u8>> {
    let t = match target(rules, query) {
        Ok(t) => t,
        Err(rejection) => return rejection.response(),
    };
    // On a route with plans, the client's buckets under every plan's limits: a plan changed
    // later must not find what this reset was meant to forget.
    let copies = t.route.plans.as_ref().map_or(&[][..], |p| &p.routes[..]);
    for &i in copies {
        let copy = match target_in(rules, &rules.routes[i], t.client.clone()) {
            Ok(copy) => copy,
            Err(rejection) => return rejection.response(),
        };
        if let Err(e) = reset_target(&copy, store).await {
            return store_error(&e);
        }
    }
    if copies.is_empty() {
        if let Err(e) = reset_target(&t, store).await {
            return store_error(&e);
        }
    }
    // The client (maybe an API key) stays out of the log.
    log::info!("admin: reset one bucket of route {}", t.route.spec.name);
    json_response(
        StatusCode::OK,
        &json!({"route": t.route.spec.name, "client": t.client, "reset": true}),
    )
}

/// Forget the client's own buckets of `t`: a limit under a `global` key of its own counts every
/// client, so one client's reset leaves it (the route's key `global` resets the route-wide
/// bucket).
async fn reset_target(t: &Target<'_>, store: &dyn Store) -> Result<(), crate::limiter::StoreError> {
    let limits = &t.route.spec.limits;
    for (bucket, members) in t.groups() {
        let shared = members
            .iter()
            .all(|&i| t.route.spec.limit_keys.key_of(i) == Some(&KeySpec::Global));
        let Some(bucket) = bucket.ok().filter(|_| !shared) else {
            continue;
        };
        let sub: Vec<_> = members.iter().map(|&i| limits[i]).collect();
        store.reset(bucket, &sub).await?;
    }
    Ok(())
}
