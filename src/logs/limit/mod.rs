//! The process's log: env_logger behind a wrapper that keeps what clients can cause from
//! flooding it.
//!
//! Two rules, both decided by pure functions of this module:
//! - Per-connection noise a client causes (a failed TLS handshake, an unknown SNI name, an h2
//!   preface that is not one, a connection reset mid-head) is written at DEBUG, whichever level
//!   Pingora or rustls gave it: [`demoted`] names those lines by target and text. They are
//!   counted in metrics by the code that sees them (`slidegate_tls_handshake_failures_total`,
//!   `slidegate_client_aborts_total`).
//! - Every other ERROR, WARN and INFO line goes through one token bucket, [`RATE`] lines per second with bursts of
//!   [`BURST`], except the startup, reload and shutdown lines of slidegate's own modules
//!   ([`exempt`]), which no client can cause. A line over the bucket is dropped and counted
//!   in `slidegate_log_lines_suppressed_total`; at most every [`SUMMARY_INTERVAL`] one WARN
//!   line says how many were dropped. So whatever a client sends, the log grows by at most
//!   `BURST + RATE × seconds` lines plus one summary per interval. DEBUG and TRACE lines,
//!   written only when `RUST_LOG` asks for them, are not bounded: whoever turns them on wants
//!   every one.

use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use log::{Level, Log, Metadata, Record};
use prometheus::{register_int_counter, IntCounter};

mod bucket;
mod every;

pub use bucket::{Admit, Bucket};
pub use every::{Every, Throttled};

/// Lines per second the bucket refills with.
pub const RATE: u32 = 20;
/// Lines the bucket holds: a burst (a startup, an outage beginning) is written whole.
pub const BURST: u32 = 100;
/// At most one line per recurring event (an upstream refusing connections) this often.
pub const EVENT_INTERVAL: Duration = Duration::from_secs(10);
/// At most one "suppressed N lines" summary this often.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// `slidegate_log_lines_suppressed_total`.
pub static SUPPRESSED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "slidegate_log_lines_suppressed_total",
        "Log lines dropped because more than the log's rate bound were written"
    )
    .expect("register slidegate_log_lines_suppressed_total")
});

/// Pure: is this a line a client causes once per connection or request, to be written at
/// DEBUG whatever its level? rustls's own lines (its `logging` feature: "Illegal SNI", bad
/// records) always are: a TLS failure of ours surfaces as an error returned to us instead.
/// Of Pingora's, those about the downstream side of one connection.
pub fn demoted(target: &str, message: &str) -> bool {
    if target.starts_with("rustls") || target.starts_with("tokio_rustls") {
        return true;
    }
    if !target.starts_with("pingora") {
        return false;
    }
    const CLIENT_CAUSED: [&str; 11] = [
        "Downstream handshake error",
        "Downstream handshake timeout",
        "H2 handshake error",
        "HTTP server fails to read from downstream",
        "HTTP server fails to finish the request",
        "failed to send error response to downstream",
        "TLS shutdown failed",
        "Peer sent more data than expected",
        "invalid content-length header",
        "negative content-length header",
        "tearing down downstream h2 connection",
    ];
    if CLIENT_CAUSED.iter().any(|p| message.starts_with(p)) {
        return true;
    }
    // A backend's health flips: slidegate writes its own line for each (upstream_health).
    if target.starts_with("pingora_load_balancing")
        && (message.contains(" becomes unhealthy") || message.contains(" becomes healthy"))
    {
        return true;
    }
    // A head that could not be read (reset, closed, timed out): Pingora's line names the
    // downstream session type, which only that line does.
    message.starts_with("Fail to proxy") && message.contains("downstream session type")
}

/// Pure: a line of slidegate's own start, reload or stop (never caused by a client), written
/// whatever the bucket holds.
pub fn exempt(target: &str) -> bool {
    const OWN: [&str; 6] = [
        "slidegate::process::server",
        "slidegate::process::reload",
        "slidegate::config",
        "slidegate::process::drain",
        "slidegate::process::pid_file",
        "slidegate::logs::limit",
    ];
    OWN.iter().any(|m| {
        target
            .strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// Pure: does a line (not [`demoted`]) go through the bucket? ERROR, WARN and INFO lines do,
/// but for slidegate's own lifecycle lines ([`exempt`]). DEBUG and TRACE lines are written
/// only when an operator asked for them (`RUST_LOG`), to see everything: not bounded.
pub fn bounded(level: Level, target: &str) -> bool {
    level <= Level::Info && !exempt(target)
}

/// env_logger with [`demoted`] and the bucket in front.
struct Limited {
    inner: env_logger::Logger,
    bucket: Mutex<Bucket>,
}

impl Limited {
    fn write_summary(&self, suppressed: u64) {
        let args = format_args!(
            "log rate bound ({RATE} lines/s, burst {BURST}): suppressed {suppressed} lines"
        );
        self.inner.log(
            &Record::builder()
                .args(args)
                .level(Level::Warn)
                .target("slidegate::logs::limit")
                .build(),
        );
    }

    /// Through the bucket; `true` if the line may be written.
    fn admit(&self) -> bool {
        let admit = {
            let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            bucket.admit(Instant::now())
        };
        if !admit.write {
            SUPPRESSED.inc();
        }
        if let Some(n) = admit.summary {
            self.write_summary(n);
        }
        admit.write
    }

    /// Write the summary of a flood that ended (no later line would).
    fn tick(&self) {
        let summary = {
            let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            bucket.tick(Instant::now())
        };
        if let Some(n) = summary {
            self.write_summary(n);
        }
    }
}

impl Log for Limited {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        let target = record.target();
        if record.level() <= Level::Info && is_third_party(target) {
            let text;
            let message = match record.args().as_str() {
                Some(s) => s,
                None => {
                    text = record.args().to_string();
                    &text
                }
            };
            if demoted(target, message) {
                let debug = Record::builder()
                    .args(*record.args())
                    .level(Level::Debug)
                    .target(target)
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build();
                if self.inner.matches(&debug) {
                    self.inner.log(&debug);
                }
                return;
            }
        }
        if !self.inner.matches(record) {
            return;
        }
        if !bounded(record.level(), target) || self.admit() {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

fn is_third_party(target: &str) -> bool {
    target.starts_with("pingora")
        || target.starts_with("rustls")
        || target.starts_with("tokio_rustls")
}

/// Install the log: env_logger configured by `RUST_LOG` (default `info`), behind the
/// demotion rules and the bucket, and a thread that writes the summary of a flood once it
/// has ended.
pub fn init() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = inner.filter();
    LazyLock::force(&SUPPRESSED);
    let logger: &'static Limited = Box::leak(Box::new(Limited {
        inner,
        bucket: Mutex::new(Bucket::new(RATE, BURST, SUMMARY_INTERVAL, Instant::now())),
    }));
    if log::set_logger(logger).is_err() {
        return;
    }
    // rustls and Pingora log below `max` only as far as `max` allows; their demoted lines
    // are filtered again at DEBUG by env_logger.
    log::set_max_level(max);
    let _ = std::thread::Builder::new()
        .name("log-summary".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            logger.tick();
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_caused_tls_and_connection_lines_are_demoted() {
        assert!(demoted(
            "rustls::server::hs",
            "Illegal SNI hostname received [49]"
        ));
        assert!(demoted(
            "pingora_core::services::listening",
            "Downstream handshake error from 127.0.0.1:5000: TLSHandshakeFailure"
        ));
        assert!(demoted(
            "pingora_core::apps",
            "H2 handshake error connection error"
        ));
        assert!(demoted(
            "pingora_proxy",
            "Fail to proxy: Downstream ConnectionClosed, downstream session type: HTTP/1.1"
        ));
        // slidegate writes its own line for a server's health flip (upstream_health).
        assert!(demoted(
            "pingora_load_balancing",
            "Backend { addr: Inet(127.0.0.1:3001), weight: 1 } becomes unhealthy, refused"
        ));
    }

    #[test]
    fn upstream_and_own_lines_are_not_demoted() {
        assert!(!demoted(
            "pingora_proxy",
            "Fail to proxy: Upstream ConnectRefused, status: 502, tries: 1, retry: false, GET /"
        ));
        assert!(!demoted("slidegate::proxy", "Downstream handshake error"));
        assert!(!demoted("pingora_core::server", "Bootstrap starting"));
    }

    #[test]
    fn debug_and_lifecycle_lines_are_not_bounded() {
        assert!(bounded(Level::Error, "pingora_proxy"));
        assert!(bounded(Level::Info, "slidegate::proxy"));
        assert!(!bounded(Level::Warn, "slidegate::process::reload"));
        assert!(!bounded(Level::Debug, "pingora_proxy"));
        assert!(!bounded(Level::Trace, "slidegate::proxy"));
    }

    #[test]
    fn only_own_lifecycle_modules_are_exempt() {
        assert!(exempt("slidegate::process::server"));
        assert!(exempt("slidegate::process::reload"));
        assert!(exempt("slidegate::config::store"));
        assert!(!exempt("slidegate::serverless"));
        assert!(!exempt("slidegate::proxy"));
        assert!(!exempt("pingora_core::server"));
    }
}
