//! Shared test harness: real Redis servers and clusters, real upstream HTTP servers and the real
//! slidegate binary, each started on loopback ports chosen at run time and torn down on drop.
#![allow(dead_code)]

use std::process::Command;

pub mod admin;
pub mod arrivals;
pub mod browser;
pub mod cli;
pub mod compose;
pub mod config;
pub mod control;
pub mod delay_proxy;
pub mod fake_clock;
pub mod fake_resolver;
pub mod fetch;
pub mod flood;
pub mod grpc;
pub mod h2frames;
pub mod heavy;
pub mod http;
pub mod kept;
pub mod load;
pub mod log_file;
pub mod model;
pub mod nginx;
pub mod ports;
pub mod process_group;
pub mod proxy;
pub mod ratelimit;
pub mod raw_upstream;
pub mod redis;
pub mod redis_tls;
pub mod script;
pub mod sentinel;
pub mod shared;
pub mod store;
pub mod tls;
pub mod upstream;

/// Panic with an install hint unless `program --version` runs. Never skip: a missing tool is a
/// failed test that says what to install.
pub fn require_tool(program: &str, apt_package: &str) {
    match Command::new(program).arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "`{program} --version` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "`{program}` is required by this test but could not be run ({e}). \
             Install it with `apt-get install {apt_package}` (scripts/test does)."
        ),
    }
}
