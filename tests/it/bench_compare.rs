//! `BOTH=1 scripts/bench` prints every target for the plain and the PGO build side by side
//! (`scripts/bench.d/compare.py`, issue 57): each report's `- PASS|FAIL|SKIPPED: what — value`
//! lines, from whichever script wrote them, become one row per target with both builds' value
//! and verdict. Checked on two small reports written here (no benchmark runs).

use crate::common;

use std::path::Path;
use std::process::Command;

/// compare.py on two reports: (stdout, success).
fn compare(plain: &str, pgo: &str) -> (String, bool) {
    common::require_tool("python3", "python3");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("plain.md"), dir.path().join("pgo.md"));
    std::fs::write(&a, plain).unwrap();
    std::fs::write(&b, pgo).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench.d/compare.py");
    let out = Command::new("python3")
        .arg(script)
        .args([&a, &b])
        .output()
        .expect("run compare.py");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.success(),
    )
}

#[test]
fn both_builds_targets_are_one_row_each_with_their_verdicts() {
    let plain = "Targets:\n\n\
        - PASS: Redis route ≥ 1.3× nginx + Lua + Redis (E / L req/s) — 1.310×\n\
        - FAIL: slidegate no-limit route ≥ 1.05× minimal Pingora proxy (C / M req/s) — 0.750×\n\
        | a table row - PASS: not a target |\n\
        \n- FAIL: memory store ≤ 160 B of RSS per tracked client — 170 B\n";
    let pgo =
        "- PASS: slidegate no-limit route ≥ 1.05× minimal Pingora proxy (C / M req/s) — 1.090×\n\
        - PASS: Redis route ≥ 1.3× nginx + Lua + Redis (E / L req/s) — 1.400×\n\
        - SKIPPED: denied flood ≥ 1.5× Redis allowed path — not measured\n";
    let (out, ok) = compare(plain, pgo);
    assert!(ok, "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(
        rows[1..],
        [
            "| Redis route ≥ 1.3× nginx + Lua + Redis (E / L req/s) | PASS 1.310× | PASS 1.400× |",
            "| slidegate no-limit route ≥ 1.05× minimal Pingora proxy (C / M req/s) | FAIL 0.750× | PASS 1.090× |",
            "| memory store ≤ 160 B of RSS per tracked client | FAIL 170 B | — |",
            "| denied flood ≥ 1.5× Redis allowed path | — | SKIPPED not measured |",
        ],
        "{out}"
    );
    assert!(
        out.trim_end()
            .ends_with("plain: 1 PASS, 2 FAIL; PGO: 2 PASS, 0 FAIL"),
        "{out}"
    );
}

#[test]
fn a_missing_report_is_an_error() {
    common::require_tool("python3", "python3");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench.d/compare.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["/nonexistent/plain.md", "/nonexistent/pgo.md"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("compare:"));
}
