//! The inspector page: plain HTML, CSS and JavaScript compiled into the binary and served by the
//! admin listener itself (no CDN, no build step). The script only talks to `/api/v1/*` of the
//! origin it was loaded from; the Content-Security-Policy allows nothing else.

use http::{Response, StatusCode};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const TOP_JS: &str = include_str!("assets/top.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// Only same-origin scripts, styles and fetches; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The embedded file served at `path`, if any.
pub fn asset(path: &str) -> Option<Response<Vec<u8>>> {
    let (body, content_type) = match path {
        "/" | "/index.html" => (INDEX_HTML, "text/html; charset=utf-8"),
        "/assets/app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "/assets/top.js" => (TOP_JS, "text/javascript; charset=utf-8"),
        "/assets/style.css" => (STYLE_CSS, "text/css; charset=utf-8"),
        _ => return None,
    };
    Some(
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::CONTENT_LENGTH, body.len())
            // The binary is the version: revalidate rather than cache across upgrades.
            .header(http::header::CACHE_CONTROL, "no-cache")
            .header(http::header::CONTENT_SECURITY_POLICY, CSP)
            .header(http::header::X_CONTENT_TYPE_OPTIONS, "nosniff")
            .header(http::header::REFERRER_POLICY, "no-referrer")
            .body(body.as_bytes().to_vec())
            .expect("valid response"),
    )
}
