//! slidegate: a Pingora reverse proxy that enforces exact sliding-window rate limits, shared
//! through Redis by any number of proxy instances.
//!
//! Module map (one concern each):
//! - [`config`]: the TOML schema and its validation into typed settings.
//! - [`routes`]: the immutable rule set a request is matched against.
//! - [`keys`]: client address resolution and bucket keys.
//! - [`limiter`]: the store trait and its memory and Redis implementations.
//! - [`ratelimit_headers`]: `RateLimit-Policy`, `RateLimit`, `Retry-After`.
//! - [`partition_key`]: the RateLimit fields' `pk`, a keyed hash of the bucket.
//! - [`problem`]: the `application/problem+json` bodies of the proxy and the admin API.
//! - [`grpc`]: the trailers-only answers a refused gRPC call gets instead.
//! - [`metrics`]: Prometheus metrics.
//! - [`request_form`]: method, request-target, Host and Content-Length checks before routing.
//! - [`edge`]: client connection deadlines, the connection cap, coalesced response writes.
//! - [`limits_os`]: the descriptor limit.
//! - [`proxy`]: Pingora's `ProxyHttp` hooks.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, and the inspector (JSON API and page).
//! - [`reload`]: SIGHUP reload with atomic swap.
//! - [`server`]: assembling the Pingora server.
//! - [`pid_file`]: the pid file, and `-s reload|stop|reopen` through it.
//! - [`drain`]: a graceful stop that exits once the last client connection closes.
//! - [`quiet`]: the "zero, and for a while" rule both ends of a graceful stop wait on.
//! - [`healthcheck`]: `slidegate healthcheck`, the probe containers run.
//! - [`state_log`]: WARN lines when a route's limiter changes state (outage, fallback, overflow).
//! - [`tls`]: the listener's certificates by SNI and minimum version (swapped whole on reload),
//!   and upstream TLS peers.
//! - [`forwarding`]: the `X-Forwarded-*` / `X-Real-IP` / `Forwarded` headers sent upstream.
//! - [`access_log`]: one line per request, written by a thread of its own.
//! - [`log_hygiene`]: what Pingora's error log says about a request, and what it leaves out.
//! - [`log_limit`]: the process log, with client-caused noise at DEBUG and a bound on its rate.
//! - [`request_id`]: the `X-Request-Id` each request carries, kept or generated.
//! - [`bench_switch`]: layer switches of a benchmark build (constant `true` in any other).
//! - `allocator`: the global allocator (mimalloc, plain calls where they suffice; cargo
//!   feature `mimalloc`).

pub mod access_log;
pub mod admin;
#[cfg(feature = "mimalloc")]
pub mod allocator;
pub mod bench_switch;
pub mod config;
pub mod cost;
pub mod drain;
pub mod edge;
pub mod forwarding;
pub mod grpc;
pub mod healthcheck;
pub mod hop_by_hop;
pub mod keys;
pub mod limiter;
pub mod limits_os;
pub mod log_hygiene;
pub mod log_limit;
pub mod method_override;
pub mod metrics;
pub mod partition_key;
pub mod pid_file;
pub mod problem;
pub mod proxy;
pub mod quiet;
pub mod ratelimit_headers;
pub mod reload;
pub mod request_form;
pub mod request_id;
pub mod request_path;
pub mod routes;
pub mod server;
pub mod state_log;
pub mod tls;
pub mod upgrade;
