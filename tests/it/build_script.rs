//! `scripts/build`, the README's build command, decides as it says: the profile-guided build
//! (`-Cprofile-use` with the committed profile, an explicit `--target`, into `target/pgo`, the
//! binary copied to `target/release/slidegate`) when `rustc -V` is the profile's, else the plain
//! release build with a line saying why. Run against stub `rustc` and `cargo` on `PATH` that
//! record what they are asked, in a copy of the scripts and the profile's record, so no build
//! runs here (the real one takes minutes; docs/benchmarks.md has its figures).

use std::path::Path;
use std::process::Command;

/// Run a copy of scripts/build whose `rustc -V` says `rustc_version`; what cargo was asked
/// (its arguments and RUSTFLAGS, one line per call), stderr, and whether it succeeded.
fn run(rustc_version: &str, env: &[(&str, &str)]) -> (String, String, bool) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::create_dir_all(root.join("pgo")).unwrap();
    std::fs::copy(repo.join("scripts/build"), root.join("scripts/build")).unwrap();
    std::fs::copy(repo.join("pgo/profile.txt"), root.join("pgo/profile.txt")).unwrap();
    std::fs::write(root.join("pgo/slidegate.profdata"), b"stub").unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.path().join("cargo.log");
    let stub = |name: &str, body: &str| {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
    };
    stub(
        "rustc",
        &format!(
            "case \"$1\" in -vV) echo 'host: x86_64-unknown-linux-gnu';; *) echo '{rustc_version}';; esac"
        ),
    );
    // The stub "builds" the binary where a real build would leave it.
    stub(
        "cargo",
        &format!(
            "echo \"$* | RUSTFLAGS=$RUSTFLAGS\" >> {log}\n\
             dir=target/release; for a in \"$@\"; do case \"$prev\" in --target-dir) dir=$a/x86_64-unknown-linux-gnu/release;; esac; prev=$a; done\n\
             mkdir -p \"$dir\" && echo built > \"$dir/slidegate\"",
            log = log.display()
        ),
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = Command::new("bash")
        .arg(root.join("scripts/build"))
        .env("PATH", path)
        .env_remove("RUSTFLAGS")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    let copied = std::fs::read_to_string(root.join("target/release/slidegate")).is_ok();
    assert!(
        copied || !out.status.success(),
        "no target/release/slidegate"
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (calls, stderr, out.status.success())
}

#[test]
fn the_profiles_rustc_gets_the_profile_guided_build() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("pgo/profile.txt"))
            .unwrap();
    let rustc = text
        .lines()
        .find_map(|l| l.strip_prefix("rustc: "))
        .expect("pgo/profile.txt names its rustc");
    let (calls, stderr, ok) = run(rustc, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(calls.lines().count(), 1, "{calls}");
    assert!(calls.contains("build --release --locked --bins --target x86_64-unknown-linux-gnu --target-dir target/pgo"), "{calls}");
    assert!(
        calls.contains("-Cprofile-use=") && calls.contains("pgo/slidegate.profdata"),
        "{calls}"
    );
    assert!(stderr.contains("(profile-guided)"), "{stderr}");
}

#[test]
fn another_rustc_gets_the_plain_build_and_is_told_why() {
    let (calls, stderr, ok) = run("rustc 1.99.0 (0000000 2027-01-01)", &[]);
    assert!(ok, "{stderr}");
    assert_eq!(
        calls.trim(),
        "build --release --locked --bins | RUSTFLAGS=",
        "{calls}"
    );
    assert!(stderr.contains("is not the profile's rustc"), "{stderr}");
    assert!(stderr.contains("(plain)"), "{stderr}");
    let (calls, stderr, _) = run("rustc 1.95.0", &[("PGO", "0")]);
    assert!(!calls.contains("profile-use"), "{calls}");
    assert!(stderr.contains("PGO=0"), "{stderr}");
}
