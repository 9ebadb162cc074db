//! What Pingora's own error log says about a request.
//!
//! Two rules: a client that goes away (closes the tab, cancels a download, resets an h2
//! stream) is ordinary traffic, counted in `slidegate_client_aborts_total` and logged at debug
//! level, never an ERROR line per request; an upstream refusing connections is one WARN line
//! per upstream per 10 s with the count since the last (`slidegate_upstream_connect_failures_total`
//! counts them all); and no line written at the default level carries a
//! query string or a header value, so tokens in URLs and credentials stay out of the log (an
//! upstream head Pingora could not parse is summarised by [`head`], never written out).

use pingora::{Error, ErrorSource, ErrorType};
use prometheus::{register_int_counter, IntCounter};
use std::sync::LazyLock;

use pingora::proxy::Session;

pub mod head;

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

/// Could the proxy not connect to an upstream server? (What `fail_to_connect` sees.)
pub fn is_connect_failure(error: &Error) -> bool {
    *error.esource() == ErrorSource::Upstream
        && matches!(
            error.etype(),
            ErrorType::ConnectTimedout
                | ErrorType::ConnectRefused
                | ErrorType::ConnectNoRoute
                | ErrorType::ConnectError
                | ErrorType::ConnectProxyFailure
                | ErrorType::TLSHandshakeFailure
                | ErrorType::TLSHandshakeTimedout
                | ErrorType::SocketError
                | ErrorType::BindError
        )
}

/// Pingora's `suppress_error_log`: count a client abort and log it at debug level instead;
/// leave out a failed connect `UpstreamPool::connect_failed` already logged (`connect_logged`); write a
/// refused upstream head (from `upstream`) as its summary (Pingora's line would hold the head).
pub fn suppress(session: &Session, connect_logged: bool, upstream: &str, error: &Error) -> bool {
    if connect_logged && is_connect_failure(error) {
        return true;
    }
    if head::may_carry_head(error) {
        refused_head(session, upstream, error);
        return true;
    }
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

/// One WARN line for an upstream response head Pingora refused: its summary ([`head`]), or
/// for a refusal that carries no head its own fixed wording (`Response header larger than
/// ...`), never a causes' text.
fn refused_head(session: &Session, upstream: &str, error: &Error) {
    let what = match head::refused_head(error) {
        Some(summary) => summary.to_string(),
        None => (error.context.as_ref())
            .map(|c| c.as_str())
            .filter(|c| !c.starts_with("buf"))
            .unwrap_or("unparsable")
            .to_owned(),
    };
    log::warn!(
        "upstream {upstream}: response head refused ({what}); answered 502, {}",
        summary(session)
    );
}
