//! `GET /api/v1/top?route=R&minutes=M`: the route's clients with the most denials over the
//! last `M` minutes (1 to 15, default 5; the minute in progress included), at most
//! [`MAX_LISTED`], most denied first:
//!
//! ```json
//! {"route": "api", "minutes": 5, "shared": true,
//!  "clients": [{"key": "tenant-noisy", "inspectable": true, "pk": "…", "denied": 412,
//!               "allowed": 20, "limits": ["api-10s"]}]}
//! ```
//!
//! `key` is the `client` the inspector's window takes (`inspectable`), or the bucket key when
//! the bucket holds only a hash of the value; with `server.admin_show_keys = false` neither is
//! shown, only `pk` (the RateLimit fields' keyed hash, under this proxy's secret). `limits`: the
//! policy names that refused the client. On a shared store (`shared`) the counts are every
//! proxy's (folded every 2 s); on the memory store, this proxy's. Counts are lower bounds,
//! short by at most the route's denials in the span divided by `server.top_clients`
//! ([`crate::top`]).

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::api::{json_response, problem, store_error};
use crate::limiter::top::{TopCount, TopQuery};
use crate::limiter::Store;
use crate::routes::{Route, Rules};
use crate::top::{minute_now, MAX_LISTED};

/// `minutes` when the query gives none.
const DEFAULT_MINUTES: u64 = 5;

/// Longest span asked.
const MAX_MINUTES: u64 = 15;

/// Why a query is refused: its status and the problem's detail.
type Refusal = (StatusCode, String);

/// The route and span a query names, or the 400/404 it gets.
fn parse<'a>(rules: &'a Rules, query: &str) -> Result<(&'a Route, u64), Refusal> {
    let bad = |detail: String| (StatusCode::BAD_REQUEST, detail);
    let (mut route, mut minutes) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let field = match &*k {
            "route" => &mut route,
            "minutes" => &mut minutes,
            other => return Err(bad(format!("unknown query parameter {other:?}"))),
        };
        if field.replace(v.into_owned()).is_some() {
            return Err(bad(format!("query parameter {k:?} given twice")));
        }
    }
    let Some(name) = route.filter(|r| !r.is_empty()) else {
        return Err(bad("missing query parameter \"route\"".into()));
    };
    let minutes = match minutes {
        None => DEFAULT_MINUTES,
        Some(text) => match text.parse::<u64>() {
            Ok(m @ 1..=MAX_MINUTES) => m,
            _ => {
                return Err(bad(format!(
                    "\"minutes\" must be a whole number from 1 to {MAX_MINUTES}, not {text:?}"
                )))
            }
        },
    };
    let Some(route) = rules.routes.iter().find(|r| r.spec.name == name) else {
        return Err((StatusCode::NOT_FOUND, format!("no route named {name:?}")));
    };
    Ok((route, minutes))
}

/// `GET /api/v1/top`.
pub async fn top(
    rules: &Rules,
    store: &dyn Store,
    query: &str,
    show_keys: bool,
) -> Response<Vec<u8>> {
    let (route, minutes) = match parse(rules, query) {
        Ok(asked) => asked,
        Err((status, detail)) => {
            let title = status.canonical_reason().unwrap_or("Refused");
            return problem(status, title, &detail);
        }
    };
    let now = minute_now();
    let shared = store.shares_top();
    // The summary's policy names: on a route with plans, every plan's.
    let names =
        (route.top.as_ref()).map_or_else(|| route.policy_names.clone(), |t| t.limits().to_vec());
    let counts = if shared {
        let query = TopQuery {
            route: route.spec.name.clone(),
            minutes: (now + 1 - minutes..=now).collect(),
            limits: names.clone(),
            max: MAX_LISTED,
        };
        match store.read_top(query).await {
            Ok(counts) => counts,
            Err(e) => return store_error(&e),
        }
    } else {
        // A route without limits limits no one.
        (route.top.as_ref()).map_or_else(Vec::new, |top| top.local_top(now, minutes, MAX_LISTED))
    };
    let clients: Vec<Value> = (counts.iter())
        .map(|c| client(route, &names, c, show_keys))
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "route": route.spec.name,
            "minutes": minutes,
            "shared": shared,
            "clients": clients,
        }),
    )
}

/// One client's entry.
fn client(route: &Route, names: &[String], c: &TopCount, show_keys: bool) -> Value {
    let limits: Vec<&str> = (names.iter().enumerate())
        .filter(|(i, _)| c.refused & 1u64.checked_shl(*i as u32).unwrap_or(0) != 0)
        .map(|(_, name)| name.as_str())
        .collect();
    let mut v = json!({
        "pk": route.partition_key(&c.bucket).as_str(),
        "denied": c.denied,
        "allowed": c.allowed,
        "limits": limits,
    });
    if show_keys {
        let client = route.spec.key.client_of_bucket(&route.spec.name, &c.bucket);
        v["inspectable"] = client.is_some().into();
        v["key"] = client.unwrap_or_else(|| c.bucket.clone()).into();
    }
    v
}
