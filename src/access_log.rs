//! The access log: one line per request, formatted and written by a thread of its own.
//!
//! A request only moves a small [`Record`] into a bounded queue (`try_send`: never waits, never
//! wakes anyone). The writer thread polls the queue, formats JSON or nginx `combined` lines
//! into a buffer and writes them; it flushes whenever the queue runs dry. If it falls behind
//! (a slow disk, a stalled pipe) and the queue is full, records are dropped and counted in
//! `slidegate_access_log_dropped_total` instead of slowing requests down.
//!
//! Lines never carry a query string or a header value (the host is the routing host, without
//! port): tokens in URLs and cookies stay out of log files by default.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use async_trait::async_trait;
use http::{Method, Version};
use once_cell::sync::Lazy;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{register_int_counter, IntCounter};
use serde::Serialize;

use crate::config::{AccessFormat, AccessTarget, LogSettings};
use crate::metrics::Decision;
use crate::routes::Rules;

/// Records waiting for the writer. At 100 000 requests/s the writer drains this every
/// [`POLL`], so it holds about 8× what arrives in one poll interval.
const QUEUE: usize = 4096;
/// How long the writer sleeps when the queue is empty.
const POLL: Duration = Duration::from_millis(5);

/// `slidegate_access_log_dropped_total`.
pub static DROPPED: Lazy<IntCounter> = Lazy::new(|| {
    register_int_counter!(
        "slidegate_access_log_dropped_total",
        "Access log lines dropped because the writer fell behind or could not write"
    )
    .expect("register slidegate_access_log_dropped_total")
});

/// What is logged about one request. Built on the proxy thread from values it already has;
/// everything costly (formatting, escaping, I/O) happens on the writer thread.
pub struct Record {
    /// When the request finished.
    pub time: SystemTime,
    /// The client address (after trusted `X-Forwarded-For` hops).
    pub client: Option<IpAddr>,
    /// Request method.
    pub method: Method,
    /// Request host without port (from the URI or `Host`), if any.
    pub host: Option<String>,
    /// Request path, without the query string.
    pub path: String,
    /// HTTP version of the client's request.
    pub version: Version,
    /// Status sent (499 when the client went away before any response).
    pub status: u16,
    /// The rules and route index the request matched.
    pub route: Option<(Arc<Rules>, usize)>,
    /// The limiter decision.
    pub decision: Option<Decision>,
    /// The upstream server used.
    pub upstream: Option<SocketAddr>,
    /// From choosing the upstream to its response header.
    pub upstream_time: Option<Duration>,
    /// The whole request, from its header being read to the end of the response.
    pub duration: Duration,
    /// Response body bytes sent.
    pub bytes_sent: usize,
}

/// The sending side; cheap to call from every request.
pub struct AccessLog {
    tx: SyncSender<Record>,
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
        Lazy::force(&DROPPED);
        let (tx, rx) = sync_channel(QUEUE);
        let reopen = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            rx,
            sink,
            format: settings.format,
            reopen: reopen.clone(),
            failing: false,
            line: Vec::with_capacity(512),
        };
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer.run())
            .context("cannot start the access log writer thread")?;
        Ok(Some(AccessLog { tx, reopen }))
    }

    /// Queue one record; drop and count it if the writer is behind.
    pub fn send(&self, record: Record) {
        match self.tx.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => DROPPED.inc(),
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
    rx: Receiver<Record>,
    sink: Sink,
    format: AccessFormat,
    reopen: Arc<AtomicBool>,
    /// The last write failed (logged once until a write succeeds again).
    failing: bool,
    line: Vec<u8>,
}

impl Writer {
    fn run(mut self) {
        let stdout = io::stdout();
        loop {
            match self.rx.try_recv() {
                Ok(record) => {
                    self.line.clear();
                    match self.format {
                        AccessFormat::Json => json_line(&mut self.line, &record),
                        AccessFormat::Combined => combined_line(&mut self.line, &record),
                    }
                    let result = match &mut self.sink {
                        Sink::Stdout => stdout.lock().write_all(&self.line),
                        Sink::File { out, .. } => out.write_all(&self.line),
                    };
                    self.check(result);
                }
                Err(TryRecvError::Empty) => {
                    let result = match &mut self.sink {
                        Sink::Stdout => stdout.lock().flush(),
                        Sink::File { out, .. } => out.flush(),
                    };
                    self.check(result);
                    if self.reopen.swap(false, Ordering::AcqRel) {
                        self.reopen_file();
                    }
                    std::thread::sleep(POLL);
                }
                Err(TryRecvError::Disconnected) => return,
            }
        }
    }

    fn check(&mut self, result: io::Result<()>) {
        match result {
            Ok(()) => self.failing = false,
            Err(e) => {
                DROPPED.inc();
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

/// The JSON keys, in this order.
#[derive(Serialize)]
struct JsonLine<'a> {
    time: String,
    client: Option<IpAddr>,
    method: &'a str,
    host: Option<&'a str>,
    path: &'a str,
    status: u16,
    route: Option<&'a str>,
    decision: Option<&'static str>,
    upstream: Option<SocketAddr>,
    upstream_ms: Option<f64>,
    duration_ms: f64,
    bytes_sent: usize,
}

fn ms(d: Duration) -> f64 {
    // Microsecond resolution is plenty and keeps lines short.
    (d.as_micros() as f64) / 1000.0
}

fn route_name(record: &Record) -> Option<&str> {
    record
        .route
        .as_ref()
        .and_then(|(rules, i)| rules.routes.get(*i))
        .map(|r| r.spec.name.as_str())
}

fn json_line(out: &mut Vec<u8>, r: &Record) {
    let line = JsonLine {
        time: humantime::format_rfc3339_millis(r.time).to_string(),
        client: r.client,
        method: r.method.as_str(),
        host: r.host.as_deref(),
        path: &r.path,
        status: r.status,
        route: route_name(r),
        decision: r.decision.map(Decision::as_str),
        upstream: r.upstream,
        upstream_ms: r.upstream_time.map(ms),
        duration_ms: ms(r.duration),
        bytes_sent: r.bytes_sent,
    };
    // Serializing plain data into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &line);
    out.push(b'\n');
}

/// nginx's `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
/// $body_bytes_sent "$http_referer" "$http_user_agent"`, with the query string left out of
/// `$request` and `-` for the user and both header values.
fn combined_line(out: &mut Vec<u8>, r: &Record) {
    let client = r.client.map(|c| c.to_string());
    let time = httpdate::fmt_http_date(r.time);
    // `Tue, 01 Dec 2026 08:26:38 GMT` -> `01/Dec/2026:08:26:38 +0000`
    let parts: Vec<&str> = time.split([' ', ',']).filter(|s| !s.is_empty()).collect();
    let time_local = match parts.as_slice() {
        [_, day, mon, year, hms, _] => format!("{day}/{mon}/{year}:{hms} +0000"),
        _ => time.clone(),
    };
    let _ = writeln!(
        out,
        "{} - - [{}] \"{} {} {:?}\" {} {} \"-\" \"-\"",
        client.as_deref().unwrap_or("-"),
        time_local,
        r.method,
        r.path.escape_default(),
        r.version,
        r.status,
        r.bytes_sent,
    );
}
