//! The other way from `query.rs`: the `client` an admin query names a bucket with, read back
//! from the bucket key (for `/api/v1/top`'s `key` and its link to the inspector's window).
//! A bucket whose value the key holds only as a hash (long or not plain) names no `client`.

use serde_json::{json, Value};

use super::{write_tag, KeySpec, Part};

impl KeySpec {
    /// The inspector's `client` for `bucket`, a bucket key of `route` under this key; `None`
    /// when the bucket holds a hash of the value (or is not one of this key's).
    pub fn client_of_bucket(&self, route: &str, bucket: &str) -> Option<String> {
        let rest = bucket.strip_prefix(route)?.strip_prefix(':')?;
        match self {
            KeySpec::Global => (rest == "global").then(String::new),
            KeySpec::One(part) => {
                let value = rest.strip_prefix(tag(part).as_str())?.strip_prefix(':')?;
                match value_of(part, value)? {
                    Value::String(text) => Some(text),
                    // A request that lacked the part: a one-part key has no query for it.
                    _ => None,
                }
            }
            KeySpec::Composite(parts) => {
                let list = rest.strip_prefix("k:")?;
                let values: Vec<&str> = list.split(',').collect();
                if values.len() != parts.len() {
                    return None;
                }
                let entries = (parts.iter().zip(values))
                    .map(|(part, item)| {
                        let value = item.strip_prefix(tag(part).as_str())?.strip_prefix('=')?;
                        value_of(part, value)
                    })
                    .collect::<Option<Vec<Value>>>()?;
                serde_json::to_string(&entries).ok()
            }
        }
    }
}

fn tag(part: &Part) -> String {
    let mut out = String::new();
    write_tag(&mut out, part);
    out
}

/// A part's entry in a query: its value, `{"ip": …}` for a request that lacked it.
fn value_of(part: &Part, value: &str) -> Option<Value> {
    if value.is_empty() || value.starts_with('#') {
        return None;
    }
    match value.strip_prefix("ip:") {
        Some(ip) if !matches!(part, Part::ClientIp) => Some(json!({ "ip": ip })),
        _ => Some(Value::String(value.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> KeySpec {
        if text == "global" {
            return KeySpec::Global;
        }
        KeySpec::from_parts(text.split(',').map(|p| p.parse().unwrap()).collect()).unwrap()
    }

    /// What the inspector is given writes the same bucket back.
    #[test]
    fn a_bucket_names_the_client_the_inspector_takes() {
        let same = |key: &KeySpec, client: &str| {
            let mut bucket = String::new();
            key.write_query_key(&mut bucket, "api", client, |ip| ip)
                .unwrap();
            assert_eq!(
                key.client_of_bucket("api", &bucket).as_deref(),
                Some(client)
            );
        };
        same(&spec("global"), "");
        same(&spec("client_ip"), "10.0.0.7");
        same(&spec("header:X-Api-Key"), "tenant-noisy");
        same(&spec("client_ip,header:X-Org"), r#"["10.0.0.7","acme"]"#);
        same(
            &spec("header:X-Org,query:user"),
            r#"["acme",{"ip":"10.0.0.8"}]"#,
        );
        let mut bucket = String::new();
        let long = "x".repeat(200);
        spec("header:X-Api-Key")
            .write_query_key(&mut bucket, "api", &long, |ip| ip)
            .unwrap();
        assert_eq!(
            spec("header:X-Api-Key").client_of_bucket("api", &bucket),
            None
        );
        assert_eq!(spec("global").client_of_bucket("web", "api:global"), None);
    }
}
