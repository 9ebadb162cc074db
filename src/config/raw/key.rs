//! A route's `key`: one part as a string (`key = "client_ip"`), or a list of parts
//! (`key = ["header:X-Api-Key", "client_ip"]`), each kept with its span so an error names the
//! entry's line.

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

/// `key` as written.
pub(in crate::config) enum RawKey {
    /// `key = "<part>"` or `"global"`.
    One(String),
    /// `key = ["<part>", …]`.
    List(Vec<Spanned<String>>),
}

impl<'de> Deserialize<'de> for RawKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawKey, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = RawKey;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key part (\"client_ip\", \"header:<Name>\", …) or a list of them")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawKey, E> {
                Ok(RawKey::One(v.to_string()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawKey, A::Error> {
                let mut parts = Vec::new();
                // Bounded by the file's size; the validator refuses more than MAX_KEY_PARTS.
                while let Some(part) = seq.next_element::<Spanned<String>>()? {
                    parts.push(part);
                }
                Ok(RawKey::List(parts))
            }
        }

        d.deserialize_any(KeyVisitor)
    }
}

/// Written back as it was read (for `slidegate -T`): a string, or a list of strings.
impl serde::Serialize for RawKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RawKey::One(part) => s.serialize_str(part),
            RawKey::List(parts) => s.collect_seq(parts.iter().map(|p| p.get_ref())),
        }
    }
}
