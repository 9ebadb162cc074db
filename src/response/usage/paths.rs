//! `settle = "json:<path>[+<path>…]"`: where a model's usage sits in its JSON answer, as dotted
//! paths (`usage.total_tokens`), summed when there are several
//! (`usage.input_tokens+usage.output_tokens`). A segment of digits also indexes an array
//! (`choices.0.usage.total_tokens`).

use serde_json::Value;

/// Most paths in one sum, and most segments in one path: a usage report is a few fields.
const MOST_TERMS: usize = 8;
const MOST_SEGMENTS: usize = 16;

/// Why a `json:` path is refused at config load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Nothing after `json:`, or an empty term around a `+`.
    #[error("a path is empty (write e.g. json:usage.total_tokens)")]
    Empty,
    /// `usage..total_tokens`, `.usage`, `usage.`.
    #[error("path {0:?} has an empty segment (two dots, or a dot at an end)")]
    EmptySegment(String),
    /// A segment with a character a JSON key of a usage report does not have.
    #[error("path {0:?}: a segment may hold letters, digits, '_' and '-' only")]
    Character(String),
    /// Too many terms or segments.
    #[error("at most {MOST_TERMS} paths of at most {MOST_SEGMENTS} segments each")]
    TooLong,
}

/// The paths of a `json:` settle source, parsed once at config load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsagePaths {
    terms: Vec<Vec<String>>,
    /// Each term's last segment quoted (`"total_tokens"`): a text without any of them carries
    /// none, and is not parsed.
    needles: Vec<Vec<u8>>,
}

impl UsagePaths {
    /// The paths of `text` (what follows `json:`).
    pub fn parse(text: &str) -> Result<UsagePaths, PathError> {
        let mut terms = Vec::new();
        for term in text.split('+').map(str::trim) {
            if term.is_empty() {
                return Err(PathError::Empty);
            }
            let segments: Vec<String> = term.split('.').map(str::to_owned).collect();
            if segments.iter().any(String::is_empty) {
                return Err(PathError::EmptySegment(term.to_owned()));
            }
            let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            if !segments.iter().all(|s| s.chars().all(allowed)) {
                return Err(PathError::Character(term.to_owned()));
            }
            if segments.len() > MOST_SEGMENTS {
                return Err(PathError::TooLong);
            }
            terms.push(segments);
        }
        if terms.len() > MOST_TERMS {
            return Err(PathError::TooLong);
        }
        // An array index is no key: the last key before it is looked for (none: always read).
        let key = |t: &Vec<String>| t.iter().rev().find(|s| !is_index(s)).cloned();
        let needles = (terms.iter())
            .map(|t| key(t).map_or(Vec::new(), |k| format!("\"{k}\"").into_bytes()))
            .collect();
        Ok(UsagePaths { terms, needles })
    }

    /// How many paths are summed.
    pub fn len(&self) -> usize {
        self.terms.len()
    }

    /// Never: a parsed source has at least one path.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// True when `text` may carry one of the paths (it names a last segment).
    pub(super) fn may_carry(&self, text: &[u8]) -> bool {
        let has =
            |needle: &[u8]| needle.is_empty() || text.windows(needle.len()).any(|w| w == needle);
        self.needles.iter().any(|n| has(n))
    }

    /// Term `i`'s value in `doc`: `None` when absent or `null`; else a count (a non-negative
    /// integer) or `Err` (any other value).
    pub(super) fn read(&self, i: usize, doc: &Value) -> Option<Result<u64, ()>> {
        let mut at = doc;
        for segment in &self.terms[i] {
            at = match at {
                Value::Object(map) => map.get(segment)?,
                Value::Array(items) if is_index(segment) => {
                    items.get(segment.parse::<usize>().ok()?)?
                }
                _ => return None,
            };
        }
        match at {
            Value::Null => None,
            v => Some(v.as_u64().ok_or(())),
        }
    }
}

/// A segment of digits: an array's index (or an object's key of digits).
fn is_index(segment: &str) -> bool {
    segment.bytes().all(|b| b.is_ascii_digit())
}

impl std::fmt::Display for UsagePaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let terms: Vec<String> = self.terms.iter().map(|t| t.join(".")).collect();
        write!(f, "json:{}", terms.join("+"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_dotted_paths_joined_by_plus() {
        let p = UsagePaths::parse("usage.input_tokens + usage.output_tokens").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p.to_string(), "json:usage.input_tokens+usage.output_tokens");
        for (bad, want) in [
            ("", PathError::Empty),
            ("a+", PathError::Empty),
            (
                "usage..total",
                PathError::EmptySegment("usage..total".into()),
            ),
            (".usage", PathError::EmptySegment(".usage".into())),
            (
                "usage.total tokens",
                PathError::Character("usage.total tokens".into()),
            ),
            ("usage[0]", PathError::Character("usage[0]".into())),
        ] {
            assert_eq!(UsagePaths::parse(bad), Err(want), "{bad:?}");
        }
        let long = ["a"; 17].join(".");
        assert_eq!(UsagePaths::parse(&long), Err(PathError::TooLong));
        assert_eq!(
            UsagePaths::parse(&["a"; 9].join("+")),
            Err(PathError::TooLong)
        );
    }

    #[test]
    fn a_path_reads_counts_through_objects_and_arrays() {
        let doc: Value = serde_json::from_str(
            r#"{"usage":{"total_tokens":42,"neg":-1,"f":1.5,"s":"7","n":null},
                "choices":[{"usage":{"total_tokens":3}}]}"#,
        )
        .unwrap();
        let read = |path: &str| UsagePaths::parse(path).unwrap().read(0, &doc);
        assert_eq!(read("usage.total_tokens"), Some(Ok(42)));
        assert_eq!(read("choices.0.usage.total_tokens"), Some(Ok(3)));
        assert_eq!(read("choices.1.usage.total_tokens"), None);
        assert_eq!(read("usage.n"), None, "null is no report");
        assert_eq!(read("usage.missing"), None);
        assert_eq!(read("usage.total_tokens.x"), None);
        for bad in ["usage.neg", "usage.f", "usage.s", "usage"] {
            assert_eq!(read(bad), Some(Err(())), "{bad}");
        }
        let p = UsagePaths::parse("usage.total_tokens").unwrap();
        assert!(p.may_carry(br#"{"usage":{"total_tokens":1}}"#));
        assert!(!p.may_carry(br#"{"choices":[{"delta":{"content":"total tokens"}}]}"#));
        // A path ending in an index looks for the key before it; all indexes: always read.
        let p = UsagePaths::parse("usage.counts.1").unwrap();
        assert!(p.may_carry(br#"{"usage":{"counts":[1,2]}}"#));
        assert!(!p.may_carry(br#"{"choices":[]}"#));
        assert!(UsagePaths::parse("0").unwrap().may_carry(b"[7]"));
    }
}
