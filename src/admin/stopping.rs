//! The order of a stop, on the signals Pingora's main loop waits for (its `ShutdownSignalWatch`,
//! handed to `Server::run` in `RunArgs`):
//!
//! - **SIGTERM**: `/readyz` answers 503 (*draining*) at once, while the proxy keeps serving as
//!   before (new connections, kept ones, every protocol) for `server.shutdown_delay`, so load
//!   balancers and Kubernetes endpoints stop sending new clients first; only then is Pingora told
//!   to stop (listeners close, connections finish: [`crate::process::drain`]). As
//!   kube-apiserver's `--shutdown-delay-duration` and Traefik's `requestAcceptGraceTimeout`,
//!   both 0 by default. `/healthz` stays 200 and the admin listener answers until the process
//!   exits, so a probe reads *draining*, not a refused connection.
//! - **SIGQUIT** (zero-downtime upgrade): no delay (the successor takes the sockets over, there
//!   is no gap to hide). The hand-over hook runs first (the memory store's windows are written
//!   for the successor: [`crate::limiter::memory::persist`]), then Pingora sends the sockets.
//! - **SIGINT**: fast shutdown, also during the delay.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ListenFds, RuntimeOpts, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::Service;
use tokio::signal::unix::{signal, SignalKind};

/// Where the process is in its life: shared by the signal watch, the admin listener and the
/// store's saving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serving; no stop asked.
    Serving,
    /// SIGTERM received: `/readyz` is 503 from now until exit.
    Draining,
    /// SIGQUIT received: the sockets go (or went) to a successor.
    HandedOver,
}

/// The shared phase (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Stopping(Arc<AtomicU8>);

impl Stopping {
    /// A process that is serving.
    pub fn new() -> Stopping {
        Stopping::default()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            0 => Phase::Serving,
            1 => Phase::Draining,
            _ => Phase::HandedOver,
        }
    }

    /// True from SIGTERM on.
    pub fn is_draining(&self) -> bool {
        self.phase() == Phase::Draining
    }

    fn set(&self, phase: Phase) {
        let v = match phase {
            Phase::Serving => 0,
            Phase::Draining => 1,
            Phase::HandedOver => 2,
        };
        self.0.store(v, Ordering::Release);
    }
}

/// Pingora's signal watch with slidegate's order (see the module documentation).
pub struct Signals {
    stopping: Stopping,
    delay: Duration,
    /// Runs on SIGQUIT, before Pingora sends the listening sockets to the successor.
    on_handover: Box<dyn Fn() + Send + Sync>,
}

impl Signals {
    /// The watch for `stopping`, serving `delay` after SIGTERM, calling `on_handover` on SIGQUIT.
    pub fn new(
        stopping: Stopping,
        delay: Duration,
        on_handover: impl Fn() + Send + Sync + 'static,
    ) -> Signals {
        Signals {
            stopping,
            delay,
            on_handover: Box::new(on_handover),
        }
    }
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        // As Pingora's own watch: registered when its main loop starts.
        let mut quit = signal(SignalKind::quit()).expect("cannot catch SIGQUIT");
        let mut term = signal(SignalKind::terminate()).expect("cannot catch SIGTERM");
        let mut int = signal(SignalKind::interrupt()).expect("cannot catch SIGINT");
        tokio::select! {
            _ = quit.recv() => {
                self.stopping.set(Phase::HandedOver);
                (self.on_handover)();
                ShutdownSignal::GracefulUpgrade
            }
            _ = term.recv() => {
                self.stopping.set(Phase::Draining);
                log::info!(
                    "SIGTERM received: /readyz answers 503 (draining); serving {:?} more \
                     (shutdown_delay) before the drain",
                    self.delay
                );
                tokio::select! {
                    _ = tokio::time::sleep(self.delay) => ShutdownSignal::GracefulTerminate,
                    _ = int.recv() => ShutdownSignal::FastShutdown,
                }
            }
            _ = int.recv() => ShutdownSignal::FastShutdown,
        }
    }
}

/// A service (the admin listener) that keeps accepting after a SIGTERM until the process
/// exits, so `/readyz` answers *draining* and `/healthz` 200 through the drain instead of a
/// refused connection. After a SIGQUIT it stops with the rest: its socket went to the successor,
/// which answers there.
pub struct ServeUntilExit<S> {
    service: S,
    stopping: Stopping,
}

impl<S> ServeUntilExit<S> {
    /// `service`, stopped by Pingora's shutdown only when it is not a SIGTERM's.
    pub fn new(service: S, stopping: Stopping) -> ServeUntilExit<S> {
        ServeUntilExit { service, stopping }
    }
}

#[async_trait]
impl<S: Service> Service for ServeUntilExit<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        mut shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            if shutdown.changed().await.is_ok() && !stopping.is_draining() {
                let _ = tx.send(true);
            }
            // Held until the process exits: a dropped sender would read as a shutdown.
            std::future::pending::<()>().await;
            drop(tx);
        });
        self.service.start_service(fds, rx, listeners_per_fd).await;
    }

    fn name(&self) -> &str {
        self.service.name()
    }

    fn threads(&self) -> Option<usize> {
        self.service.threads()
    }

    fn runtime_opts_override(&self, global: &RuntimeOpts) -> Option<RuntimeOpts> {
        self.service.runtime_opts_override(global)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.service.listen_addresses()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_is_shared_by_every_clone() {
        let a = Stopping::new();
        let b = a.clone();
        assert_eq!(b.phase(), Phase::Serving);
        a.set(Phase::Draining);
        assert!(b.is_draining());
        a.set(Phase::HandedOver);
        assert_eq!(b.phase(), Phase::HandedOver);
        assert!(!b.is_draining());
    }
}
