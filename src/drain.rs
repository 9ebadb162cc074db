//! Graceful stop that ends as soon as the last client connection closes.
//!
//! On SIGTERM (and after handing the sockets over on SIGQUIT) Pingora stops accepting, tells
//! every connection to finish, and then sleeps the whole `grace_period_seconds` on its main
//! thread (`Server::run` in pingora-core 0.9: an unconditional `thread::sleep`, with no
//! in-flight tracking) before it drops the runtimes. Nothing in `ServerConf` makes that sleep
//! end early, so slidegate watches its own connection gauge instead: once the proxy's
//! listeners have stopped and no client connection is open, the process exits at once. The
//! grace period stays the upper bound: if connections are still open when Pingora's sleep
//! ends, Pingora cuts them and exits as before.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::metrics::METRICS;

/// How often the connection gauge is read while draining.
const POLL: Duration = Duration::from_millis(10);

/// The access log's writer thread writes and flushes every 5 ms; this lets it write the lines
/// of the last requests before the process exits.
const LOG_SETTLE: Duration = Duration::from_millis(50);

/// Is the drain over? Pure, so the rule is unit-tested: no client connection left.
fn drained(open_connections: i64) -> bool {
    open_connections <= 0
}

/// Call once the proxy service has stopped accepting (its `start_service` returned after the
/// shutdown broadcast): waits until no client connection is open (at most `grace`, after
/// which Pingora's own sleep ends first), removes the pid file if it is ours and exits 0.
pub async fn exit_when_drained(grace: Duration, pid_file: PathBuf) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(POLL);
    while !drained(METRICS.client_connections.get()) {
        if started.elapsed() > grace {
            return;
        }
        tick.tick().await;
    }
    log::info!(
        "graceful shutdown: no client connection left after {:?}, exiting",
        started.elapsed()
    );
    tokio::time::sleep(LOG_SETTLE).await;
    crate::pid_file::remove_if_ours(&pid_file);
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drained_when_no_connection_is_left() {
        assert!(drained(0));
        assert!(!drained(1));
        assert!(
            drained(-1),
            "a gauge that went below zero must not hold the exit"
        );
    }
}
