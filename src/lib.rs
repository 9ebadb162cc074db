//! slidegate: a Pingora reverse proxy that enforces exact sliding-window rate limits, shared
//! through Redis by any number of proxy instances.
//!
//! The modules in the order a request meets them (each folder's `mod.rs` lists its files in
//! the same order):
//! 1. [`edge`]: the client connection: the connection cap, TLS handshakes, header, body and
//!    keep-alive deadlines, an HTTP/2 connection's request cap, held response writes.
//! 2. [`tls`]: the listener's certificates by SNI and minimum version (swapped whole on
//!    reload), and upstream TLS peers.
//! 3. [`request`]: what a request says, checked and read before and while it is routed: its
//!    form, path, method overrides, id, the forwarding fields sent upstream, its cost.
//! 4. [`routes`]: the immutable rule set a request is matched against.
//! 5. [`upstream_health`]: which servers of an upstream are up (active checks, passive
//!    ejection, names looked up again), read by the route's pool when it picks one.
//! 6. [`keys`]: the client a route's key picks, and its bucket keys.
//! 7. [`plans`]: on a route with `plan`, the customer plan whose limits count the client.
//! 8. [`limiter`]: the `Store` contract, its memory and Redis stores, the policies around them.
//! 9. [`proxy`]: Pingora's `ProxyHttp` hooks: gather, decide, forward, answer.
//! 10. [`response`]: what slidegate adds to a response or answers itself: hop-by-hop fields and
//!     upgrades, the RateLimit fields and their `pk`, problem bodies, gRPC answers.
//! 11. [`access_log`]: one line per request, written by a thread of its own.
//!
//! Around the request path:
//! - [`config`]: the TOML schema, validated into the typed model.
//! - [`metrics`]: Prometheus metrics.
//! - [`top`]: the top limited clients of each route (a Space-Saving summary per route, folded
//!   into the shared store), for the inspector.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, and the inspector (JSON API and page).
//! - [`logs`]: the process log and what slidegate writes about itself besides the access log.
//! - [`process`]: the server's assembly, reload, graceful stop, pid file and signals, the
//!   health probe, OS limits, the allocator.
//!
//! That is the order a request meets them; which may use which is another order, the layers
//! `docs/design.md` draws (checked by `tests/it/module_graph.rs`).

pub mod edge;

pub mod tls;

pub mod request;

pub mod routes;

pub mod upstream_health;

pub mod keys;

pub mod plans;

pub mod limiter;

pub mod proxy;

pub mod response;

pub mod access_log;

pub mod config;

pub mod metrics;

pub mod top;

pub mod admin;

pub mod logs;

pub mod process;
