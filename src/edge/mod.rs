//! Client connection limits Pingora 0.9 does not have: a deadline for a whole request head
//! (nginx `client_header_timeout`), an idle keep-alive deadline (`keepalive_timeout`) and a cap
//! on concurrent client connections (`worker_connections`), plus coalesced response writes.
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
//! | `stream` | [`EdgeStream`]: its state, and `AsyncRead`/`AsyncWrite` joining the two below |
//! | [`deadline`] | the head / request / idle phases and their deadlines; the hooks that move them |
//! | `coalesce` | holding response writes back to send them together |
//! | `passthrough` | the Pingora stream traits, forwarded to the wrapped stream |

use std::time::Duration;

pub mod cap;
mod coalesce;
pub mod deadline;
mod passthrough;
mod stream;

pub use cap::EdgeApp;
pub use deadline::{head_received, response_done};
pub use stream::EdgeStream;

/// Client connection settings, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Whole request head, from accept or the first byte after a response.
    pub client_header_timeout: Duration,
    /// Idle time between a response and the next request's first byte.
    pub keepalive_timeout: Duration,
    /// Concurrent client connections.
    pub max_connections: u32,
}
