//! The client an admin query's `client` parameter names (the inspector and reset), written as
//! the bucket key the proxy counts that client under.
//!
//! A one-part key takes the value itself (an address for `client_ip`, nothing for `global`); a
//! composite takes a JSON list with one entry per part, in the key's order: a string (the
//! value, or the address for `client_ip`), or `{"ip": "<addr>"}` for a header, query or cookie
//! part the request lacked (the proxy keys that part by the client address).

use std::borrow::Cow;
use std::net::IpAddr;

use serde_json::Value;

use super::{write_bucket_key, BucketClient, CompositeKey, KeySpec, Part, PartValue};

/// Why an admin query's `client` names no bucket of a route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientQueryError {
    /// A `global` route was given a client.
    #[error("keys globally: leave \"client\" empty")]
    NotEmpty,
    /// A `client_ip` part was given something else than an address.
    #[error("keys by client IP: \"client\" must be an IP address")]
    NotAnIp,
    /// A part that reads a value was given none.
    #[error("keys by {0}: \"client\" must be its value")]
    NoValue(String),
    /// A composite route was given something else than one entry per part.
    #[error("keys by {0}: \"client\" must be a JSON list with one entry per part")]
    NotAList(String),
    /// One entry of a composite's list is wrong.
    #[error("entry {index} ({part}): {reason}")]
    Entry {
        /// 0-based position in the list.
        index: usize,
        /// The part it is for.
        part: String,
        /// What is wrong.
        reason: String,
    },
}

impl KeySpec {
    /// Write the bucket key the admin query's `client` names on `route` into `out`; addresses
    /// are keyed through `key_address` (their network under `[client_ip]` prefixes), as the
    /// proxy keys them.
    pub fn write_query_key(
        &self,
        out: &mut String,
        route: &str,
        client: &str,
        key_address: impl Fn(IpAddr) -> IpAddr,
    ) -> Result<(), ClientQueryError> {
        match self {
            KeySpec::Global if client.is_empty() => {
                write_bucket_key(out, route, &BucketClient::Global);
            }
            KeySpec::Global => return Err(ClientQueryError::NotEmpty),
            KeySpec::One(part) => {
                let value = queried_value(part, client, &key_address)?;
                write_bucket_key(out, route, &BucketClient::One(part, value));
            }
            KeySpec::Composite(parts) => {
                let list = composite_entries(self, parts.len(), client)?;
                let mut key = CompositeKey::start(out, route);
                for (index, (part, entry)) in parts.iter().zip(&list).enumerate() {
                    let failed = |reason: String| ClientQueryError::Entry {
                        index,
                        part: part.to_string(),
                        reason,
                    };
                    let value = match entry {
                        Value::String(text) => queried_value(part, text, &key_address)
                            .map_err(|e| failed(e.to_string()))?,
                        Value::Object(o) if part.may_be_missing() && o.len() == 1 => {
                            let ip = o
                                .get("ip")
                                .and_then(Value::as_str)
                                .and_then(|s| s.trim().parse().ok());
                            let ip = ip.ok_or_else(|| {
                                failed("{\"ip\": …} must hold an IP address".into())
                            })?;
                            PartValue::Ip(key_address(ip))
                        }
                        _ if part.may_be_missing() => {
                            return Err(failed(
                                "a string, or {\"ip\": \"<addr>\"} when the request lacked it"
                                    .into(),
                            ))
                        }
                        _ => return Err(failed("a string".into())),
                    };
                    key.push(part, &value);
                }
                key.finish();
            }
        }
        Ok(())
    }
}

/// The entries of a composite's `client`: a JSON list as long as the key.
fn composite_entries(
    spec: &KeySpec,
    parts: usize,
    client: &str,
) -> Result<Vec<Value>, ClientQueryError> {
    match serde_json::from_str::<Value>(client) {
        Ok(Value::Array(list)) if list.len() == parts => Ok(list),
        _ => Err(ClientQueryError::NotAList(spec.to_string())),
    }
}

/// The value `text` gives `part`: an address, or the non-empty text (a path normalised as the
/// routes match it).
fn queried_value<'a>(
    part: &Part,
    text: &'a str,
    key_address: &impl Fn(IpAddr) -> IpAddr,
) -> Result<PartValue<'a>, ClientQueryError> {
    let Some(kind) = part.text_kind() else {
        let ip = text.trim().parse().map_err(|_| ClientQueryError::NotAnIp)?;
        return Ok(PartValue::Ip(key_address(ip)));
    };
    if text.is_empty() {
        return Err(ClientQueryError::NoValue(part.to_string()));
    }
    let bytes: Cow<'a, [u8]> = match part {
        Part::Path => match crate::request::path::normalize_path(text) {
            Cow::Borrowed(p) => Cow::Borrowed(p.as_bytes()),
            Cow::Owned(p) => Cow::Owned(p.into_bytes()),
        },
        // Spelled as a request may spell it: the same canonical form.
        Part::Header(name) => super::canonical::header_text(name, text.as_bytes()),
        Part::Query(_) | Part::Cookie(_) => super::canonical::canonical(text.as_bytes()),
        _ => Cow::Borrowed(text.as_bytes()),
    };
    if bytes.is_empty() {
        return Err(ClientQueryError::NoValue(part.to_string()));
    }
    Ok(PartValue::Text(kind, bytes))
}
