//! Reading a log file the proxy writes (the access log), with a bounded wait.

use std::path::Path;
use std::time::{Duration, Instant};

/// The file's lines once it has at least `n` (bounded wait: the access log writer flushes
/// within milliseconds when idle). Panics, with what the file holds, after 10 s.
pub fn wait_lines(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} has {} lines, expected {n}: {text}",
            path.display(),
            lines.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The file's lines once one of them contains `needle` (bounded wait, as [`wait_lines`]): a
/// sentinel request logged after others shows that the lines before it are written.
pub fn wait_line_containing(path: &Path, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l.contains(needle)) {
            return text.lines().map(str::to_string).collect();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {needle:?} in {} ({} lines)",
            path.display(),
            text.lines().count()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
