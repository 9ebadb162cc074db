//! A faked wall clock for a child process (a proxy, a Redis): `fake_clock.c` beside this file,
//! compiled once per test process with `cc` and loaded with `LD_PRELOAD`, moves
//! `CLOCK_REALTIME`, `gettimeofday` and `time` by a fixed offset, so the process starts at the
//! instant a test names (just before a calendar boundary, on a day clocks change) and runs at
//! the real pace. Redis needs `jemalloc-bg-thread no` under it ([`REDIS_ARGS`], which the
//! Redis fixtures add).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Arguments a `redis-server` under the faked clock needs, added by `RedisServer::start_env`
/// and `RedisCluster::start_env`: jemalloc's background thread sleeps in timed waits on a
/// `CLOCK_REALTIME` deadline, which a clock faked into the past puts behind the real one, so
/// every wait returned at once: each Cluster node (which lacked the flag) spun half a core in
/// `futex`, 22 s of system CPU in one 15 s calendar test.
pub const REDIS_ARGS: [&str; 2] = ["--jemalloc-bg-thread", "no"];

/// The shared object, built at the first call (panics with the compiler's output on failure).
pub fn shim() -> PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| build_shim("fake_clock")).clone()
}

/// `tests/it/common/<name>.c` built with `cc` into a shared object under target/ (nothing left
/// in /tmp); built under a name of this process's and renamed, so test processes building it
/// at once never load a half-written file.
pub fn build_shim(name: &str) -> PathBuf {
    super::require_tool("cc", "gcc");
    let source =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/it/common/{name}.c"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (out, part) = (
        dir.join(format!("{name}.so")),
        dir.join(format!("{name}.{}.so", std::process::id())),
    );
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&part)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(
        built.status.success(),
        "cc {name}.c: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::rename(&part, &out).expect("move the shim in place");
    out
}

/// The environment that starts a process with its wall clock at `at_unix_ms` (ms since the
/// Unix epoch) now.
pub fn env(at_unix_ms: i64) -> Vec<(String, String)> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let offset_us = at_unix_ms * 1000 - now.as_micros() as i64;
    vec![
        ("LD_PRELOAD".into(), shim().to_string_lossy().into_owned()),
        ("FAKE_CLOCK_OFFSET_US".into(), offset_us.to_string()),
    ]
}
