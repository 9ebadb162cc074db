//! The capacity model of `scripts/capacity` (docs/capacity.md) does the arithmetic it states:
//! `scripts/capacity --model-only` on fixed per-core figures gives the proxy cores, Redis
//! masters (bound by CPU or by memory), memory and this machine's prediction worked out here by
//! hand, and refuses figures it lacks, naming them. No benchmark runs (the model is pure).

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// `scripts/capacity --model-only -` fed `figures`: (the JSON it printed, stderr, success).
fn model(figures: &Value) -> (Value, String, bool) {
    common::require_tool("python3", "python3");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/capacity");
    let mut child = Command::new("python3")
        .arg(script)
        .args(["--model-only", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3 scripts/capacity");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(figures.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let printed = if out.status.success() {
        serde_json::from_slice(&out.stdout).expect("--model-only prints JSON")
    } else {
        Value::Null
    };
    (printed, stderr, out.status.success())
}

/// Round figures, so every expected value below is a line of arithmetic.
fn figures() -> Value {
    json!({
        "proxy_us": { "nolimit": 30, "redis": 40 },
        "redis_us": { "log": { "1": 20, "8": 10 }, "slots": { "1": 25, "8": 12 } },
        "redis_us_proxied": 25,
        "bytes_per_client": { "redis_log": 276, "redis_slots": 180, "memory_store": 127 },
        "machine_us": { "loadgen": 20, "upstream": 15 }
    })
}

/// With the default assumptions (50 % CPU, every request one decision of the log kind at one
/// decision per call, 4-core proxies, 6 tracked clients per req/s): Redis costs the proxied
/// 25 µs (above the paced 20), so a master carries 20,000 decisions/s and 1M req/s needs 50
/// of them, 100 nodes with replicas; proxies 1M × 40 µs / 0.5 = 80 cores, 20 instances.
#[test]
fn default_sizing_is_the_stated_arithmetic() {
    let (out, stderr, ok) = model(&figures());
    assert!(ok, "{stderr}");
    assert_eq!(out["redis_us_used"], json!(25.0));
    let rows = out["sizing"].as_array().unwrap();
    let pick = |i: usize, k: &str| rows[i][k].clone();
    assert_eq!(
        rows.iter()
            .map(|r| r["rps"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [10_000, 100_000, 1_000_000]
    );
    // 10k: 0.8 cores, yet never fewer than 2 proxies; one master at half of 20k.
    assert_eq!(pick(0, "proxy_cores"), json!(0.8));
    assert_eq!(pick(0, "proxies"), json!(2));
    assert_eq!(pick(0, "masters"), json!(1));
    // 100k: 8 cores = 2 proxies of 4; 5 masters.
    assert_eq!(pick(1, "proxy_cores"), json!(8.0));
    assert_eq!(pick(1, "proxies"), json!(2));
    assert_eq!(pick(1, "masters"), json!(5));
    // 1M: 80 cores, 20 proxies; 50 masters by CPU, 1 by memory (6M clients × 276 B × 1.5 =
    // 2.31 GiB, under 8 GiB); 100 nodes.
    assert_eq!(pick(2, "proxy_cores"), json!(80.0));
    assert_eq!(pick(2, "proxies"), json!(20));
    assert_eq!(pick(2, "decisions_per_master"), json!(20_000));
    assert_eq!(pick(2, "masters_cpu"), json!(50));
    assert_eq!(pick(2, "masters_memory"), json!(1));
    assert_eq!(pick(2, "redis_nodes"), json!(100));
    assert_eq!(pick(2, "clients"), json!(6_000_000));
    assert_eq!(pick(2, "redis_gb"), json!(2.31));
    // The memory store: 6M × 127 B in each proxy.
    assert_eq!(pick(2, "memory_store_gb_per_proxy"), json!(0.71));
    // One key: 8 per call at 10 µs, one core: 100,000 decisions/s.
    assert_eq!(out["hot_key_decisions_per_s"], json!(100_000));
    // This machine: 2 cores / (40 + 25 + 20 + 15 µs) = 20,000 req/s whatever the masters;
    // Redis's share split over them; the Redis-bound ceiling N × 40,000.
    let machine = out["machine"].as_array().unwrap();
    for (i, m) in machine.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(m["masters"], json!(n));
        assert_eq!(m["rps"], json!(20_000), "{m}");
        assert_eq!(m["redis_bound_rps"], json!(40_000 * n), "{m}");
    }
    assert_eq!(machine[1]["redis_cpu_per_master"], json!(0.25));
}

/// Assumptions change the answer as stated: the slotted kind at 8 per call scales the proxied
/// figure by slots/log (12/10: 30 µs), so 1M decisions need 60 masters at 50 %; with 0.25 GiB
/// per master and 5 % of requests limited, memory binds (6M × 180 B × 1.5 = 1.51 GiB: 7
/// masters; CPU: 50k × 30 µs / 0.5 = 3).
#[test]
fn assumptions_move_the_sizing() {
    let mut f = figures();
    f["assumptions"] = json!({ "kind": "slots", "batch": 8, "targets": [1_000_000] });
    let (out, stderr, ok) = model(&f);
    assert!(ok, "{stderr}");
    assert_eq!(out["redis_us_used"], json!(30.0));
    assert_eq!(out["sizing"][0]["masters"], json!(60));

    f["assumptions"] = json!({ "kind": "slots", "batch": 8, "targets": [1_000_000],
                              "limited_share": 0.05, "max_gb_per_master": 0.25 });
    let (out, stderr, ok) = model(&f);
    assert!(ok, "{stderr}");
    let row = &out["sizing"][0];
    assert_eq!(row["masters_cpu"], json!(3), "{row}");
    assert_eq!(row["masters_memory"], json!(7), "{row}");
    assert_eq!(row["masters"], json!(7), "{row}");
}

/// A figure missing or not a positive number, or an unknown assumption, is refused by name.
#[test]
fn missing_or_bad_figures_are_named() {
    let mut f = figures();
    f["proxy_us"].as_object_mut().unwrap().remove("redis");
    let (_, stderr, ok) = model(&f);
    assert!(!ok);
    assert!(stderr.contains("missing figure proxy_us.redis"), "{stderr}");

    let mut f = figures();
    f["redis_us"]["log"]["1"] = json!(0);
    let (_, stderr, ok) = model(&f);
    assert!(!ok);
    assert!(
        stderr.contains("redis_us.log.1 must be a positive number"),
        "{stderr}"
    );

    let mut f = figures();
    f["assumptions"] = json!({ "headroom": 0.5 });
    let (_, stderr, ok) = model(&f);
    assert!(!ok);
    assert!(
        stderr.contains("unknown assumption(s): headroom"),
        "{stderr}"
    );
}
