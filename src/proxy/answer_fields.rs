//! The fields slidegate sets on every response, proxied or its own: `Server`
//! (`server.server_header`, which replaces the upstream's, as nginx hides the upstream's
//! `Server` behind its own) and the route's `response_headers`.

use http::{HeaderName, HeaderValue};
use pingora::http::ResponseHeader;
use pingora::prelude::*;

use crate::config::ResponseHeaders;

/// Spelled out so the field goes out in its usual case on HTTP/1; parsed once (inserted as the
/// pair, the name is neither parsed nor copied per response: `vendor/pingora-http.patch`).
const SERVER: (HeaderName, &str) = (http::header::SERVER, "Server");

/// Set `Server` to `server` (removing any when `None`) and each of `fields`, replacing what
/// the response had under those names. Runs last on a response head, so the operator's value
/// wins over the upstream's and over the proxy's own.
pub(super) fn set(
    header: &mut ResponseHeader,
    server: Option<&HeaderValue>,
    fields: Option<&ResponseHeaders>,
) -> Result<()> {
    match server {
        Some(v) => header.insert_header(SERVER, v.clone())?,
        None => {
            header.remove_header(&http::header::SERVER);
        }
    }
    for field in fields.into_iter().flat_map(ResponseHeaders::iter) {
        header.insert_header(field.spelled.clone(), field.value.clone())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream_head() -> ResponseHeader {
        let mut h = ResponseHeader::build(200, None).unwrap();
        h.append_header("Server", "gunicorn").unwrap();
        h.append_header("Server", "second").unwrap();
        h.append_header("strict-transport-security", "max-age=1")
            .unwrap();
        h.append_header("X-Kept", "yes").unwrap();
        h
    }

    fn values(h: &ResponseHeader, name: &str) -> Vec<String> {
        let all = h.headers.get_all(name).iter();
        all.map(|v| v.to_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn the_server_field_is_replaced_or_removed() {
        let mut h = upstream_head();
        set(&mut h, Some(&HeaderValue::from_static("slidegate")), None).unwrap();
        assert_eq!(values(&h, "server"), ["slidegate"]);
        let mut h = upstream_head();
        set(&mut h, None, None).unwrap();
        assert!(values(&h, "server").is_empty());
        assert_eq!(values(&h, "x-kept"), ["yes"]);
    }

    #[test]
    fn route_fields_replace_the_upstreams_and_keep_the_rest() {
        let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                    [upstreams.app]\nservers = [\"127.0.0.1:3\"]\n[[routes]]\nname = \"r\"\n\
                    upstream = \"app\"\nresponse_headers = { \"Strict-Transport-Security\" = \
                    \"max-age=63072000\", \"X-Frame-Options\" = \"DENY\" }\n";
        let config = crate::config::Config::from_toml("t.toml".as_ref(), text).unwrap();
        let fields = &config.routes[0].answers.response_headers;
        let mut h = upstream_head();
        set(&mut h, None, Some(fields)).unwrap();
        assert_eq!(
            values(&h, "strict-transport-security"),
            ["max-age=63072000"]
        );
        assert_eq!(values(&h, "x-frame-options"), ["DENY"]);
        assert_eq!(values(&h, "x-kept"), ["yes"]);
        // HTTP/1 spells them as the file does, whatever case the upstream used.
        let mut wire = Vec::new();
        h.header_to_h1_wire(&mut wire);
        let wire = String::from_utf8_lossy(&wire);
        assert!(
            wire.contains("Strict-Transport-Security: max-age=63072000"),
            "{wire}"
        );
    }
}
