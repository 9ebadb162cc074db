//! Which `101 Switching Protocols` may turn a connection into a tunnel.
//!
//! After a 101 the proxy copies bytes both ways without reading them: no later request on that
//! connection is routed or counted. Pingora refuses a 101 to a request that asked for no upgrade;
//! an upstream that answers `101` to `Upgrade: websocket` without naming the protocol it switched
//! to (a buggy or hostile app, or one that answers every request `101`) would still open an
//! uncounted tunnel. So a 101 is passed on only when its `Upgrade` names protocols the request
//! asked for (RFC 9110 §7.8: the server lists the protocols it switches to, which must be among
//! those requested); any other 101 is a broken upstream answer: `502`.

use http::header::UPGRADE;
use http::{HeaderMap, StatusCode};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::{Error, ErrorType};

/// Refuse (`502`) an upstream 101 that [`switch_allowed`] does not allow; any other response
/// passes.
pub fn check_switch(request: &RequestHeader, response: &ResponseHeader) -> pingora::Result<()> {
    if response.status != StatusCode::SWITCHING_PROTOCOLS
        || switch_allowed(&request.headers, &response.headers)
    {
        return Ok(());
    }
    Error::e_explain(
        ErrorType::HTTPStatus(502),
        "upstream 101 names no protocol the request asked for",
    )
}

/// May a 101 with `response` headers switch the connection of a request with `request`
/// headers? Protocols compare case-insensitively, as whole tokens (`websocket`, `h2c`,
/// `HTTP/2.0`).
pub fn switch_allowed(request: &HeaderMap, response: &HeaderMap) -> bool {
    let mut switched = tokens(response).peekable();
    switched.peek().is_some()
        && switched.all(|p| tokens(request).any(|asked| asked.eq_ignore_ascii_case(p)))
}

/// The protocol tokens of every `Upgrade` line, in order; unreadable lines name none.
fn tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim_matches([' ', '\t']))
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(upgrade: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in upgrade {
            h.append(UPGRADE, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_101_must_name_what_was_asked() {
        let ws = headers(&["websocket"]);
        assert!(switch_allowed(&ws, &headers(&["websocket"])));
        assert!(switch_allowed(&ws, &headers(&["WebSocket"])));
        assert!(switch_allowed(
            &headers(&["h2c, websocket"]),
            &headers(&["websocket"])
        ));
        assert!(switch_allowed(
            &headers(&["foo", "websocket"]),
            &headers(&["websocket"])
        ));
        // Switched to nothing, or to something never asked for.
        assert!(!switch_allowed(&ws, &headers(&[])));
        assert!(!switch_allowed(&ws, &headers(&[""])));
        assert!(!switch_allowed(&ws, &headers(&["h2c"])));
        assert!(!switch_allowed(&ws, &headers(&["websocket, h2c"])));
        assert!(!switch_allowed(&ws, &headers(&["websocketx"])));
        // Asked for nothing.
        assert!(!switch_allowed(&headers(&[]), &headers(&["websocket"])));
    }
}
