//! The access log: one line per request, formatted and written by a thread of its own.
//!
//! A request copies what it logs (a few numbers and its method, host, path and route name)
//! into the current `Batch`, behind a mutex only the writer thread ever contends for, once
//! every 5 ms: no allocation per request, no formatting, no system call, no wake-up. A full batch
//! (128 records) goes into a bounded queue; every 5 ms the writer thread takes the queued batches
//! and the partial one, formats JSON or nginx `combined` lines, writes them and flushes. If it falls behind (a slow disk, a stalled pipe) and the queue is full, the batch is
//! dropped and its records counted in `slidegate_access_log_dropped_total` instead of slowing
//! requests down.
//!
//! JSON lines never carry a query string (`path` is the path alone), and the only header
//! values logged are `User-Agent` and `Referer`, as nginx's `combined` has them, bounded to
//! [`MAX_HEADER_LOGGED`] bytes and escaped as nginx escapes them (`"`, `\`, control and
//! non-ASCII bytes as `\xHH`); `request_id` is the request's `X-Request-Id`. `combined` is
//! nginx's line byte for byte, so its `$request` is the request line as sent, query included.
//!
//! A head Pingora refuses before any hook runs (an unparsable request line or header, a head
//! too large, a head timeout) is logged by the edge ([`crate::edge`]) with the raw request line
//! as `combined`'s `$request`, as nginx does, and what was wrong in JSON's `error`.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{register_int_counter, IntCounter};
use std::sync::LazyLock;

use crate::config::{AccessFormat, AccessTarget, LogSettings};
use format::{combined_line, json_line, LocalTimeCache, SecondCache};

mod custom;
mod format;
mod record;
mod request;

use record::Batch;
pub use record::{escape_into, tls_version_name, LogLine, MAX_HEADER_LOGGED, MAX_REQUEST_LINE};
pub use request::Known;

/// Records per batch handed to the writer.
const BATCH: usize = 128;
/// Full batches waiting for the writer: with [`BATCH`], 4096 records, about 8× what arrives
/// in one [`POLL`] interval at 100 000 requests/s.
const QUEUE: usize = 32;
/// How long the writer sleeps when there is nothing to write.
const POLL: Duration = Duration::from_millis(5);

/// `slidegate_access_log_dropped_total`.
pub static DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "slidegate_access_log_dropped_total",
        "Access log lines dropped because the writer fell behind or could not write"
    )
    .expect("register slidegate_access_log_dropped_total")
});

/// The sending side; cheap to call from every request. Clones send to the same writer (the
/// proxy's hooks and the edge, which logs the heads Pingora refuses before any hook runs).
#[derive(Clone)]
pub struct AccessLog {
    pending: Arc<Mutex<Batch>>,
    tx: SyncSender<Batch>,
    reopen: Arc<AtomicBool>,
}

impl AccessLog {
    /// Open the target (a file is created or appended to now, so a bad path fails at start)
    /// and start the writer thread; `None` when the access log is off.
    pub fn start(settings: &LogSettings) -> anyhow::Result<Option<AccessLog>> {
        let sink = match &settings.access {
            AccessTarget::Off => return Ok(None),
            AccessTarget::Stdout => Sink::Stdout,
            AccessTarget::File(path) => Sink::File {
                out: BufWriter::with_capacity(64 * 1024, open(path)?),
                path: path.clone(),
            },
        };
        LazyLock::force(&DROPPED);
        let (tx, rx) = sync_channel(QUEUE);
        let reopen = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(Mutex::new(Batch::with_capacity(BATCH)));
        let writer = Writer {
            rx,
            pending: pending.clone(),
            sink,
            format: settings.format,
            log_format: settings.log_format.clone(),
            reopen: reopen.clone(),
            failing: false,
            line: Vec::with_capacity(512),
            clock: SecondCache::default(),
            local_clock: LocalTimeCache::default(),
        };
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer.run())
            .context("cannot start the access log writer thread")?;
        Ok(Some(AccessLog {
            pending,
            tx,
            reopen,
        }))
    }

    /// Log one request: copy it into the current batch; hand a full batch to the writer, or
    /// drop and count it if the writer is behind.
    pub fn send(&self, record: LogLine<'_>) {
        let mut batch = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        batch.push(&record);
        if batch.entries.len() < BATCH {
            return;
        }
        // Queued under the lock, so the writer (which drains the queue under it too) always
        // writes a full batch before the partial one that follows it.
        let full = std::mem::replace(&mut *batch, Batch::with_capacity(BATCH));
        if let Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) = self.tx.try_send(full) {
            DROPPED.inc_by(b.entries.len() as u64);
        }
    }

    /// A background service that reopens the log file on SIGUSR1 (after logrotate moved it).
    pub fn reopen_on_sigusr1(&self) -> ReopenOnSignal {
        ReopenOnSignal {
            flag: self.reopen.clone(),
        }
    }
}

fn open(path: &PathBuf) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("log.access: cannot open {}", path.display()))
}

/// Sets the writer's reopen flag on every SIGUSR1.
pub struct ReopenOnSignal {
    flag: Arc<AtomicBool>,
}

#[async_trait]
impl BackgroundService for ReopenOnSignal {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut usr1 = match signal(SignalKind::user_defined1()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot listen for SIGUSR1, access log reopen disabled: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = usr1.recv() => self.flag.store(true, Ordering::Release),
                _ = shutdown.changed() => return,
            }
        }
    }
}

enum Sink {
    Stdout,
    File { out: BufWriter<File>, path: PathBuf },
}

struct Writer {
    rx: Receiver<Batch>,
    /// The batch requests are filling, taken when the queue is empty.
    pending: Arc<Mutex<Batch>>,
    sink: Sink,
    format: AccessFormat,
    /// `[log] log_format`: `combined` lines in this format instead.
    log_format: Option<crate::config::log_format::LogFormat>,
    reopen: Arc<AtomicBool>,
    /// The last write failed (logged once until a write succeeds again).
    failing: bool,
    line: Vec<u8>,
    clock: SecondCache,
    local_clock: LocalTimeCache,
}

impl Writer {
    /// Every [`POLL`]: take the queued batches and the partial one (in that order, which is
    /// the order of the requests), write them, flush. Sleeping between rounds keeps the writer
    /// off the requests' mutex except once per round.
    fn run(mut self) {
        loop {
            let (queued, partial) = {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                let queued: Vec<Batch> = self.rx.try_iter().collect();
                let partial = (!pending.entries.is_empty()).then(|| std::mem::take(&mut *pending));
                (queued, partial)
            };
            for batch in queued.iter().chain(partial.as_ref()) {
                self.write(batch);
            }
            let result = match &mut self.sink {
                Sink::Stdout => io::stdout().lock().flush(),
                Sink::File { out, .. } => out.flush(),
            };
            self.note_write(result, 0);
            if self.reopen.swap(false, Ordering::AcqRel) {
                self.reopen_file();
            }
            // Only this thread holds the batch now: the proxy is gone.
            if Arc::strong_count(&self.pending) == 1 {
                return;
            }
            std::thread::sleep(POLL);
        }
    }

    fn write(&mut self, batch: &Batch) {
        self.line.clear();
        for entry in &batch.entries {
            match self.format {
                AccessFormat::Json => {
                    json_line(&mut self.line, &batch.text, entry, &mut self.clock)
                }
                AccessFormat::Combined => match &self.log_format {
                    Some(f) => custom::custom_line(
                        &mut self.line,
                        &batch.text,
                        entry,
                        f.pieces(),
                        &mut self.local_clock,
                    ),
                    None => {
                        combined_line(&mut self.line, &batch.text, entry, &mut self.local_clock)
                    }
                },
            }
        }
        let result = match &mut self.sink {
            Sink::Stdout => io::stdout().lock().write_all(&self.line),
            Sink::File { out, .. } => out.write_all(&self.line),
        };
        self.note_write(result, batch.entries.len());
    }

    /// Note a write's outcome; a failed one loses `lines` lines.
    fn note_write(&mut self, result: io::Result<()>, lines: usize) {
        match result {
            Ok(()) => self.failing = false,
            Err(e) => {
                DROPPED.inc_by(lines as u64);
                if !self.failing {
                    log::error!("access log: write failed, dropping lines until it works: {e}");
                    self.failing = true;
                }
            }
        }
    }

    fn reopen_file(&mut self) {
        let Sink::File { out, path } = &mut self.sink else {
            return;
        };
        match open(path) {
            Ok(file) => {
                let _ = out.flush();
                *out = BufWriter::with_capacity(64 * 1024, file);
                log::info!("access log reopened: {}", path.display());
            }
            Err(e) => log::error!("access log: reopen failed, still writing the old file: {e:#}"),
        }
    }
}
