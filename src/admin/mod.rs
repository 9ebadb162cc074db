//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers),
//! `/readyz` (should this process get traffic: [`readiness`]; `/readyz?store`: does the limit
//! store answer), and the inspector: the JSON API under
//! `/api/v1/` ([`api`]) and the page on `/` ([`page`]).
//!
//! With `[server] admin_token` set, the inspector (API and page) requires
//! `Authorization: Bearer <token>` (or HTTP Basic with the token as password, so a browser can
//! log in by itself); `/metrics`, `/healthz` and `/readyz` stay open for scrapers and probes.
//! Before the token, [`guard`] refuses foreign `Host`s and cross-site writes, and [`throttle`]
//! slows an address that keeps presenting wrong credentials.

pub mod api;
pub mod guard;
pub mod page;
pub mod readiness;
pub mod stopping;
pub mod throttle;
pub mod top;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use base64::Engine as _;
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::{HttpServer, ServeHttp};
use pingora::protocols::http::ServerSession;
use pingora::services::listening::Service;
use pingora_prometheus::PrometheusHttpApp;

use crate::admin::stopping::Stopping;
use crate::config::{HostMatch, ServerSettings};
use crate::limiter::Store;
use crate::routes::Rules;

/// The admin HTTP application.
pub struct AdminApp {
    store: Arc<dyn Store>,
    rules: Arc<ArcSwap<Rules>>,
    token: Option<String>,
    /// `[server] admin_listen`: its address is one the inspector answers to.
    listen: SocketAddr,
    /// `[server] admin_hosts`.
    hosts: Vec<HostMatch>,
    /// Failed authentications per client address.
    throttle: throttle::Throttle,
    /// SIGTERM received: `/readyz` says 503 until exit.
    stopping: Stopping,
    /// `[server] admin_show_keys`: `/api/v1/top` shows clients' keys, not only their `pk`.
    show_keys: bool,
}

/// What a request's credentials are worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credentials {
    /// No token is set, or the request carries it.
    Valid,
    /// No `Authorization` field: a browser's first visit, before it asks for a login. Not a
    /// failure.
    Missing,
    /// A wrong token, or a field that is none (an unknown scheme, bad Base64).
    Wrong,
}

fn text(status: StatusCode, body: &'static str) -> Response<Vec<u8>> {
    text_owned(status, body.to_string())
}

fn text_owned(status: StatusCode, body: String) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body.into_bytes())
        .expect("a text response is valid")
}

/// `/readyz`, `/readyz?store` and `/readyz?verbose` ([`readiness`]): 200 or 503 with a body
/// saying why.
fn readyz(store: &dyn Store, draining: bool, rules: &Rules, query: &str) -> Response<Vec<u8>> {
    let store_ready = store.is_ready();
    let specs = || rules.configured_routes().iter().map(|r| &r.spec);
    let answer = if readiness::wants_store(query) {
        readiness::of_store(store_ready)
    } else if draining {
        readiness::draining()
    } else {
        readiness::of_routes(store_ready, specs())
    };
    let answer = match readiness::wants_verbose(query) && !readiness::wants_store(query) {
        true => readiness::verbose(answer, draining, (store_ready, store.backend()), specs()),
        false => answer,
    };
    let status = match answer.ready {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    text_owned(status, answer.body)
}

/// Compare without an early exit, so response timing does not reveal how much of a guess was
/// right, nor (both sides hashed to 32 bytes first) how long the token is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let digest = |v: &[u8]| ring::digest::digest(&ring::digest::SHA256, v);
    let (a, b) = (digest(a), digest(b));
    let diff = (a.as_ref().iter().zip(b.as_ref())).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    diff == 0
}

impl AdminApp {
    /// The guard's verdict on this request ([`guard::screen`]).
    fn guarded(&self, session: &ServerSession) -> Result<(), guard::Refusal> {
        let local = session
            .server_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let own: Vec<IpAddr> = std::iter::once(self.listen.ip()).chain(local).collect();
        let req = session.req_header();
        let allowed = guard::Allowed {
            names: &self.hosts,
            own: &own,
        };
        guard::screen(&req.method, req.uri.path(), &req.headers, allowed)
    }

    /// Is this request allowed into the inspector? Failures are slowed per address
    /// ([`throttle`]): an address over its budget is answered `429` before its token is looked at.
    /// Returns the refusal to answer with, if any.
    fn refusal(&self, session: &ServerSession) -> Option<Response<Vec<u8>>> {
        self.token.as_ref()?;
        let ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let now = Instant::now();
        if let Err(wait) = self.throttle.may_try(ip, now) {
            return Some(throttled(wait));
        }
        match self.credentials(session) {
            Credentials::Valid => None,
            Credentials::Missing => Some(unauthorized()),
            Credentials::Wrong => {
                self.throttle.failed(ip, now);
                Some(unauthorized())
            }
        }
    }

    /// The request's credentials against the token.
    fn credentials(&self, session: &ServerSession) -> Credentials {
        let Some(token) = &self.token else {
            return Credentials::Valid;
        };
        let Some(value) = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
        else {
            return Credentials::Missing;
        };
        let Ok(value) = value.to_str() else {
            return Credentials::Wrong;
        };
        match Self::matches(value, token) {
            true => Credentials::Valid,
            false => Credentials::Wrong,
        }
    }

    /// Does the `Authorization` value `value` carry `token`?
    fn matches(value: &str, token: &str) -> bool {
        let (scheme, credentials) = value.trim().split_once(' ').unwrap_or((value, ""));
        let credentials = credentials.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return constant_time_eq(credentials.as_bytes(), token.as_bytes());
        }
        if scheme.eq_ignore_ascii_case("basic") {
            // Any user name; the token is the password.
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(credentials) else {
                return false;
            };
            let password = match decoded.iter().position(|&b| b == b':') {
                Some(i) => &decoded[i + 1..],
                None => return false,
            };
            return constant_time_eq(password, token.as_bytes());
        }
        false
    }
}

/// 429 for an address that failed too often: try again after `wait` (whole seconds, rounded up).
fn throttled(wait: std::time::Duration) -> Response<Vec<u8>> {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut resp = api::problem(
        StatusCode::TOO_MANY_REQUESTS,
        "Too Many Requests",
        "too many failed authentications from this address; retry after Retry-After seconds",
    );
    resp.headers_mut()
        .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    resp
}

/// 401 for the inspector: the Basic challenge makes a browser ask for the token (as password)
/// and resend it with the page's own API calls.
fn unauthorized() -> Response<Vec<u8>> {
    let mut resp = api::problem(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "this admin listener requires Authorization: Bearer <server.admin_token>",
    );
    let headers = resp.headers_mut();
    headers.append(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer realm=\"slidegate admin\""),
    );
    headers.append(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Basic realm=\"slidegate admin\", charset=\"UTF-8\""),
    );
    resp
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if let Err(refusal) = self.guarded(session) {
            let title = refusal.status().canonical_reason().unwrap_or("Refused");
            return api::problem(refusal.status(), title, &refusal.to_string());
        }
        let path = session.req_header().uri.path().to_string();
        match path.as_str() {
            // pingora-prometheus gathers the default registry our metrics are registered in.
            "/metrics" => return PrometheusHttpApp.response(session).await,
            "/healthz" => return text(StatusCode::OK, "ok\n"),
            "/readyz" => {
                let query = session.req_header().uri.query().unwrap_or("");
                let draining = self.stopping.is_draining();
                return readyz(&*self.store, draining, &self.rules.load(), query);
            }
            _ => {}
        }
        if let Some(refusal) = self.refusal(session) {
            return refusal;
        }
        let method = session.req_header().method.clone();
        let query = session.req_header().uri.query().unwrap_or("").to_string();
        let rules = self.rules.load_full();
        match (method, path.as_str()) {
            (Method::GET, "/api/v1/routes") => api::routes(&rules),
            (Method::GET, "/api/v1/window") => api::window(&rules, &*self.store, &query).await,
            (Method::POST, "/api/v1/reset") => api::reset(&rules, &*self.store, &query).await,
            (Method::GET, "/api/v1/top") => {
                top::top(&rules, &*self.store, &query, self.show_keys).await
            }
            (_, "/api/v1/routes" | "/api/v1/window" | "/api/v1/reset" | "/api/v1/top") => {
                api::problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Method Not Allowed",
                    "GET /api/v1/routes, GET /api/v1/window, POST /api/v1/reset, GET /api/v1/top",
                )
            }
            (Method::GET | Method::HEAD, p) => {
                page::asset(p).unwrap_or_else(|| text(StatusCode::NOT_FOUND, "not found\n"))
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

/// The admin service on `[server] admin_listen`, with its `admin_token` and `admin_hosts`.
/// An inspector other hosts can reach without a token lets anyone read and reset buckets:
/// allowed (a private network may be meant), but said at every start.
pub fn admin_service(
    server: &ServerSettings,
    store: Arc<dyn Store>,
    rules: Arc<ArcSwap<Rules>>,
    stopping: Stopping,
) -> Service<HttpServer<AdminApp>> {
    if server.admin_token.is_none() && !server.admin_listen.ip().is_loopback() {
        log::warn!(
            "admin_listen {} is not a loopback address and server.admin_token is not set: \
             anyone who reaches it can read and reset rate-limit buckets",
            server.admin_listen
        );
    }
    let mut service = Service::new(
        "slidegate admin".to_string(),
        HttpServer::new_app(AdminApp {
            store,
            rules,
            token: server.admin_token.as_ref().map(|t| t.expose().to_owned()),
            listen: server.admin_listen,
            hosts: server.admin_hosts.clone(),
            throttle: throttle::Throttle::default(),
            stopping,
            show_keys: server.admin_show_keys,
        }),
    );
    service.add_tcp(&server.admin_listen.to_string());
    service.threads = Some(1);
    service
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_equal_only_when_equal_whatever_their_lengths() {
        use super::constant_time_eq as eq;
        assert!(eq(b"s3cret-token", b"s3cret-token"));
        for other in [
            &b""[..],
            b"s",
            b"s3cret-tokeN",
            b"s3cret-token ",
            b"s3cret-toke",
        ] {
            assert!(!eq(other, b"s3cret-token"), "{other:?}");
        }
    }
}
