//! The hop-by-hop fields of an upstream's response: they describe the proxy's connection to
//! the upstream, not the client's, so they are removed before the response goes on (RFC 9110
//! §7.6.1), as nginx does: `Keep-Alive`, `Proxy-Connection`, `TE`, `Upgrade` (but on a `101`,
//! whose `Upgrade` and `Connection` make the switch), and every field the upstream's
//! `Connection` names. `Connection` itself is the client connection's, which Pingora writes.
//! Without this a client saw the upstream's keep-alive terms and any field the upstream meant
//! for the proxy alone.

use http::header::{HeaderName, CONNECTION, CONTENT_LENGTH, TE, TRANSFER_ENCODING, UPGRADE};
use http::StatusCode;
use pingora::http::ResponseHeader;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Remove the hop-by-hop fields of `resp`, an upstream's response head.
pub fn strip(resp: &mut ResponseHeader) {
    if resp.status == StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    let fixed = [KEEP_ALIVE, PROXY_CONNECTION, TE, UPGRADE];
    // One pass over the head's few names, comparing without hashing (this runs on every
    // response): most have no hop-by-hop field but `Connection: keep-alive` (or `close`).
    let mut connection = false;
    let mut hop = false;
    for name in resp.headers.keys() {
        connection |= *name == CONNECTION;
        hop |= fixed.contains(name);
    }
    if !connection && !hop {
        return;
    }
    let options = [&b"keep-alive"[..], b"close", b"upgrade"];
    let named: Vec<HeaderName> = (resp.headers.get_all(CONNECTION).iter())
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty() && !options.iter().any(|o| t.eq_ignore_ascii_case(o)))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        // The framing is the proxy's to keep whatever the upstream lists.
        .filter(|n| *n != CONTENT_LENGTH && *n != TRANSFER_ENCODING)
        .collect();
    if named.is_empty() && !hop {
        return;
    }
    for name in fixed.iter().chain(&named) {
        resp.remove_header(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstreams_hop_by_hop_fields_stay_behind() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        for (name, value) in [
            ("Connection", "keep-alive, X-Secret, Content-Length"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Connection", "keep-alive"),
            ("TE", "trailers"),
            ("Upgrade", "h2c"),
            ("X-Secret", "s"),
            ("X-Kept", "k"),
            ("Content-Length", "2"),
        ] {
            resp.append_header(name, value).unwrap();
        }
        strip(&mut resp);
        for gone in [
            "keep-alive",
            "proxy-connection",
            "te",
            "upgrade",
            "x-secret",
        ] {
            assert!(resp.headers.get(gone).is_none(), "{gone}");
        }
        for kept in ["x-kept", "content-length"] {
            assert!(resp.headers.get(kept).is_some(), "{kept}");
        }
        let mut switch = ResponseHeader::build(101, None).unwrap();
        switch.append_header("Upgrade", "websocket").unwrap();
        strip(&mut switch);
        assert!(switch.headers.get("upgrade").is_some());
    }
}
