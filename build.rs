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

/// Every kind of limit: the files `lua/kinds/<kind>.lua`, by name (a new kind is its file).
fn kind_names() -> Vec<String> {
    let dir = std::fs::read_dir("lua/kinds").unwrap_or_else(|e| panic!("reading lua/kinds: {e}"));
    let mut names: Vec<String> = dir
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("reading lua/kinds: {e}"))
                .file_name()
        })
        .filter_map(|f| f.to_str()?.strip_suffix(".lua").map(str::to_owned))
        .collect();
    names.sort();
    names
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
    println!("cargo:rerun-if-changed=lua/kinds");
    let names = kind_names();
    let kinds: Vec<(&str, String)> = names
        .iter()
        .map(|name| (name.as_str(), read(&format!("lua/kinds/{name}.lua"))))
        .collect();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for name in SCRIPTS {
        let skeleton = read(&format!("lua/{name}/skeleton.lua"));
        let script = assemble::assemble(&skeleton, &kinds)
            .unwrap_or_else(|e| panic!("assembling lua/{name}/skeleton.lua: {e}"));
        let out = out_dir.join(format!("{name}.lua"));
        std::fs::write(&out, script).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
