//! Assembles the Redis scripts from their skeletons (`lua/<script>/skeleton.lua`) and each
//! kind of limit's Lua file (`lua/kinds/<kind>.lua`), by `src/limiter/algo/assemble.rs` (shared
//! with the library's tests), into `$OUT_DIR/<script>.lua`, which `src/limiter/algo/script.rs`
//! includes.

use std::path::PathBuf;

#[path = "src/limiter/algo/assemble.rs"]
mod assemble;

/// The scripts, each `lua/<name>/skeleton.lua`; the first names the kinds.
const SCRIPTS: [&str; 3] = ["sliding_window", "inspect", "refund"];

fn read(path: &str) -> String {
    println!("cargo:rerun-if-changed={path}");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn main() {
    println!("cargo:rerun-if-changed=lua/kinds");
    let skeletons: Vec<String> = SCRIPTS
        .iter()
        .map(|name| read(&format!("lua/{name}/skeleton.lua")))
        .collect();
    let names = assemble::kind_names(&skeletons[0])
        .unwrap_or_else(|e| panic!("lua/{}/skeleton.lua: {e}", SCRIPTS[0]));
    let kinds: Vec<(&str, String)> = names
        .iter()
        .map(|&name| (name, read(&format!("lua/kinds/{name}.lua"))))
        .collect();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    for (name, skeleton) in SCRIPTS.iter().zip(&skeletons) {
        let script = assemble::assemble(skeleton, &kinds)
            .unwrap_or_else(|e| panic!("assembling lua/{name}/skeleton.lua: {e}"));
        let out = out_dir.join(format!("{name}.lua"));
        std::fs::write(&out, script).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
