//! The README's quick start, run as a reader runs it: its shell block verbatim, in a temporary
//! directory, with the example config. It shows five 200s then a 429 and the metrics, and when
//! it ends nothing it started is still running.
//!
//! What differs from a reader's run, and only that:
//! - the ports: the example config listens on 8080 (proxy) and 9090 (admin) and proxies to
//!   3000, which other programs (or other tests) may hold here. Each is replaced by a free
//!   port, in the copy of `config/slidegate.toml` the block reads and in the block's text;
//! - the build: `scripts/build` becomes `:` (a no-op), and `target/release/slidegate`
//!   in the temporary directory is the binary this test run built.

use crate::common;

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::ports::free_port;
use common::process_group::ProcessGroup;
use common::require_tool;

/// The first ```sh block under `## Quick start`.
fn quick_start_block(readme: &str) -> &str {
    let section = &readme[readme
        .find("## Quick start")
        .expect("a quick start section")..];
    let block = section.split("```sh\n").nth(1).expect("a sh block");
    block.split("\n```").next().unwrap()
}

#[test]
fn the_quick_start_works_and_leaves_no_process_behind() {
    require_tool("python3", "python3");
    require_tool("curl", "curl");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let block = quick_start_block(&readme);
    for needed in ["scripts/build", "8080", "9090", "3000", "kill $SG $APP"] {
        assert!(
            block.contains(needed),
            "the quick start no longer has {needed:?}"
        );
    }

    let (proxy, admin, app) = (free_port(), free_port(), free_port());
    let ports = |text: &str| {
        text.replace("8080", &proxy.to_string())
            .replace("9090", &admin.to_string())
            .replace("3000", &app.to_string())
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::create_dir_all(dir.path().join("target/release")).unwrap();
    let example = std::fs::read_to_string(repo.join("config/slidegate.toml")).unwrap();
    std::fs::write(dir.path().join("config/slidegate.toml"), ports(&example)).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_slidegate"),
        dir.path().join("target/release/slidegate"),
    )
    .unwrap();
    let script = ports(block).replacen("scripts/build", ":", 1);

    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env_remove("RUST_LOG");
    let mut group = ProcessGroup::spawn(cmd);
    let done = group
        // A bound that stops a hung script, not a speed test: the script itself takes about 10 s
        // (one run took over 60 s beside a clippy build of the whole workspace).
        .wait_leader(Duration::from_secs(180))
        .unwrap_or_else(|printed| panic!("the quick start did not finish: {printed}"));
    let output = format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        done.status, done.stdout, done.stderr
    );
    println!("{output}");

    assert!(
        done.survivors.is_empty(),
        "still running after the quick start ended: {:?}\n{output}",
        done.survivors
    );
    for port in [proxy, admin, app] {
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "something still listens on {port}\n{output}"
        );
    }
    // It did what the README says it shows.
    assert!(
        done.stdout.contains("is valid"),
        "-t did not validate:\n{output}"
    );
    let statuses: Vec<&str> = done
        .stdout
        .lines()
        .filter(|l| l.starts_with("HTTP/"))
        .collect();
    assert_eq!(statuses.len(), 7, "{output}");
    assert!(
        statuses[..5].iter().all(|l| l.contains(" 200 ")),
        "{output}"
    );
    assert!(
        statuses[5..].iter().all(|l| l.contains(" 429 ")),
        "{output}"
    );
    for line in [
        "slidegate_requests_total{decision=\"allowed\",route=\"login\"} 5",
        "slidegate_requests_total{decision=\"denied\",route=\"login\"} 2",
    ] {
        assert!(done.stdout.contains(line), "no `{line}`:\n{output}");
    }
}
