//! A route's `key`: one part or a list of parts, each error naming the entry and its line.

use toml::Spanned;

use super::super::raw::RawKey;
use super::super::{ConfigError, KeySpec};
use super::Validator;
use crate::keys::{KeySpecError, Part, MAX_KEY_PARTS};

impl Validator<'_> {
    /// `key = "<part>"`, `"global"`, or `["<part>", …]`: two or more distinct parts, no
    /// `global`, at most [`MAX_KEY_PARTS`]; `at` is the key's path (`routes[i].key`).
    pub(super) fn key(&self, raw: &Spanned<RawKey>, at: &str) -> Result<KeySpec, ConfigError> {
        let list = match raw.get_ref() {
            RawKey::One(text) => {
                return match text.as_str() {
                    "global" => Ok(KeySpec::Global),
                    part => part
                        .parse()
                        .map(KeySpec::One)
                        .or_else(|e: KeySpecError| self.err(Some(raw.span()), at, e.to_string())),
                };
            }
            RawKey::List(list) => list,
        };
        if list.len() > MAX_KEY_PARTS {
            let e = KeySpecError::TooMany(list.len());
            return self.err(Some(raw.span()), at, e.to_string());
        }
        let mut parts: Vec<Part> = Vec::with_capacity(list.len());
        for (j, entry) in list.iter().enumerate() {
            let failed =
                |e: KeySpecError| self.err(Some(entry.span()), format!("{at}[{j}]"), e.to_string());
            let part: Part = match entry.get_ref().parse() {
                Ok(part) => part,
                Err(e) => return failed(e),
            };
            if parts.contains(&part) {
                return failed(KeySpecError::Duplicate(part.to_string()));
            }
            parts.push(part);
        }
        KeySpec::from_parts(parts).or_else(|e| self.err(Some(raw.span()), at, e.to_string()))
    }
}
