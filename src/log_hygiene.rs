//! What Pingora's own error log says about a request.
//!
//! Two rules: a client that goes away (closes the tab, cancels a download, resets an h2
//! stream) is ordinary traffic, counted in `slidegate_client_aborts_total` and logged at debug
//! level, never an ERROR line per request; and no line written at the default level carries a
//! query string or a header value, so tokens in URLs and credentials stay out of the log.

use pingora::{Error, ErrorSource, ErrorType};
use prometheus::{register_int_counter, IntCounter};
use std::sync::LazyLock;

use pingora::proxy::Session;

/// `slidegate_client_aborts_total`.
pub static CLIENT_ABORTS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "slidegate_client_aborts_total",
        "Requests whose client closed or reset the connection before the response was complete"
    )
    .expect("register slidegate_client_aborts_total")
});

/// Register the counter (at zero) before the first request.
pub fn init() {
    LazyLock::force(&CLIENT_ABORTS);
}

/// Did the client go away? Downstream I/O failures: a closed or reset connection, a failed
/// read or write, an h2 stream the client reset.
pub fn is_client_abort(error: &Error) -> bool {
    *error.esource() == ErrorSource::Downstream
        && matches!(
            error.etype(),
            ErrorType::ConnectionClosed
                | ErrorType::ReadError
                | ErrorType::WriteError
                | ErrorType::H2Error
                | ErrorType::ReadTimedout
                | ErrorType::WriteTimedout
        )
}

/// Pingora's `suppress_error_log`: count a client abort and log it at debug level instead.
pub fn suppress(session: &Session, error: &Error) -> bool {
    if !is_client_abort(error) {
        return false;
    }
    CLIENT_ABORTS.inc();
    log::debug!("client went away: {error}, {}", summary(session));
    true
}

/// Pingora's `request_summary` (appended to its error lines): method and path, without the
/// query string or any header.
pub fn summary(session: &Session) -> String {
    let req = session.req_header();
    format!("{} {}", req.method, req.uri.path())
}
