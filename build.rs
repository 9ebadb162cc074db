//! Assembles the Redis scripts from their skeletons (`lua/<script>/skeleton.lua`) and each
//! kind of limit's Lua file (`lua/kinds/<kind>.lua`), by `src/limiter/algo/assemble.rs` (shared
//! with the library's tests), into `$OUT_DIR/<script>.lua`, which `src/limiter/algo/script.rs`
//! includes.

use std::path::PathBuf;

#[path = "src/limiter/algo/assemble.rs"]
mod assemble;

/// The scripts, each `lua/<name>/skeleton.lua`.
const SCRIPTS: [&str; 3] = ["sliding_window", "inspect", "refund"];

fn read(path: &str) -> String {
    println!("cargo:rerun-if-changed={path}");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// Every kind of limit, by name: each file `lua/kinds/<kind>.lua`, or folder `lua/kinds/<kind>/`
/// of files split by concern (a new kind is its file or folder), with its text.
fn kinds() -> Vec<(String, String)> {
    let entries = |dir: &str| -> Vec<std::path::PathBuf> {
        println!("cargo:rerun-if-changed={dir}");
        let read = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {dir}: {e}"));
        let mut paths: Vec<_> = read
            .map(|entry| {
                entry
                    .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
                    .path()
            })
            .collect();
        paths.sort();
        paths
    };
    let mut kinds = Vec::new();
    for path in entries("lua/kinds") {
        let name = path.file_stem().and_then(|n| n.to_str()).map(str::to_owned);
        let text = if path.is_dir() {
            let dir = path.to_string_lossy().into_owned();
            let files: Vec<String> = entries(&dir)
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "lua"))
                .map(|p| read(&p.to_string_lossy()))
                .collect();
            assemble::kind_text(&files)
        } else if path.extension().is_some_and(|e| e == "lua") {
            read(&path.to_string_lossy())
        } else {
            continue;
        };
        kinds.extend(name.map(|n| (n, text)));
    }
    kinds
}

/// `slidegate_build_info`'s commit: `git rev-parse` of the tree being built, when it is a git
/// checkout (a source archive or a Docker context without `.git` says "unknown").
fn commit() {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // Watched when they exist (a ref may be packed): a new commit rebuilds with its name.
    let watch = |path: Option<String>| {
        if let Some(path) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    };
    watch(git(&["rev-parse", "--git-path", "HEAD"]));
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(git(&["rev-parse", "--git-path", &reference]));
    }
    if let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) {
        println!("cargo:rustc-env=SLIDEGATE_COMMIT={commit}");
    }
}

fn main() {
    commit();
    let owned = kinds();
    let kinds: Vec<(&str, String)> = owned.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for name in SCRIPTS {
        let skeleton = read(&format!("lua/{name}/skeleton.lua"));
        let script = assemble::assemble(&skeleton, &kinds)
            .unwrap_or_else(|e| panic!("assembling lua/{name}/skeleton.lua: {e}"));
        let out = out_dir.join(format!("{name}.lua"));
        std::fs::write(&out, script).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
