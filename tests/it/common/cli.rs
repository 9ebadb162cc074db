//! The binary's config check as an operator runs it: `slidegate -t -c <file>`, and the
//! effective configuration it prints with `-T`.

use std::path::Path;
use std::process::Command;

/// What `slidegate -t` said.
#[derive(Debug)]
pub struct Checked {
    /// Exit status 0.
    pub ok: bool,
    /// Its standard output (the "is valid" line).
    pub stdout: String,
    /// Its standard error (the error, naming file, line and key).
    pub stderr: String,
}

impl Checked {
    /// Both streams, stdout first.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Run `slidegate -t -c <path>` with `env` added (and `RUST_LOG` removed, so the output is
/// only what `-t` itself prints).
pub fn check_config(path: &Path, env: &[(&str, &str)]) -> Checked {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("-t")
        .arg("-c")
        .arg(path)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run slidegate -t");
    Checked {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `slidegate -T -c <path>` with `env` added: the effective configuration (every default
/// filled in) as TOML. Panics unless it succeeds.
pub fn effective_config(path: &Path, env: &[(&str, &str)]) -> toml::Table {
    let out = super::control::slidegate(&["-T"], path, env);
    assert!(out.ok, "-T failed: {}", out.stderr);
    out.stdout.parse().expect("-T prints TOML")
}
