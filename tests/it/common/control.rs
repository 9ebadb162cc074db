//! The binary's one-shot commands as an operator runs them: `slidegate <args> -c <file>` (`-T`,
//! `-s reload|stop|reopen`, `healthcheck`), and bounded polling for what they leave behind.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::cli::Checked;

/// Run `slidegate <args> -c <config>` with `env` added (`RUST_LOG` removed).
pub fn slidegate(args: &[&str], config: &Path, env: &[(&str, &str)]) -> Checked {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(args)
        .arg("-c")
        .arg(config)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run slidegate {args:?}: {e}"));
    Checked {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Poll every 10 ms until `cond` holds; how long it took, or `None` after `timeout`.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
