//! The methods an app may read a request as: the one it was sent with, and for a `POST` the
//! method an override names. Rails, Symfony, Laravel and Express's `method-override` serve a
//! `POST` carrying `X-HTTP-Method-Override: DELETE` (or `X-HTTP-Method`, `X-Method-Override`,
//! or `_method=DELETE` in the query) as a `DELETE`, so a route limited to
//! `methods = ["DELETE"]` must take it too, or the override walks past the limit to a
//! catch-all. The request is forwarded as sent; only route matching reads the override.
//! (An override in a form body, Rails' hidden `_method` field, is not read: the route is
//! chosen before the body arrives.)

use http::{HeaderMap, HeaderName, Method};
use smallvec::SmallVec;

/// The header fields that name an override method.
static OVERRIDE_FIELDS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The query parameter that names one (Rails, Laravel, Symfony).
const OVERRIDE_PARAMETER: &str = "_method";

/// The method a request was sent with, and those an override names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Methods {
    /// As sent.
    pub sent: Method,
    /// Named by an override of a `POST`, upper-cased as frameworks read them (usually none).
    pub overrides: SmallVec<[Method; 1]>,
}

impl Methods {
    /// The methods of a request sent as `method` with `headers` and `query`.
    pub fn of(method: &Method, headers: &HeaderMap, query: Option<&str>) -> Methods {
        let mut overrides = SmallVec::new();
        if method == Method::POST {
            let fields = OVERRIDE_FIELDS.iter().flat_map(|n| headers.get_all(n));
            let values = fields.map(|v| v.as_bytes());
            let params = query.into_iter().flat_map(|q| q.split(['&', ';']));
            let params = params.filter_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                let name = crate::keys::canonical::canonical(name.as_bytes());
                (&*name == OVERRIDE_PARAMETER.as_bytes()).then_some(value.as_bytes())
            });
            for value in values.chain(params) {
                let upper = value.trim_ascii().to_ascii_uppercase();
                if let Ok(m) = Method::from_bytes(&upper) {
                    if m != method && !overrides.contains(&m) {
                        overrides.push(m);
                    }
                }
            }
        }
        Methods {
            sent: method.clone(),
            overrides,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: &str, fields: &[(&str, &str)], query: Option<&str>) -> Vec<String> {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let m = Methods::of(&Method::from_bytes(method.as_bytes()).unwrap(), &h, query);
        m.overrides.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn a_post_may_be_read_as_the_method_its_override_names() {
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
        let both = of("POST", &[("x-http-method", "PUT")], Some("_method=DELETE"));
        assert_eq!(both, ["PUT", "DELETE"]);
        // Only a POST is overridden; the same method, or none that parses, adds nothing.
        assert!(of("GET", &[("X-HTTP-Method-Override", "DELETE")], None).is_empty());
        assert!(of("POST", &[("X-HTTP-Method-Override", "POST")], None).is_empty());
        assert!(of("POST", &[("X-HTTP-Method-Override", "DE LETE")], None).is_empty());
        let listed = Methods::of(&Method::POST, &HeaderMap::new(), Some("_method=DELETE"));
        assert!(listed.any_in(&[Method::DELETE]));
        assert!(!Methods::sent(&Method::POST).any_in(&[Method::DELETE]));
    }
}
