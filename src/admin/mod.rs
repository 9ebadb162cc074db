//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (the process answers) and
//! `/readyz` (the limit store answers; 503 until it does).

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::{HttpServer, ServeHttp};
use pingora::protocols::http::ServerSession;
use pingora::services::listening::Service;
use pingora_prometheus::PrometheusHttpApp;

use crate::limiter::Store;

/// The admin HTTP application.
pub struct AdminApp {
    store: Arc<dyn Store>,
}

fn text(status: StatusCode, body: &'static str) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body.as_bytes().to_vec())
        .expect("static response is valid")
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        match session.req_header().uri.path() {
            // pingora-prometheus gathers the default registry our metrics are registered in.
            "/metrics" => PrometheusHttpApp.response(session).await,
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" if self.store.is_ready() => text(StatusCode::OK, "ready\n"),
            "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "store not ready\n"),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

/// The admin service, listening on `addr`.
pub fn admin_service(addr: &str, store: Arc<dyn Store>) -> Service<HttpServer<AdminApp>> {
    let mut service = Service::new(
        "slidegate admin".to_string(),
        HttpServer::new_app(AdminApp { store }),
    );
    service.add_tcp(addr);
    service.threads = Some(1);
    service
}
