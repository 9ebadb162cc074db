//! The methods an app may read a request as: the one it was sent with, and the method an
//! override names. A route limited to `methods = ["DELETE"]` must take a request an app serves
//! as a `DELETE`, or the override walks past the limit to a catch-all. The request is
//! forwarded as sent; only route matching reads the override.
//!
//! What the frameworks read (their sources, surveyed for issue 52 row 6):
//!
//! | framework | sent methods it overrides | header | parameter | a list (`DELETE, GET`) |
//! |---|---|---|---|---|
//! | Express `method-override` 3 | `POST` (option `methods`: any) | `X-HTTP-Method-Override` | a query name the app picks, via `querystring` (percent-decoded) | the first item (split at `,`) |
//! | Rails (`Rack::MethodOverride`) | `POST` (option `allowed_methods`) | `HTTP_X_HTTP_METHOD_OVERRIDE` (CGI: `X_HTTP_METHOD_OVERRIDE` too) | `_method` in the form body | none (the whole value is no method) |
//! | Symfony, Laravel | `POST` | `X-HTTP-METHOD-OVERRIDE` (PHP's `HTTP_*`: the `_` spelling too) | `_method`, body then query (Laravel turns it on) | `400` (not `[A-Z]+`) |
//! | Flask (the docs' `HTTPMethodOverrideMiddleware`) | any | `HTTP_X_HTTP_METHOD_OVERRIDE` (WSGI: the `_` spelling too) | `__METHOD_OVERRIDE__` in the query (snippet 38) | none |
//! | Slim 4 `MethodOverrideMiddleware` | any (header); `POST` (body) | `X-Http-Method-Override` | `_METHOD` in the body | none (not a token) |
//! | others (ArangoDB, Phalcon, WAI) | any | also `X-HTTP-Method`, `X-Method-Override` | `_method_override` (WAI) | — |
//!
//! So the rule is the union of what any of them honours: on **every** method, the three header
//! fields under any CGI spelling (`_` for `-`, as [`crate::keys::canonical`] reads key
//! headers), and the query parameters `_method`, `_method_override` and
//! `__method_override__` (names compared decoded and case-insensitively, as PHP registers
//! them), their values percent-decoded (`DEL%45TE`) and upper-cased. A value that is a list
//! is read item by item, and every field and parameter of the request must name **one**
//! method: `DELETE, GET`, or `X-HTTP-Method-Override: PUT` beside `_method=DELETE`, is refused
//! (`400`, [`AmbiguousOverride`]). Express would serve the first item and Rails nothing, so no
//! one route is right for such a request, the same reason a key given twice with different
//! values is refused; taking the first item would let a client reach Express's handler of
//! one method while counted under another. The same method named twice is fine. An item that
//! is no method token (`DE LETE`) is no override: every framework ignores or refuses it.
//! (An override in a form body is not read: the route is chosen before the body arrives.)

use http::{HeaderMap, HeaderName, Method};
use smallvec::SmallVec;

use crate::keys::canonical::{canonical, cgi_same, php_same};

/// The header fields that name an override method, in their canonical spelling.
const OVERRIDE_FIELDS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The query parameters that name one (lower case; compared as PHP registers names).
const OVERRIDE_PARAMETERS: [&str; 3] = ["_method", "_method_override", "__method_override__"];

/// Longer parameter names are not looked at: even fully percent-encoded, none of the above
/// takes more bytes.
const MAX_PARAMETER_NAME: usize = 3 * 19;

/// A request whose overrides name more than one method: apps differ on which they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the method override names more than one method")]
pub struct AmbiguousOverride;

/// The method a request was sent with, and the one an override names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Methods {
    /// As sent.
    pub sent: Method,
    /// Named by an override, upper-cased as frameworks read it, when other than `sent`
    /// (usually none; never more than one).
    pub overrides: SmallVec<[Method; 1]>,
}

impl Methods {
    /// The methods of a request sent as `method` with `headers` and `query`; an error when
    /// its overrides name two different methods.
    pub fn of(
        method: &Method,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Methods, AmbiguousOverride> {
        let mut named: Option<Method> = None;
        let fields = headers.iter().filter(|(n, _)| is_override_field(n));
        for (_, value) in fields {
            note_items(&mut named, value.as_bytes())?;
        }
        let pairs = query.into_iter().flat_map(|q| q.split(['&', ';']));
        for pair in pairs {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if is_override_parameter(name) {
                note_items(&mut named, &canonical(value.as_bytes()))?;
            }
        }
        Ok(Methods {
            sent: method.clone(),
            overrides: named.filter(|m| m != method).into_iter().collect(),
        })
    }

    /// A request that names no override.
    pub fn sent(method: &Method) -> Methods {
        Methods {
            sent: method.clone(),
            overrides: SmallVec::new(),
        }
    }

    /// Is any of them in `list`?
    pub fn any_in(&self, list: &[Method]) -> bool {
        list.contains(&self.sent) || self.overrides.iter().any(|m| list.contains(m))
    }
}

/// Is `name` an override field in any spelling a CGI server reads as it?
fn is_override_field(name: &HeaderName) -> bool {
    let name = name.as_str();
    // A spelling keeps the length: this runs over every field of every request, so most are
    // ruled out by it before any byte is compared.
    (OVERRIDE_FIELDS.iter()).any(|f| f.len() == name.len() && cgi_same(name, f))
}

/// Is `raw` (as sent) an override parameter's name?
fn is_override_parameter(raw: &str) -> bool {
    if raw.len() > MAX_PARAMETER_NAME {
        return false;
    }
    let name = canonical(raw.as_bytes());
    // PHP's fold keeps the length but for leading spaces: most names are ruled out here,
    // without lower-casing a copy of each.
    let len = name.iter().skip_while(|b| **b == b' ').count();
    if !OVERRIDE_PARAMETERS.iter().any(|p| p.len() == len) {
        return false;
    }
    let name = name.to_ascii_lowercase();
    (OVERRIDE_PARAMETERS.iter()).any(|p| php_same(&name, p.as_bytes()))
}

/// Note each method the list `value` names in `named`; an error at a second, different one.
fn note_items(named: &mut Option<Method>, value: &[u8]) -> Result<(), AmbiguousOverride> {
    for item in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
        let Ok(m) = Method::from_bytes(&item.to_ascii_uppercase()) else {
            continue;
        };
        match named {
            None => *named = Some(m),
            Some(n) if *n == m => {}
            Some(_) => return Err(AmbiguousOverride),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: &str, fields: &[(&str, &str)], query: Option<&str>) -> Vec<String> {
        try_of(method, fields, query).expect("one method")
    }

    fn try_of(
        method: &str,
        fields: &[(&str, &str)],
        query: Option<&str>,
    ) -> Result<Vec<String>, AmbiguousOverride> {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let m = Methods::of(&Method::from_bytes(method.as_bytes()).unwrap(), &h, query)?;
        Ok(m.overrides.iter().map(|m| m.to_string()).collect())
    }

    #[test]
    fn any_method_may_be_read_as_the_method_its_override_names() {
        assert_eq!(
            of("POST", &[("X-HTTP-Method-Override", "DELETE")], None),
            ["DELETE"]
        );
        assert_eq!(of("POST", &[("x-http-method", " put ")], None), ["PUT"]);
        assert_eq!(
            of("POST", &[("X-Method-Override", "patch")], None),
            ["PATCH"]
        );
        assert_eq!(of("POST", &[], Some("a=1&_method=delete")), ["DELETE"]);
        assert_eq!(of("POST", &[], Some("%5Fmethod=DELETE")), ["DELETE"]);
        // Flask and Slim override any method.
        for sent in ["GET", "PUT", "HEAD", "OPTIONS", "PATCH"] {
            assert_eq!(
                of(sent, &[("X-HTTP-Method-Override", "DELETE")], None),
                ["DELETE"],
                "{sent}"
            );
        }
        // The same method, or none that parses, adds nothing.
        assert!(of("POST", &[("X-HTTP-Method-Override", "POST")], None).is_empty());
        assert!(of("POST", &[("X-HTTP-Method-Override", "DE LETE")], None).is_empty());
        let listed = Methods::of(&Method::POST, &HeaderMap::new(), Some("_method=DELETE"));
        assert!(listed.unwrap().any_in(&[Method::DELETE]));
        assert!(!Methods::sent(&Method::POST).any_in(&[Method::DELETE]));
    }

    #[test]
    fn overrides_are_read_in_every_spelling_frameworks_read() {
        for query in [
            "_method=DEL%45TE",
            "_method=%44%45%4c%45%54%45",
            "_method=%22DELETE%22",
            "_method=+DELETE+",
            "_m%65thod=DELETE",
            "_METHOD=delete",
            ".method=DELETE",
            "__METHOD_OVERRIDE__=DELETE",
            "_method_override=DELETE",
            "x=1;_method=DELETE",
        ] {
            assert_eq!(of("POST", &[], Some(query)), ["DELETE"], "{query}");
        }
        for field in [
            "X_HTTP_METHOD_OVERRIDE",
            "x_http_method",
            "X-Method_Override",
            "x_method-override",
        ] {
            assert_eq!(of("GET", &[(field, "DELETE")], None), ["DELETE"], "{field}");
        }
        // Not an override's name.
        assert!(of("POST", &[("x-http-methods", "DELETE")], None).is_empty());
        assert!(of("POST", &[], Some("method=DELETE&_methods=PUT")).is_empty());
    }

    #[test]
    fn overrides_naming_two_methods_are_ambiguous() {
        let field = |v| try_of("POST", &[("X-HTTP-Method-Override", v)], None);
        assert_eq!(field("DELETE, GET"), Err(AmbiguousOverride));
        assert_eq!(field("DELETE,POST"), Err(AmbiguousOverride));
        assert_eq!(field("DELETE, delete").unwrap(), ["DELETE"]);
        assert_eq!(field("DELETE,").unwrap(), ["DELETE"]);
        assert_eq!(field("DELETE, DE LETE").unwrap(), ["DELETE"]);
        let two_fields = [("x-http-method", "PUT"), ("x-method-override", "DELETE")];
        assert_eq!(try_of("POST", &two_fields, None), Err(AmbiguousOverride));
        let beside = try_of("POST", &[("x-http-method", "PUT")], Some("_method=DELETE"));
        assert_eq!(beside, Err(AmbiguousOverride));
        assert_eq!(
            try_of("GET", &[], Some("_method=DELETE&_method=PUT")),
            Err(AmbiguousOverride)
        );
        assert_eq!(
            try_of("POST", &[], Some("_method=DELETE,GET")),
            Err(AmbiguousOverride)
        );
        let same = [
            ("X-HTTP-Method-Override", "DELETE"),
            ("x_http_method", "delete"),
        ];
        assert_eq!(of("POST", &same, Some("_method=DEL%45TE")), ["DELETE"]);
    }
}
