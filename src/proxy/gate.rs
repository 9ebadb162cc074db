//! [`SlideGate`]: what the proxy holds (the rules, the limiter's layers, the access log, the
//! HTTP/2 timeouts) and how the server builds it; its hooks are in [`super`].

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::limiter::Limiter;
use crate::access_log::AccessLog;
use crate::limiter::Store;
use crate::routes::Rules;

/// The proxy: current rules (hot-swappable) and the limit store.
pub struct SlideGate {
    pub(super) rules: Arc<ArcSwap<Rules>>,
    pub(super) limiter: Limiter,
    pub(super) access_log: Option<AccessLog>,
    /// `server.send_timeout`, for HTTP/2 streams (see `early_request_filter`).
    pub(super) send_timeout: Option<std::time::Duration>,
    /// `server.client_body_timeout`, for HTTP/2 streams (see `request_body_filter`).
    pub(super) body_timeout: Option<std::time::Duration>,
}

impl SlideGate {
    /// A proxy over `rules` (shared with the reloader) deciding with `store`. The store owns
    /// the decision deadline (see [`Store`]): no second timer runs here.
    pub fn new(rules: Arc<ArcSwap<Rules>>, store: Arc<dyn Store>) -> Self {
        SlideGate {
            rules,
            limiter: Limiter::new(store),
            access_log: None,
            send_timeout: None,
            body_timeout: None,
        }
    }

    /// Bound each write of an HTTP/2 response body to `timeout` (`server.send_timeout`).
    pub fn with_send_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.send_timeout = Some(timeout);
        self
    }

    /// Bound a whole HTTP/2 request body to `timeout` (`server.client_body_timeout`; on
    /// HTTP/1 the edge stream bounds it).
    pub fn with_body_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.body_timeout = Some(timeout);
        self
    }

    /// Decide with `local` while the shared store cannot, on routes with `on_error = "local"`,
    /// starting each bucket from what the store last said of it (of at most about
    /// `learned_buckets`: `store.fallback_buckets`).
    pub fn with_local_fallback(
        mut self,
        local: Option<Arc<dyn Store>>,
        learned_buckets: usize,
    ) -> Self {
        self.limiter.set_local(local, learned_buckets);
        self
    }

    /// Send one line per request to `log`.
    pub fn with_access_log(mut self, log: Option<AccessLog>) -> Self {
        self.access_log = log;
        self
    }
}
