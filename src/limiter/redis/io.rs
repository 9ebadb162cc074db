//! The store's own I/O thread: every Redis connection, its driver task, and every task that
//! sends decisions live on one current-thread Tokio runtime of their own.
//!
//! Why not on the proxy's workers (where the connection would save two cross-thread wake-ups
//! per call): under a flood, the workers' run queues hold thousands of request tasks, and a
//! connection driver or batch task queued behind them reads Redis's reply tens of ms late,
//! while the waiting requests' timers fire on time. Measured here with 4000 h2 streams on two
//! workers: calls answered by Redis in well under a millisecond took 50-95 ms to be read, and
//! every one of them ran out `store.timeout` and failed open. On a thread of its own, a reply
//! is read when it arrives, so a deadline that expires means the store did not answer.

use std::future::Future;
use std::thread::JoinHandle;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

use crate::limiter::StoreError;

/// See the module documentation. Dropping it stops the thread.
pub(super) struct IoThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl IoThread {
    /// Start the thread, named `name`.
    pub(super) fn start(name: &str) -> std::io::Result<IoThread> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Returns when the sender is dropped; pending tasks are dropped with the runtime.
                let _ = runtime.block_on(stopped);
            })?;
        Ok(IoThread {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Run `task` on the I/O thread, detached.
    pub(super) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        drop(self.handle.spawn(task));
    }

    /// Run `task` on the I/O thread and wait for its result from any runtime.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        task: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.handle.spawn(task).await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Unavailable(format!(
                "store I/O task ended: {e}"
            ))),
        }
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // Never join from the I/O thread itself (the store's last handle dropped by one of
            // its own tasks): that would wait for ourselves.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
