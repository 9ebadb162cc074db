//! The names a Lua text declares and uses, for `assemble.rs`: which locals a skeleton has in
//! scope at each of its markers, and which names a kind's section uses without declaring them.
//! A tokenizer of Lua 5.1 (comments, strings, long brackets, numbers, names) and a walk of its
//! blocks; no expression is parsed. Read by `build.rs` (through `assemble.rs`), so std only.

use std::collections::{BTreeMap, BTreeSet};

/// One token: a name or keyword, a symbol, or a marker comment (`-- @each-kind <section>`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Name(String),
    Sym(String),
    Marker,
}

const KEYWORDS: [&str; 21] = [
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// The globals a script may use: Lua's and Redis's (a section uses no other global).
const GLOBALS: [&str; 21] = [
    "redis", "math", "string", "table", "struct", "cjson", "bit", "tonumber", "tostring", "type",
    "unpack", "pairs", "ipairs", "select", "error", "assert", "pcall", "next", "rawget", "KEYS",
    "ARGV",
];

/// True for a name every script may use without declaring it.
pub fn is_lua_global(name: &str) -> bool {
    GLOBALS.contains(&name)
}

/// The tokens of `text`; a comment line starting `marker` is a [`Tok::Marker`].
fn tokens(text: &str, marker: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    // The end of a long bracket `[==[ ... ]==]` opening at `at`, if one opens there.
    let long = |at: usize| -> Option<usize> {
        let eqs = b[at + 1..].iter().take_while(|&&c| c == b'=').count();
        (b.get(at + 1 + eqs) == Some(&b'[')).then(|| {
            let close = format!("]{}]", "=".repeat(eqs));
            text[at..]
                .find(&close)
                .map_or(b.len(), |e| at + e + close.len())
        })
    };
    while i < b.len() {
        let c = b[i];
        if text[i..].starts_with("--") {
            if b.get(i + 2) == Some(&b'[') {
                if let Some(end) = long(i + 2) {
                    i = end;
                    continue;
                }
            }
            let end = text[i..].find('\n').map_or(b.len(), |e| i + e);
            if text[i..end].trim().starts_with(marker.trim()) {
                out.push(Tok::Marker);
            }
            i = end;
        } else if c == b'\'' || c == b'"' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Tok::Sym("string".into()));
        } else if c == b'[' && long(i).is_some() {
            i = long(i).unwrap_or(b.len());
            out.push(Tok::Sym("string".into()));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Sym("number".into()));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Name(text[start..i].to_owned()));
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else {
            let two = text.get(i..i + 2).unwrap_or("");
            let sym = match two {
                ".." | "==" | "~=" | "<=" | ">=" => two,
                _ => &text[i..i + 1],
            };
            i += sym.len();
            out.push(Tok::Sym(sym.to_owned()));
        }
    }
    out
}

/// The names a `local` (or `local function`), a `for` or a function's parameters declare,
/// starting at token `i` (the keyword); and whether they open a block of their own (`for`,
/// `function`: their names belong to the block) rather than the current one (`local`).
fn declared_at(toks: &[Tok], i: usize) -> Option<(Vec<String>, bool)> {
    let name = |t: Option<&Tok>| match t {
        Some(Tok::Name(n)) if !KEYWORDS.contains(&n.as_str()) => Some(n.clone()),
        _ => None,
    };
    let list = |from: usize| {
        let mut names = Vec::new();
        let mut j = from;
        while let Some(n) = name(toks.get(j)) {
            names.push(n);
            match toks.get(j + 1) {
                Some(Tok::Sym(s)) if s == "," => j += 2,
                _ => break,
            }
        }
        names
    };
    match &toks[i] {
        Tok::Name(k) if k == "local" => match toks.get(i + 1) {
            Some(Tok::Name(f)) if f == "function" => Some((list(i + 2), false)),
            _ => Some((list(i + 1), false)),
        },
        Tok::Name(k) if k == "for" => Some((list(i + 1), true)),
        Tok::Name(k) if k == "function" => {
            let open = (i..toks.len()).find(|&j| toks[j] == Tok::Sym("(".into()))?;
            Some((list(open + 1), true))
        }
        _ => None,
    }
}

/// The locals `skeleton` has in scope at each of its `marker` lines, in order.
pub fn in_scope_at_markers(skeleton: &str, marker: &str) -> Vec<BTreeMap<String, ()>> {
    let toks = tokens(skeleton, marker);
    let (mut stack, mut pending, mut out) = (vec![Vec::<String>::new()], Vec::new(), Vec::new());
    for i in 0..toks.len() {
        if let Some((names, own_block)) = declared_at(&toks, i) {
            if own_block {
                pending = names;
            } else if let Some(scope) = stack.last_mut() {
                scope.extend(names);
            }
        }
        match &toks[i] {
            Tok::Marker => out.push(stack.iter().flatten().map(|n| (n.clone(), ())).collect()),
            Tok::Name(k) => match k.as_str() {
                "do" | "then" | "repeat" => stack.push(std::mem::take(&mut pending)),
                "end" | "until" | "elseif" => {
                    stack.pop();
                }
                "else" => {
                    stack.pop();
                    stack.push(Vec::new());
                }
                _ => {}
            },
            // A function's body opens after its parameters.
            Tok::Sym(s) if s == ")" && !pending.is_empty() && is_function_params(&toks, i) => {
                stack.push(std::mem::take(&mut pending));
            }
            Tok::Sym(_) => {}
        }
    }
    out
}

/// True when the `)` at `i` closes a `function (...)`'s parameter list.
fn is_function_params(toks: &[Tok], i: usize) -> bool {
    let open = (0..i).rev().find(|&j| toks[j] == Tok::Sym("(".into()));
    open.is_some_and(|o| {
        (0..o)
            .rev()
            .take(3)
            .any(|j| toks[j] == Tok::Name("function".into()))
    })
}

/// The names `section` uses and does not declare itself (anywhere in it): neither keywords,
/// nor fields (`a.b`, `a:b()`, `{ b = 1 }`).
pub fn free_names(section: &str) -> BTreeSet<String> {
    let toks = tokens(section, "\u{0}");
    let mut declared = BTreeSet::new();
    for i in 0..toks.len() {
        if let Some((names, _)) = declared_at(&toks, i) {
            declared.extend(names);
        }
    }
    let mut braces = Vec::new();
    let mut used = BTreeSet::new();
    for (i, t) in toks.iter().enumerate() {
        match t {
            Tok::Sym(s) if s == "{" || s == "(" || s == "[" => braces.push(s.clone()),
            Tok::Sym(s) if s == "}" || s == ")" || s == "]" => {
                braces.pop();
            }
            Tok::Name(n) if !KEYWORDS.contains(&n.as_str()) && !declared.contains(n) => {
                let after_dot =
                    i > 0 && matches!(&toks[i - 1], Tok::Sym(s) if s == "." || s == ":");
                let is_key = braces.last().is_some_and(|b| b == "{")
                    && matches!(toks.get(i + 1), Some(Tok::Sym(s)) if s == "=");
                if !after_dot && !is_key {
                    used.insert(n.clone());
                }
            }
            _ => {}
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_at_a_marker_is_every_open_block_s_locals() {
        let skeleton = "local a = 1\nfor i = 1, 2 do\n  local b\n  if a then\n    local c\n  \
                        end\n  -- @m x\nend\nlocal f = function(p) return p end\n-- @m y\n";
        let scopes = in_scope_at_markers(skeleton, "-- @m ");
        let names = |m: &BTreeMap<String, ()>| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&scopes[0]), ["a", "b", "i"]);
        assert_eq!(names(&scopes[1]), ["a", "f"]);
    }

    #[test]
    fn free_names_leave_out_fields_keys_strings_comments_and_own_locals() {
        let text = "local v = redis.call('GET', key) -- not_a_name\nx.y, t[z] = { k = 1 }, \
                    '--q' .. s:len()\nfor n = 1, 2 do v = n end\n";
        let free: Vec<_> = free_names(text).into_iter().collect();
        assert_eq!(free, ["key", "redis", "s", "t", "x", "z"]);
    }
}
