//! Client connection limits Pingora 0.9 does not have: a deadline for a whole request head
//! (nginx `client_header_timeout`), an idle keep-alive deadline (`keepalive_timeout`) and a cap
//! on concurrent client connections (`worker_connections`), plus held response writes.
//!
//! Pingora only bounds each *read* of a request head (60 s), so a client trickling a byte every
//! 20 s holds a connection forever, and after the first request an HTTP/1.1 connection waits for
//! the next one without any timeout. Neither can be fixed from a `ProxyHttp` hook: the head is
//! read before the first hook runs. So [`EdgeApp`] wraps the proxy application and puts every
//! accepted stream in an [`EdgeStream`], whose reads carry the deadline of the current phase
//! (see [`deadline`]).
//!
//! One file per concern:
//!
//! | file | owns |
//! |---|---|
//! | [`cap`] | [`EdgeApp`]: the connection cap and the wrapping of each accepted stream |
//! | [`descriptors`] | the descriptor budget: the last descriptors kept for the admin listener, Redis, logs and new clients |
//! | [`tls_accept`] | [`TlsPort`]: the TLS handshake, inside the cap and under `client_header_timeout` |
//! | `stream` | [`EdgeStream`]: its state, and `AsyncRead`/`AsyncWrite` joining the deadlines and the peek (reads) with the held writes |
//! | [`deadline`] | the head / body / request / idle / h2 phases and their deadlines; the hooks that move them |
//! | `peek` | the h2c preface peek, under the head deadline |
//! | `phase` | where a connection is in its life: the one atomic its reads move and the head deadline and refusal log read |
//! | [`h2_conn`] | HTTP/2: the requests-per-connection cap and the streams in flight per connection |
//! | [`first_request`] | the count of accepted connections still silent, which a shutdown waits for |
//! | [`quiet`] | "nothing left, and nothing new for a while": the pure rule both ends of a graceful stop wait on |
//! | `refused` | access log lines for the heads Pingora answers itself (`400`, `405`) and our `408` |
//! | `held_writes` | response writes held back to be sent together, under `send_timeout` |
//! | `passthrough` | the Pingora stream traits, forwarded to the wrapped stream |

use std::time::Duration;

pub mod cap;
pub mod deadline;
pub mod descriptors;
pub mod first_request;
pub mod h2_conn;
mod held_writes;
mod passthrough;
mod peek;
mod phase;
pub mod quiet;
mod refused;
mod stream;
pub mod tls_accept;

pub use cap::EdgeApp;
pub use deadline::{answered_408, body_done, head_received, response_done};
pub use stream::EdgeStream;
pub use tls_accept::TlsPort;

/// Client connection settings, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Whole request head, from accept or the first byte after a response; on HTTP/2 (and for
    /// the h2c preface peek) the connection preface.
    pub client_header_timeout: Duration,
    /// Idle time between a response and the next request's first byte.
    pub keepalive_timeout: Duration,
    /// Whole HTTP/1 request body, from its head.
    pub client_body_timeout: Duration,
    /// Longest a response write may wait for the client to take bytes (nginx `send_timeout`).
    pub send_timeout: Duration,
    /// Concurrent client connections.
    pub max_connections: u32,
    /// Requests per client connection, HTTP/1.1 (Pingora's `keepalive_request_limit`) and
    /// HTTP/2 ([`h2_conn`]) alike.
    pub keepalive_requests: u32,
    /// The drain's bound ([`first_request::window`] is derived from it).
    pub grace_period: Duration,
}
