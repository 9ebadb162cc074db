//! `/readyz`: should this process receive traffic?
//!
//! Readiness is per replica, but the limit store (Redis) is shared by every replica: when it is
//! down it is down for all of them at once, and a probe that follows it takes every replica out
//! of a load balancer together (a Kubernetes Service left with no endpoints), turning routes that
//! keep answering under `on_error = "allow"` or `"local"` into a whole-site outage. So, as
//! Envoy's `/ready` and Kong's `/status/ready` do for their rate-limit backends, readiness does
//! not follow the store, with one exception: when the store is down and **every** route fails
//! closed (limited, not `shadow`, `on_error = "deny"`), each request this process could take is
//! refused anyway, and `/readyz` says 503. A route without limits, a shadow route, or one on
//! `allow` or `local` keeps it 200. The store's own state is in the body, in
//! `slidegate_store_ready`, and on `/readyz?store` (200 only while the store answers).
//!
//! From SIGTERM until exit `/readyz` says 503 *draining* whatever the store
//! ([`crate::admin::stopping`]): the process still serves for `shutdown_delay`, so that the
//! endpoints that send it traffic are removed before its listeners close.
//!
//! `/readyz?verbose` answers as `/readyz` with every detail in the body: the phase (serving or
//! draining), the store's state and backend, and what each route answers while the store is
//! down, whether it is down or not.

use crate::config::{OnError, RouteSpec};

/// The answer of `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// 200 or 503.
    pub ready: bool,
    /// A text body naming the store's state and, while it is down, what each route answers.
    pub body: String,
}

/// Does the query ask for the store's own state (`/readyz?store` or `?store=1`)?
pub fn wants_store(query: &str) -> bool {
    query
        .split('&')
        .any(|item| item == "store" || item == "store=1")
}

/// Does the query ask for every detail (`/readyz?verbose` or `?verbose=1`)?
pub fn wants_verbose(query: &str) -> bool {
    query
        .split('&')
        .any(|item| item == "verbose" || item == "verbose=1")
}

/// `/readyz?verbose`: `answer`'s status and first line, then the phase, the store (`backend`)
/// and each route's answer while the store is down.
pub fn verbose<'a>(
    answer: Readiness,
    draining: bool,
    (store_ready, backend): (bool, &str),
    routes: impl IntoIterator<Item = &'a RouteSpec>,
) -> Readiness {
    let mut body = answer.body.lines().next().unwrap_or_default().to_string();
    body.push('\n');
    body.push_str(match draining {
        true => "phase: draining (SIGTERM received)\n",
        false => "phase: serving\n",
    });
    let state = if store_ready { "up" } else { "down" };
    body.push_str(&format!("store: {state} ({backend})\n"));
    for route in routes {
        let name = &route.name;
        body.push_str(&format!(
            "route {name}: while the store is down, {}\n",
            while_down(route)
        ));
    }
    Readiness {
        ready: answer.ready,
        body,
    }
}

/// `/readyz?store`: ready only while the store answers.
pub fn of_store(store_ready: bool) -> Readiness {
    let ready = store_ready;
    let body = if ready {
        "store: up\n"
    } else {
        "store: down\n"
    };
    Readiness {
        ready,
        body: body.to_string(),
    }
}

/// What a route answers while the store is down.
fn while_down(route: &RouteSpec) -> &'static str {
    if !route.is_limited() {
        return "no limits, proxied";
    }
    if route.counting.shadow {
        return "shadow, proxied";
    }
    match route.counting.on_error {
        OnError::Deny => "on_error = \"deny\", 503",
        OnError::Allow => "on_error = \"allow\", proxied without limits",
        OnError::Local => "on_error = \"local\", limited by this process alone",
    }
}

/// Whether a route refuses every request while the store is down.
fn fails_closed(route: &RouteSpec) -> bool {
    route.is_limited() && !route.counting.shadow && route.counting.on_error == OnError::Deny
}

/// `/readyz` after SIGTERM: 503 until exit.
pub fn draining() -> Readiness {
    Readiness {
        ready: false,
        body: "not ready: draining (SIGTERM received; still serving until shutdown_delay \
               ends, then finishing what is in flight)\n"
            .to_string(),
    }
}

/// `/readyz`: see the module documentation for the rule.
pub fn of_routes<'a>(
    store_ready: bool,
    routes: impl IntoIterator<Item = &'a RouteSpec>,
) -> Readiness {
    if store_ready {
        return Readiness {
            ready: true,
            body: "ready\nstore: up\n".to_string(),
        };
    }
    let routes: Vec<&RouteSpec> = routes.into_iter().collect();
    let ready = routes.is_empty() || !routes.iter().all(|r| fails_closed(r));
    let mut body = String::from(if ready {
        "ready\nstore: down\n"
    } else {
        "not ready: the store is down and every route has on_error = \"deny\"\nstore: down\n"
    });
    for route in routes {
        body.push_str(&format!("route {}: {}\n", route.name, while_down(route)));
    }
    Readiness { ready, body }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn routes(toml_routes: &str) -> Vec<RouteSpec> {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
             [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1/0\"\n\
             [upstreams.app]\nservers = [\"127.0.0.1:3\"]\n{toml_routes}"
        );
        let config =
            Config::from_toml(std::path::Path::new("t.toml"), &toml).expect("valid config");
        config.routing.routes
    }

    const LIMITS: &str = "upstream = \"app\"\nlimits = [{ requests = 1, window = \"1s\" }]\n";

    fn route(name: &str, extra: &str) -> String {
        format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"/{name}\"\n{LIMITS}{extra}\n")
    }

    #[test]
    fn a_store_that_answers_is_ready_whatever_the_routes() {
        let all_deny = routes(&route("a", "on_error = \"deny\""));
        let r = of_routes(true, &all_deny);
        assert!(r.ready);
        assert_eq!(r.body, "ready\nstore: up\n");
    }

    #[test]
    fn a_store_down_is_ready_while_some_route_still_serves() {
        for other in [
            "on_error = \"allow\"",
            "on_error = \"local\"",
            "on_error = \"deny\"\nshadow = true",
        ] {
            let rs = routes(&(route("login", "on_error = \"deny\"") + &route("api", other)));
            let r = of_routes(false, &rs);
            assert!(r.ready, "{other}: {}", r.body);
            assert!(r.body.contains("store: down\n"), "{}", r.body);
            assert!(
                r.body.contains("route login: on_error = \"deny\", 503\n"),
                "{}",
                r.body
            );
        }
        // A route without limits never needs the store.
        let rs = routes(
            &(route("login", "on_error = \"deny\"")
                + "[[routes]]\nname = \"rest\"\nupstream = \"app\"\n"),
        );
        let r = of_routes(false, &rs);
        assert!(r.ready, "{}", r.body);
        assert!(
            r.body.contains("route rest: no limits, proxied\n"),
            "{}",
            r.body
        );
    }

    #[test]
    fn a_store_down_is_not_ready_when_every_route_fails_closed() {
        let rs = routes(&(route("a", "on_error = \"deny\"") + &route("b", "on_error = \"deny\"")));
        let r = of_routes(false, &rs);
        assert!(!r.ready, "{}", r.body);
        assert!(r.body.starts_with("not ready"), "{}", r.body);
    }

    #[test]
    fn the_store_query_follows_the_store_alone() {
        assert!(wants_store("store"));
        assert!(wants_store("verbose&store=1"));
        assert!(!wants_store("store=0"));
        assert!(!wants_store(""));
        assert!(!wants_store("restore"));
        assert_eq!(of_store(false).body, "store: down\n");
        assert!(of_store(true).ready);
        assert!(!of_store(false).ready);
    }

    #[test]
    fn verbose_keeps_the_answer_and_names_phase_store_and_every_route() {
        let rs = routes(
            &(route("login", "on_error = \"deny\"") + &route("api", "on_error = \"local\"")),
        );
        assert!(wants_verbose("verbose") && wants_verbose("a=b&verbose=1"));
        assert!(!wants_verbose("verbose=0") && !wants_verbose(""));
        let r = verbose(of_routes(true, &rs), false, (true, "redis"), &rs);
        assert!(r.ready);
        assert_eq!(
            r.body,
            "ready\nphase: serving\nstore: up (redis)\n\
             route login: while the store is down, on_error = \"deny\", 503\n\
             route api: while the store is down, on_error = \"local\", limited by this process alone\n"
        );
        let r = verbose(draining(), true, (false, "redis"), &rs);
        assert!(!r.ready);
        assert!(r.body.starts_with("not ready: draining"), "{}", r.body);
        assert!(r
            .body
            .contains("\nphase: draining (SIGTERM received)\nstore: down (redis)\n"));
    }

    #[test]
    fn draining_is_not_ready() {
        let r = draining();
        assert!(!r.ready);
        assert!(r.body.starts_with("not ready: draining"), "{}", r.body);
    }
}
