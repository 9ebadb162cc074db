//! slidegate: a Pingora reverse proxy that enforces exact sliding-window rate limits, shared
//! through Redis by any number of proxy instances.
//!
//! Module map (one concern each):
//! - [`config`]: the TOML schema and its validation into typed settings.
//! - [`routes`]: the immutable rule set a request is matched against.
//! - [`keys`]: client address resolution and bucket keys.
//! - [`limiter`]: the store trait and its memory and Redis implementations.
//! - [`ratelimit_headers`]: `RateLimit-Policy`, `RateLimit`, `Retry-After`, problem bodies.
//! - [`metrics`]: Prometheus metrics.
//! - [`proxy`]: Pingora's `ProxyHttp` hooks.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, and the inspector (JSON API and page).
//! - [`reload`]: SIGHUP reload with atomic swap.
//! - [`server`]: assembling the Pingora server.

pub mod admin;
pub mod config;
pub mod keys;
pub mod limiter;
pub mod metrics;
pub mod proxy;
pub mod ratelimit_headers;
pub mod reload;
pub mod routes;
pub mod server;
