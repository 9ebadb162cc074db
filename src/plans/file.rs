//! A plan file (`plan = { from = "file:<path>" }`): a TOML table of client key to plan name,
//! as a billing export writes it:
//!
//! ```toml
//! "k-3f9a01" = "pro"
//! "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8" = "enterprise"
//! ```
//!
//! A key written `sha256:<64 hex digits>` is the SHA-256 of the client's key, so the file need
//! not hold the secret itself. Every error names the file, the line and the key: the rules are
//! not built, and a reload keeps the running ones.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use toml::Spanned;

/// The largest plan file read: about a million entries of 64 bytes.
pub const MAX_PLAN_FILE: u64 = 64 << 20;

/// What a plan file is read into: each key's plan (an index into the route's plans), by its
/// text and by its SHA-256.
#[derive(Debug, Default)]
pub struct PlanTable {
    /// Keys written as themselves.
    pub plain: HashMap<Vec<u8>, u16>,
    /// Keys written `sha256:<hex>`.
    pub hashed: HashMap<[u8; 32], u16>,
}

impl PlanTable {
    /// The plan of the client whose key is `key`, if the file names it.
    pub fn get(&self, key: &[u8]) -> Option<u16> {
        if let Some(&plan) = self.plain.get(key) {
            return Some(plan);
        }
        if self.hashed.is_empty() {
            return None;
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let bytes: [u8; 32] = digest.as_ref().try_into().ok()?;
        self.hashed.get(&bytes).copied()
    }

    /// Entries read.
    pub fn len(&self) -> usize {
        self.plain.len() + self.hashed.len()
    }

    /// True when the file named no client.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a plan file was refused: the file, the line when known, the key, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {key}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct PlanFileError {
    /// The file, as configured.
    pub file: std::path::PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The entry at fault (or the file's own problem).
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// Read the plan file at `path`; `plans` are the plan names in index order.
pub fn read(path: &Path, plans: &[&str]) -> Result<PlanTable, PlanFileError> {
    let failed = |line, key: &str, message: String| PlanFileError {
        file: path.to_path_buf(),
        line,
        key: key.into(),
        message,
    };
    let bytes = crate::config::file::read_bounded(path, MAX_PLAN_FILE)
        .map_err(|e| failed(None, "(file)", e.to_string()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| failed(None, "(file)", "not UTF-8 text".into()))?;
    parse(&text, plans).map_err(|(line, key, message)| failed(line, &key, message))
}

/// One entry's error: its line, its key and what is wrong.
type EntryError = (Option<usize>, String, String);

/// A plan file's text (see [`read`]).
pub fn parse(text: &str, plans: &[&str]) -> Result<PlanTable, EntryError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let entries: BTreeMap<String, Spanned<String>> = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(s.start));
        let message = format!("{} (each line: \"<client key>\" = \"<plan>\")", e.message());
        (line, "(file)".to_string(), message)
    })?;
    let mut table = PlanTable::default();
    for (key, plan) in entries {
        let line = Some(line_of(plan.span().start));
        let Some(index) = plans.iter().position(|p| *p == plan.get_ref().as_str()) else {
            let message = format!(
                "no [plans.{}] is defined (plans: {plans:?})",
                plan.get_ref()
            );
            return Err((line, key, message));
        };
        let index = u16::try_from(index).unwrap_or(u16::MAX);
        match key.strip_prefix("sha256:") {
            Some(hex) => {
                let Some(digest) = sha256_hex(hex) else {
                    let message = "a hashed key is sha256: and 64 hex digits".to_string();
                    return Err((line, key, message));
                };
                table.hashed.insert(digest, index);
            }
            None if key.is_empty() => {
                return Err((line, key, "an empty key names no client".into()));
            }
            None => {
                table.plain.insert(key.into_bytes(), index);
            }
        }
    }
    Ok(table)
}

/// 64 hex digits (either case) as 32 bytes.
fn sha256_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLANS: [&str; 3] = ["enterprise", "free", "pro"];

    #[test]
    fn keys_plain_and_hashed_name_their_plan() {
        // sha256("password") in upper case: either case is read.
        let text = "\"k-1\" = \"pro\"\n\"k 2\" = \"free\"\n\
            \"sha256:5E884898DA28047151D0E56F8DC6292773603D0D6AABBDD62A11EF721D1542D8\" = \"enterprise\"\n";
        let table = parse(text, &PLANS).expect("valid");
        assert_eq!(table.get(b"k-1"), Some(2));
        assert_eq!(table.get(b"k 2"), Some(1));
        assert_eq!(table.get(b"password"), Some(0));
        assert_eq!(table.get(b"Password"), None);
        assert_eq!(table.get(b"k-3"), None);
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn an_error_names_the_line_and_the_key() {
        let cases = [
            (
                "\"a\" = \"pro\"\n\"b\" = \"gold\"\n",
                Some(2),
                "b",
                "no [plans.gold]",
            ),
            (
                "\"a\" = \"pro\"\n\"sha256:00ff\" = \"pro\"\n",
                Some(2),
                "sha256:00ff",
                "64 hex",
            ),
            (
                "\"a\" = \"pro\"\n\"b\" = 3\n",
                Some(2),
                "(file)",
                "each line",
            ),
            ("\"\" = \"pro\"\n", Some(1), "", "empty key"),
            (
                "\"a\" = \"pro\"\n\"a\" = \"free\"\n",
                Some(2),
                "(file)",
                "duplicate",
            ),
        ];
        for (text, line, key, says) in cases {
            let (l, k, message) = parse(text, &PLANS).expect_err(text);
            assert_eq!((l, k.as_str()), (line, key), "{text}: {message}");
            assert!(message.contains(says), "{text}: {message}");
        }
    }
}
