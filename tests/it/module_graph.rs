//! No circle between the files of `src/`: a file may use its ancestors (a module's `mod.rs`
//! is the registry its children build on) and anything below or beside it, but if `a.rs`
//! reaches `b.rs` then `b.rs` must not reach back to `a.rs`, directly or through others.
//!
//! Edges are read from the text: every `crate::…`, `super::…` and `self::…` path, with the
//! braces of `use` groups expanded, resolved to the deepest file that defines the module.
//! Unit-test files (`tests.rs`, `*_tests.rs`) are left out: they are not part of the layering.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A file of `src/` and the module path it defines (`src/limiter/mod.rs` → `limiter`).
struct SourceFile {
    path: PathBuf,
    module: Vec<String>,
    text: String,
}

fn source_files(dir: &Path, out: &mut Vec<SourceFile>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            source_files(&path, out);
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let rel = path.strip_prefix("src").unwrap();
        let mut module: Vec<String> = rel
            .parent()
            .into_iter()
            .flat_map(|p| p.iter().map(|c| c.to_string_lossy().into_owned()))
            .collect();
        let stem = name.trim_end_matches(".rs");
        if !matches!(stem, "mod" | "lib" | "main") {
            module.push(stem.to_string());
        }
        let mut text = fs::read_to_string(&path).unwrap();
        // An inline test module (last in its file, by the house's layout) is not layering.
        if let Some(at) = text.find("#[cfg(test)]\nmod tests {") {
            text.truncate(at);
        }
        out.push(SourceFile { path, module, text });
    }
}

/// The file defining `module`, or the nearest ancestor's file.
fn file_of(module: &[String], files: &BTreeMap<Vec<String>, PathBuf>) -> Option<PathBuf> {
    (0..=module.len())
        .rev()
        .find_map(|k| files.get(&module[..k]).cloned())
}

/// Expands `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(p).into_iter().map(move |s| format!("{prefix}{s}")))
        .collect()
}

/// Every module path the file names, as written (`crate::a::b`, `super::c`, `self::d`).
fn paths_named(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("use ") {
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        let boundary = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
        if boundary {
            found.extend(expand(&after[..end]));
        }
        rest = &after[end.min(after.len())..];
    }
    let bytes = code.as_bytes();
    for head in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(head) {
            let at = from + i;
            from = at + head.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            found.push(code[at..at + len].to_string());
        }
    }
    found
}

/// `path` resolved against the module `here` to absolute segments, `None` if external.
fn absolute(here: &[String], is_mod_file: bool, path: &str) -> Option<Vec<String>> {
    let segs: Vec<&str> = path
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut out: Vec<String> = match segs.first()? {
        &"crate" => Vec::new(),
        &"self" | &"super" => here.to_vec(),
        _ => return None,
    };
    // In `a/b.rs` (module a::b), `super` is `a`; in an inline module it would be more, but
    // inline modules are tests here.
    let _ = is_mod_file;
    for seg in &segs {
        match *seg {
            "crate" | "self" => {}
            "super" => {
                out.pop();
            }
            s => out.push(s.split_whitespace().next()?.to_string()),
        }
    }
    Some(out)
}

/// Every file of `src/` and the files it reaches (its ancestors left out).
fn file_edges() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut sources = Vec::new();
    source_files(Path::new("src"), &mut sources);
    assert!(sources.len() > 50, "read {} files of src/", sources.len());
    let files: BTreeMap<Vec<String>, PathBuf> = sources
        .iter()
        .filter(|f| !f.path.ends_with("main.rs"))
        .map(|f| (f.module.clone(), f.path.clone()))
        .collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &sources {
        let is_mod = file.path.ends_with("mod.rs");
        for named in paths_named(&file.text) {
            let Some(target) = absolute(&file.module, is_mod, &named) else {
                continue;
            };
            let Some(to) = file_of(&target, &files) else {
                continue;
            };
            let to_module = &sources.iter().find(|s| s.path == to).unwrap().module;
            let ancestor = file.module.starts_with(to_module) && to_module != &file.module;
            if to != file.path && !ancestor {
                edges.entry(file.path.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

#[test]
fn no_file_in_src_reaches_back_to_a_file_that_reaches_it() {
    let edges = file_edges();
    let edge_count: usize = edges.values().map(BTreeSet::len).sum();
    assert!(
        edge_count > 100,
        "found only {edge_count} edges: the reader is broken"
    );
    let circles = circles(&edges);
    assert!(
        circles.is_empty(),
        "files that reach each other:\n{}",
        circles
            .iter()
            .map(|c| c
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" -> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The layering `docs/design.md` draws: the limiter and its policy layers sit below the
/// proxy, the routes, the config and the metrics, which are handed in (`Observe`, clocks,
/// metric handles). Nothing in `src/limiter/` reaches a file outside it but these.
const LIMITER_MAY_REACH: &[&str] = &["src/logs/state.rs"];

#[test]
fn the_limiter_reaches_nothing_above_it() {
    let edges = file_edges();
    let limiter = Path::new("src/limiter");
    let upward: Vec<String> = (edges.iter())
        .filter(|(from, _)| from.starts_with(limiter))
        .flat_map(|(from, to)| to.iter().map(move |to| (from, to)))
        .filter(|(_, to)| !to.starts_with(limiter))
        .filter(|(_, to)| !LIMITER_MAY_REACH.iter().any(|ok| Path::new(ok) == *to))
        .map(|(from, to)| format!("{} -> {}", from.display(), to.display()))
        .collect();
    assert!(
        upward.is_empty(),
        "the limiter reaches above it:\n{}",
        upward.join("\n")
    );
}

/// One circle per strongly connected group of files, found by depth-first search.
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for start in edges.keys() {
        let mut stack = vec![start.clone()];
        if let Some(c) = walk(edges, &mut stack, &mut done) {
            // Each file of a circle is reported once, in the first circle found through it.
            done.extend(c.iter().cloned());
            found.push(c);
        }
    }
    found
}

fn walk(
    edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    stack: &mut Vec<PathBuf>,
    done: &mut BTreeSet<PathBuf>,
) -> Option<Vec<PathBuf>> {
    let here = stack.last().unwrap().clone();
    if done.contains(&here) {
        return None;
    }
    for next in edges.get(&here).into_iter().flatten() {
        if let Some(at) = stack.iter().position(|p| p == next) {
            let mut circle = stack[at..].to_vec();
            circle.push(next.clone());
            return Some(circle);
        }
        stack.push(next.clone());
        let found = walk(edges, stack, done);
        stack.pop();
        if found.is_some() {
            return found;
        }
    }
    done.insert(here);
    None
}

#[test]
fn the_reader_expands_use_groups_and_finds_a_planted_circle() {
    assert_eq!(
        expand("crate::a::{b, c::{d, e}}"),
        vec!["crate::a::b", "crate::a::c::d", "crate::a::c::e"]
    );
    let mut edges = BTreeMap::new();
    let (a, b, c) = (
        PathBuf::from("a.rs"),
        PathBuf::from("b.rs"),
        PathBuf::from("c.rs"),
    );
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([c.clone()]));
    assert!(circles(&edges).is_empty());
    edges.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(circles(&edges), vec![vec![a.clone(), b, c, a]]);
}

/// Files of `dir` (recursively) ending in `ext`, with their line counts.
fn line_counts(dir: &Path, ext: &str, out: &mut Vec<(PathBuf, usize)>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            line_counts(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            let lines = fs::read_to_string(&path).unwrap().lines().count();
            out.push((path, lines));
        }
    }
}

/// A file a reader can hold: no Rust file of `src/` over 450 lines, no Lua file over 300
/// (a kind or a skeleton that grows is split by concern: `lua/kinds/<kind>/`).
#[test]
fn no_source_file_outgrows_a_reader() {
    for (dir, ext, most) in [("src", "rs", 450), ("lua", "lua", 300)] {
        let mut files = Vec::new();
        line_counts(Path::new(dir), ext, &mut files);
        assert!(files.len() > 5, "read only {} files of {dir}/", files.len());
        let long: Vec<String> = (files.iter())
            .filter(|(_, lines)| *lines > most)
            .map(|(path, lines)| format!("{}: {lines} lines", path.display()))
            .collect();
        assert!(long.is_empty(), "over {most} lines:\n{}", long.join("\n"));
    }
}

/// The layers `docs/design.md` draws (its "Layers" section's first code block): one line per
/// layer, top first, each the top-level modules of `src/` (folders, or files without `.rs`)
/// on it. Every module of `src/` is on exactly one line.
fn drawn_layers() -> Vec<Vec<String>> {
    let design = fs::read_to_string("docs/design.md").unwrap();
    let section = &design[design
        .find("\n## Layers\n")
        .expect("design.md: no ## Layers")..];
    let block = section
        .split("```")
        .nth(1)
        .expect("## Layers: no code block");
    let block = block.split_once('\n').map_or("", |(_, rest)| rest);
    block
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The top-level module of a file of `src/` (`src/limiter/redis/io.rs` -> `limiter`).
fn top_module(path: &Path) -> String {
    let rel = path.strip_prefix("src").unwrap();
    let first = rel.iter().next().unwrap().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// No module reaches one drawn above it: a file may use its own layer's modules and those
/// below (the circles inside a layer are still caught file by file above).
#[test]
fn no_module_reaches_a_layer_above_it() {
    let layers = drawn_layers();
    assert!(
        layers.len() >= 5,
        "read {} layers from design.md",
        layers.len()
    );
    // Top first in the drawing: a higher layer has a smaller index.
    let mut rank = BTreeMap::new();
    for (i, layer) in layers.iter().enumerate() {
        for module in layer {
            assert!(
                rank.insert(module.clone(), i).is_none(),
                "{module} drawn twice"
            );
        }
    }
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir("src").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir()
            || (name.ends_with(".rs") && !matches!(name.as_str(), "lib.rs" | "main.rs"))
        {
            modules.insert(name.trim_end_matches(".rs").to_string());
        }
    }
    let drawn: BTreeSet<String> = rank.keys().cloned().collect();
    assert_eq!(
        modules, drawn,
        "design.md's layers and the modules of src/ differ"
    );
    let upward: Vec<String> = (file_edges().iter())
        .flat_map(|(from, to)| to.iter().map(move |to| (from, to)))
        .filter(|(from, to)| {
            let (a, b) = (top_module(from), top_module(to));
            let (Some(ra), Some(rb)) = (rank.get(&a), rank.get(&b)) else {
                return false;
            };
            rb < ra
        })
        .map(|(from, to)| format!("{} -> {}", from.display(), to.display()))
        .collect();
    assert!(
        upward.is_empty(),
        "files reaching a layer above theirs (docs/design.md, Layers):\n{}",
        upward.join("\n")
    );
}
