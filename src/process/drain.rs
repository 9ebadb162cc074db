//! Graceful stop that ends as soon as the last client connection closes.
//!
//! On SIGTERM (and after handing the sockets over on SIGQUIT) Pingora stops accepting, tells
//! every connection to finish, and then sleeps the whole `grace_period_seconds` on its main
//! thread (`Server::run` in pingora-core 0.9: an unconditional `thread::sleep`, with no
//! in-flight tracking) before it drops the runtimes. Nothing in `ServerConf` makes that sleep
//! end early, so slidegate watches its own connection gauge instead: once the proxy's
//! listeners have stopped and no client connection has been open for `QUIET` (200 ms), the process
//! exits. Not after a SIGQUIT upgrade (the pid file then names the successor): the old process
//! waits the whole grace period, as before. The
//! grace period stays the upper bound: if connections are still open when Pingora's sleep
//! ends, Pingora cuts them and exits as before.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::edge::quiet::Quiet;
use crate::metrics::METRICS;

/// How often the connection gauge is read while draining.
const POLL: Duration = Duration::from_millis(10);

/// How long the gauge must stay at zero before the process exits: a connection the proxy
/// accepted just before its listener stopped is counted only when its task first runs, so one
/// zero reading is not proof that nothing is left. Any connection counted meanwhile starts the
/// quiet period again.
const QUIET: Duration = Duration::from_millis(200);

/// The access log's writer thread writes and flushes every 5 ms; this lets it write the lines
/// of the last requests before the process exits.
const LOG_SETTLE: Duration = Duration::from_millis(50);

/// Call once the proxy service has stopped accepting (its `start_service` returned after the
/// shutdown broadcast): waits until no client connection is open (at most `grace`, after
/// which Pingora's own sleep ends first), calls `before_exit` (no connection is left, so no
/// decision is made any more), removes the pid file if it is ours and exits 0.
pub async fn exit_when_drained(grace: Duration, pid_file: PathBuf, before_exit: impl FnOnce()) {
    // After a SIGQUIT upgrade the successor serves the sockets: leave the old process to
    // Pingora's whole grace period, as nginx's old master waits for its workers. Exiting at
    // the first moment without a connection there cut one request in a few thousand (the
    // upgrade test), which a plain SIGTERM stop never showed.
    if crate::process::pid_file::names_another(&pid_file) {
        log::info!("graceful shutdown after an upgrade: waiting the grace period");
        return;
    }
    let started = Instant::now();
    let mut tick = tokio::time::interval(POLL);
    let mut quiet = Quiet::new(QUIET);
    while !quiet.settled(METRICS.client_connections.get(), Instant::now()) {
        if started.elapsed() > grace {
            return;
        }
        tick.tick().await;
    }
    log::info!(
        "graceful shutdown: no client connection left after {:?}, exiting",
        started.elapsed()
    );
    before_exit();
    tokio::time::sleep(LOG_SETTLE).await;
    crate::process::pid_file::remove_if_ours(&pid_file);
    std::process::exit(0);
}
