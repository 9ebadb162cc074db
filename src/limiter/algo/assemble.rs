//! Splicing the Redis scripts together: each skeleton (`lua/<script>/skeleton.lua`: the
//! deciding `sliding_window`, `inspect` and `refund`) with each kind of limit's file
//! (`lua/kinds/<kind>.lua`): every file in that folder is a kind, so adding one is adding its file.
//! `build.rs` runs this (the same file, by `#[path]`) so the binary carries the assembled texts,
//! and `scripts/bench-script` follows the same rules; the format is described in the deciding
//! skeleton's ASSEMBLY section.
//!
//! A kind's sections are copied verbatim, so the assembled script is what one would write by
//! hand, with one `if`/`elseif` chain per pass. Before that, each section is checked against
//! the names the skeleton provides at its marker (`names.rs`: the locals in scope there, found
//! by reading the skeleton's blocks, and Lua's own globals): a section that uses any other name
//! that it does not declare itself (a typo, a scratch name the skeleton does not have, a local
//! of another pass) fails the build, instead of reading `nil` at run time in Redis.

use std::collections::BTreeMap;
use std::fmt;

#[path = "names.rs"]
mod names;

/// A skeleton line replaced by one section of every kind.
const EACH_KIND: &str = "-- @each-kind ";
/// A kind file's line giving its test on the locals (`default`: the `else` branch).
const WHEN: &str = "-- @when ";
/// A kind file's line starting a section (up to the next one or the end).
const SECTION: &str = "-- @section ";
/// A line between the files of a kind kept as a folder (`lua/kinds/<kind>/*.lua`, joined by
/// [`kind_text`]): what follows, up to the next section, is documentation again.
const PART: &str = "-- @part";
/// The `@each-kind` section that takes every kind's documentation, not a dispatch chain.
const DOC: &str = "doc";

/// Why the parts could not be assembled (a build error: the parts are in the repository).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssembleError {
    /// A kind file has no `-- @when` line.
    NoWhen(String),
    /// Not exactly one kind is the default.
    Default,
    /// A kind has no section the skeleton asks for.
    NoSection(String, String),
    /// A kind's section uses a name the skeleton does not provide at its marker, nor the
    /// section declares: (kind, section, name).
    UnknownName(String, String, String),
}

impl fmt::Display for AssembleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssembleError::NoWhen(kind) => write!(f, "kind {kind}: no `{WHEN}` line"),
            AssembleError::Default => {
                write!(f, "exactly one kind must be `{WHEN}default`")
            }
            AssembleError::NoSection(kind, s) => write!(f, "kind {kind}: no section `{s}`"),
            AssembleError::UnknownName(kind, s, name) => write!(
                f,
                "kind {kind}, section `{s}`: `{name}` is neither a local the skeleton has in \
                 scope at its marker nor declared in the section"
            ),
        }
    }
}

impl std::error::Error for AssembleError {}

/// One kind's file, cut at its marker lines.
struct Kind {
    /// Its `@when` test; `None` for the default kind.
    when: Option<String>,
    /// The text before its first marker.
    doc: String,
    /// Each section's name and text.
    sections: Vec<(String, String)>,
}

impl Kind {
    fn parse(name: &str, text: &str) -> Result<Kind, AssembleError> {
        let (mut when, mut doc, mut sections) =
            (None, String::new(), Vec::<(String, String)>::new());
        let mut in_doc = true;
        for line in text.split_inclusive('\n') {
            let trimmed = line.trim();
            if let Some(test) = trimmed.strip_prefix(WHEN) {
                when = Some((test != "default").then(|| test.to_owned()));
            } else if let Some(section) = trimmed.strip_prefix(SECTION) {
                sections.push((section.to_owned(), String::new()));
                in_doc = false;
            } else if trimmed == PART {
                in_doc = true;
            } else if let (false, Some((_, text))) = (in_doc, sections.last_mut()) {
                text.push_str(line);
            } else {
                doc.push_str(line);
            }
        }
        let when = when.ok_or_else(|| AssembleError::NoWhen(name.to_owned()))?;
        Ok(Kind {
            when,
            doc,
            sections,
        })
    }
}

/// A kind's text from its files: one file, or a folder's files in name order (a kind split by
/// concern), each after a [`PART`] line.
pub fn kind_text(files: &[String]) -> String {
    files.join(&format!("{PART}\n"))
}

/// A script: `skeleton` with `kinds` (each a name and its file's text) spliced in at its
/// markers. The kinds' `@when` tests are disjoint, so their order does not change what runs:
/// they are chained in the order given (`build.rs` gives them by file name), the one default
/// kind moved last, as the chain's `else`.
pub fn assemble(skeleton: &str, kinds: &[(&str, String)]) -> Result<String, AssembleError> {
    let mut kinds = kinds
        .iter()
        .map(|(name, text)| Ok((*name, Kind::parse(name, text)?)))
        .collect::<Result<Vec<_>, AssembleError>>()?;
    if kinds.iter().filter(|(_, k)| k.when.is_none()).count() != 1 {
        return Err(AssembleError::Default);
    }
    // Stable: the others keep their order.
    kinds.sort_by_key(|(_, k)| k.when.is_none());
    let provided = names::in_scope_at_markers(skeleton, EACH_KIND);
    let mut out = String::with_capacity(skeleton.len() * 2);
    let mut marker = 0;
    for line in skeleton.split_inclusive('\n') {
        match line.trim().strip_prefix(EACH_KIND) {
            Some(section) => {
                let scope = provided.get(marker).cloned().unwrap_or_default();
                marker += 1;
                check_names(section, &scope, &kinds)?;
                splice(&mut out, line, section, &kinds)?;
            }
            None => out.push_str(line),
        }
    }
    Ok(out)
}

/// Every kind's `section` uses only names in `scope`, Lua's globals, or its own locals.
fn check_names(
    section: &str,
    scope: &BTreeMap<String, ()>,
    kinds: &[(&str, Kind)],
) -> Result<(), AssembleError> {
    if section == DOC {
        return Ok(());
    }
    for (name, kind) in kinds {
        let Some((_, text)) = kind.sections.iter().find(|(s, _)| s == section) else {
            continue; // `splice` says which is missing
        };
        if let Some(unknown) = names::free_names(text)
            .into_iter()
            .find(|n| !scope.contains_key(n) && !names::is_lua_global(n))
        {
            let (kind, section) = (name.to_string(), section.to_owned());
            return Err(AssembleError::UnknownName(kind, section, unknown));
        }
    }
    Ok(())
}

/// Write what the marker `line` asking for `section` becomes.
fn splice(
    out: &mut String,
    line: &str,
    section: &str,
    kinds: &[(&str, Kind)],
) -> Result<(), AssembleError> {
    if section == DOC {
        kinds.iter().for_each(|(_, k)| out.push_str(&k.doc));
        return Ok(());
    }
    let indent = &line[..line.len() - line.trim_start().len()];
    for (i, (name, kind)) in kinds.iter().enumerate() {
        match (&kind.when, i) {
            (Some(test), 0) => out.push_str(&format!("{indent}if {test} then\n")),
            (Some(test), _) => out.push_str(&format!("{indent}elseif {test} then\n")),
            (None, _) => out.push_str(&format!("{indent}else\n")),
        }
        let text = kind
            .sections
            .iter()
            .find(|(s, _)| s == section)
            .map(|(_, text)| text)
            .ok_or_else(|| AssembleError::NoSection(name.to_string(), section.to_owned()))?;
        out.push_str(text);
    }
    out.push_str(&format!("{indent}end\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKELETON: &str = "--[[ head --]]\n-- @each-kind doc\nlocal x, n = 0, 2\nfor i = 1, n do\n    -- @each-kind read\nend\n";

    fn kinds(names: &[&'static str]) -> Vec<(&'static str, String)> {
        let text = |name| match name {
            "a" => "--[[ a --]]\n-- @when default\n-- @section read\n        x = 1\n",
            _ => "--[[ b --]]\n-- @when res > 0\n-- @section read\n        x = 2\n",
        };
        names.iter().map(|&n| (n, text(n).to_owned())).collect()
    }

    #[test]
    fn each_marker_becomes_one_chain_over_the_kinds_with_the_default_as_else() {
        // The default kind `a` is the `else` wherever it comes in the folder.
        let script = assemble(SKELETON, &kinds(&["a", "b"])).unwrap();
        assert_eq!(
            script,
            "--[[ head --]]\n--[[ b --]]\n--[[ a --]]\nlocal x, n = 0, 2\nfor i = 1, n do\n    if res > 0 then\n        x = 2\n    else\n        x = 1\n    end\nend\n"
        );
    }

    #[test]
    fn a_missing_section_or_default_is_an_error() {
        assert_eq!(
            assemble(SKELETON, &kinds(&["b"])),
            Err(AssembleError::Default)
        );
        assert_eq!(
            assemble(SKELETON, &kinds(&["a", "a"])),
            Err(AssembleError::Default)
        );
        let no_section = SKELETON.replace("read\nend", "answer\nend");
        assert!(matches!(
            assemble(&no_section, &kinds(&["b", "a"])),
            Err(AssembleError::NoSection(..))
        ));
        let typo = [("a", kinds(&["a"])[0].1.replace("x = 1", "x = y"))];
        assert_eq!(
            assemble(SKELETON, &typo),
            Err(AssembleError::UnknownName(
                "a".into(),
                "read".into(),
                "y".into()
            ))
        );
        let no_when = [("c", "-- @section read\n".to_owned())];
        assert_eq!(
            assemble(SKELETON, &no_when),
            Err(AssembleError::NoWhen("c".into()))
        );
    }
}
