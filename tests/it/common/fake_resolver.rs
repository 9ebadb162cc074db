//! A host name whose addresses a test sets: `fake_resolver.c` beside this file, built with `cc`
//! and loaded with `LD_PRELOAD`, answers `getaddrinfo` of one name from a file the test
//! rewrites (every other name resolves as usual).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The shared object, built at the first call.
pub fn shim() -> PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| super::fake_clock::build_shim("fake_resolver"))
        .clone()
}

/// The environment under which `name` resolves to the IPv4 addresses listed in `file`.
pub fn env(name: &str, file: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), shim().to_string_lossy().into_owned()),
        ("FAKE_RESOLVE_NAME".into(), name.into()),
        (
            "FAKE_RESOLVE_FILE".into(),
            file.to_string_lossy().into_owned(),
        ),
    ]
}

/// Point `name` at `addresses` (written whole, then renamed over the file).
pub fn point(file: &Path, addresses: &[&str]) {
    let part = file.with_extension("part");
    std::fs::write(&part, addresses.join("\n")).unwrap();
    std::fs::rename(&part, file).unwrap();
}
