//! A real HTTP/2 load client: h2load (nghttp2-client), for bursts of many connections × many
//! concurrent streams against the real binary, each burst bounded in requests and time.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

/// One h2load burst: `connections` × `streams` concurrent streams, `requests` in all.
#[derive(Debug, Clone)]
pub struct Burst {
    pub connections: usize,
    pub streams: usize,
    pub requests: usize,
    /// Extra request headers, `name: value`.
    pub headers: Vec<String>,
    /// Request path.
    pub path: String,
}

impl Burst {
    /// `connections` × 10 streams, 4000 requests to `/` with header `X-K: <key>`, at most 1000
    /// per connection: slidegate's `keepalive_requests`, after which h2load, which opens no new
    /// connection on GOAWAY, would count the rest as failed.
    pub fn keyed(connections: usize, key: &str) -> Burst {
        Burst {
            connections,
            streams: 10,
            requests: 4000.max(connections * 10).min(connections * 1000),
            headers: vec![format!("X-K: {key}")],
            path: "/".into(),
        }
    }
}

/// What h2load reported: responses by status class, and how many requests got no answer
/// (`failed`: h2load's errored + timed out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BurstResult {
    pub s2xx: u64,
    pub s3xx: u64,
    pub s4xx: u64,
    pub s5xx: u64,
    pub failed: u64,
    /// Slowest request, from h2load's "time for request" line (max column).
    pub max_latency: Duration,
}

/// Run `burst` over h2c (prior knowledge) against `addr` and parse the summary. Panics with
/// h2load's output if it cannot run. Bounded: a connection is given up after 30 s, or 30 s
/// without an answer (h2load's `-T` and `-N`). A burst of 4,000 requests on 300 connections
/// took up to 12 s of the debug build beside the rest of the suite, and 10 s cut 258 of them
/// once: the tests bound what a burst admits, not how fast a loaded debug build is.
pub fn h2load(addr: SocketAddr, burst: &Burst) -> BurstResult {
    run_h2load(addr, burst, &format!("-n{}", burst.requests), &[])
}

/// [`h2load`] of one `burst` against every address at once (a thread each), results in order.
pub fn h2load_each(addrs: &[SocketAddr], burst: &Burst) -> Vec<BurstResult> {
    std::thread::scope(|s| {
        let runs: Vec<_> = (addrs.iter())
            .map(|&a| s.spawn(move || h2load(a, burst)))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// [`h2load`] for `seconds` (h2load's `-D`) instead of `burst.requests` requests.
pub fn h2load_for(addr: SocketAddr, burst: &Burst, seconds: u32) -> BurstResult {
    run_h2load(addr, burst, &format!("-D{seconds}"), &[])
}

/// [`h2load_for`] over several paths: each connection takes them in turn (`burst.path` first),
/// so one run stands for many clients keyed by their path or query.
pub fn h2load_paths_for(
    addr: SocketAddr,
    burst: &Burst,
    more_paths: &[String],
    seconds: u32,
) -> BurstResult {
    run_h2load(addr, burst, &format!("-D{seconds}"), more_paths)
}

fn run_h2load(addr: SocketAddr, burst: &Burst, amount: &str, more_paths: &[String]) -> BurstResult {
    super::require_tool("h2load", "nghttp2-client");
    let mut cmd = Command::new("h2load");
    cmd.arg(amount)
        .arg(format!("-c{}", burst.connections))
        .arg(format!("-m{}", burst.streams))
        .args(["-t", "1", "-T", "30", "-N", "30"]);
    for h in &burst.headers {
        cmd.arg("-H").arg(h);
    }
    cmd.arg(format!("http://{addr}{}", burst.path));
    cmd.args(more_paths.iter().map(|p| format!("http://{addr}{p}")));
    let out = cmd.output().expect("run h2load");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    parse_summary(&text).unwrap_or_else(|| {
        panic!(
            "h2load output not understood ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Parse `status codes: 10 2xx, 0 3xx, 3990 4xx, 0 5xx` and `requests: ... N errored, M timeout`.
fn parse_summary(text: &str) -> Option<BurstResult> {
    let mut r = BurstResult::default();
    let codes = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("status codes:"))?;
    for part in codes.split(',') {
        let mut it = part.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        match it.next()? {
            "2xx" => r.s2xx = n,
            "3xx" => r.s3xx = n,
            "4xx" => r.s4xx = n,
            "5xx" => r.s5xx = n,
            _ => return None,
        }
    }
    let requests = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("requests:"))?;
    // "failed" also counts 4xx and 5xx answers; what was never answered is "errored" + "timeout".
    let count = |what: &str| -> Option<u64> {
        requests
            .split(',')
            .find_map(|p| p.trim().strip_suffix(what))?
            .trim()
            .parse()
            .ok()
    };
    r.failed = count(" errored")? + count(" timeout")?;
    // "time for request:      1.23ms    250.12ms ..." : min, max, mean, sd, +/- sd
    if let Some(line) = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("time for request:"))
    {
        if let Some(max) = line.split_whitespace().nth(1) {
            r.max_latency = parse_h2load_duration(max).unwrap_or_default();
        }
    }
    Some(r)
}

/// `250.12ms`, `12us`, `1.02s` as a Duration.
fn parse_h2load_duration(text: &str) -> Option<Duration> {
    let (num, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let v: f64 = num.parse().ok()?;
    let secs = match unit {
        "us" => v / 1e6,
        "ms" => v / 1e3,
        "s" => v,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}
