//! `server.server_header` and a route's `response_headers`: parsed once into header values,
//! so the hot path only copies them.

use std::collections::BTreeMap;

use http::{HeaderName, HeaderValue};
use toml::Spanned;

use super::super::answers::{refused_response_header, ResponseField, ResponseHeaders};
use super::super::ConfigError;
use super::Validator;

impl Validator<'_> {
    /// `server.server_header`: `None` for `""` (no `Server` field at all).
    pub(super) fn server_header(
        &self,
        raw: &Spanned<String>,
    ) -> Result<Option<HeaderValue>, ConfigError> {
        let text = raw.get_ref();
        if text.is_empty() {
            return Ok(None);
        }
        match HeaderValue::from_str(text) {
            Ok(v) => Ok(Some(v)),
            Err(_) => self.err(
                Some(raw.span()),
                "server.server_header",
                "a field value without control characters, e.g. \"slidegate\" (or \"\" for none)",
            ),
        }
    }

    /// `routes[i].response_headers`: each name a valid field name given once (in any case),
    /// none the proxy must write itself, each value a valid field value.
    pub(super) fn response_headers(
        &self,
        i: usize,
        raw: &BTreeMap<String, Spanned<String>>,
    ) -> Result<ResponseHeaders, ConfigError> {
        let mut fields: Vec<ResponseField> = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            let key = format!("routes[{i}].response_headers.{name}");
            let span = Some(value.span());
            let Ok(parsed) = HeaderName::from_bytes(name.as_bytes()) else {
                return self.err(
                    span,
                    key,
                    "not a field name (letters, digits and -!#$%&'*+.^_`|~)",
                );
            };
            if let Some(why) = refused_response_header(&parsed) {
                return self.err(span, key, format!("{name} may not be set here: it {why}"));
            }
            if fields.iter().any(|f| f.name == parsed) {
                return self.err(span, key, "given twice (field names ignore case)");
            }
            let Ok(v) = HeaderValue::from_str(value.get_ref()) else {
                return self.err(span, key, "a field value without control characters");
            };
            fields.push(ResponseField {
                name: parsed,
                spelled: name.clone().into(),
                value: v,
            });
        }
        Ok(ResponseHeaders::new(fields))
    }
}
