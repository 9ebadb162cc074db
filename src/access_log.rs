//! The access log: one line per request, formatted and written by a thread of its own.
//!
//! A request copies what it logs (a few numbers and its method, host, path and route name)
//! into the current [`Batch`], behind a mutex only the writer thread ever contends for, once
//! every 5 ms: no allocation per request, no formatting, no system call, no wake-up. A full batch
//! (128 records) goes into a bounded queue; every 5 ms the writer thread takes the queued batches
//! and the partial one, formats JSON or nginx `combined` lines, writes them and flushes. If it falls behind (a slow disk, a stalled pipe) and the queue is full, the batch is
//! dropped and its records counted in `slidegate_access_log_dropped_total` instead of slowing
//! requests down.
//!
//! Lines never carry a query string or a header value (the host is the routing host, without
//! port): tokens in URLs and cookies stay out of log files by default.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use async_trait::async_trait;
use http::Version;
use once_cell::sync::Lazy;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{register_int_counter, IntCounter};

use crate::config::{AccessFormat, AccessTarget, LogSettings};
use crate::metrics::Decision;

/// Records per batch handed to the writer.
const BATCH: usize = 128;
/// Full batches waiting for the writer: with [`BATCH`], 4096 records, about 8× what arrives
/// in one [`POLL`] interval at 100 000 requests/s.
const QUEUE: usize = 32;
/// How long the writer sleeps when there is nothing to write.
const POLL: Duration = Duration::from_millis(5);

/// `slidegate_access_log_dropped_total`.
pub static DROPPED: Lazy<IntCounter> = Lazy::new(|| {
    register_int_counter!(
        "slidegate_access_log_dropped_total",
        "Access log lines dropped because the writer fell behind or could not write"
    )
    .expect("register slidegate_access_log_dropped_total")
});

/// What is logged about one request, borrowed from the request; [`AccessLog::send`] copies it.
pub struct Record<'a> {
    /// When the request finished.
    pub time: SystemTime,
    /// The client address (after trusted `X-Forwarded-For` hops).
    pub client: Option<IpAddr>,
    /// Request method.
    pub method: &'a str,
    /// Request host without port (from the URI or `Host`), if any.
    pub host: Option<&'a str>,
    /// Request path, without the query string.
    pub path: &'a str,
    /// HTTP version of the client's request.
    pub version: Version,
    /// Status sent (499 when the client went away before any response).
    pub status: u16,
    /// The matched route's name.
    pub route: Option<&'a str>,
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

/// A [`Record`] whose strings live in its batch's `text`.
struct Entry {
    time: SystemTime,
    client: Option<IpAddr>,
    method: Range<usize>,
    host: Option<Range<usize>>,
    path: Range<usize>,
    version: Version,
    status: u16,
    route: Option<Range<usize>>,
    decision: Option<Decision>,
    upstream: Option<SocketAddr>,
    upstream_time: Option<Duration>,
    duration: Duration,
    bytes_sent: usize,
}

/// Records on their way to the writer: fixed-size entries plus one text arena for their strings.
#[derive(Default)]
struct Batch {
    text: String,
    entries: Vec<Entry>,
}

impl Batch {
    fn with_capacity() -> Batch {
        Batch {
            text: String::with_capacity(BATCH * 48),
            entries: Vec::with_capacity(BATCH),
        }
    }

    fn push_str(&mut self, s: &str) -> Range<usize> {
        let start = self.text.len();
        self.text.push_str(s);
        start..self.text.len()
    }

    fn push(&mut self, r: &Record<'_>) {
        let entry = Entry {
            time: r.time,
            client: r.client,
            method: self.push_str(r.method),
            host: r.host.map(|h| self.push_str(h)),
            path: self.push_str(r.path),
            version: r.version,
            status: r.status,
            route: r.route.map(|n| self.push_str(n)),
            decision: r.decision,
            upstream: r.upstream,
            upstream_time: r.upstream_time,
            duration: r.duration,
            bytes_sent: r.bytes_sent,
        };
        self.entries.push(entry);
    }
}

/// The sending side; cheap to call from every request.
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
        Lazy::force(&DROPPED);
        let (tx, rx) = sync_channel(QUEUE);
        let reopen = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(Mutex::new(Batch::with_capacity()));
        let writer = Writer {
            rx,
            pending: pending.clone(),
            sink,
            format: settings.format,
            reopen: reopen.clone(),
            failing: false,
            line: Vec::with_capacity(512),
            clock: SecondCache::default(),
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
    pub fn send(&self, record: Record<'_>) {
        let mut batch = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        batch.push(&record);
        if batch.entries.len() < BATCH {
            return;
        }
        // Queued under the lock, so the writer (which drains the queue under it too) always
        // writes a full batch before the partial one that follows it.
        let full = std::mem::replace(&mut *batch, Batch::with_capacity());
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
    reopen: Arc<AtomicBool>,
    /// The last write failed (logged once until a write succeeds again).
    failing: bool,
    line: Vec<u8>,
    clock: SecondCache,
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
            self.check(result, 0);
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
                AccessFormat::Combined => combined_line(&mut self.line, &batch.text, entry),
            }
        }
        let result = match &mut self.sink {
            Sink::Stdout => io::stdout().lock().write_all(&self.line),
            Sink::File { out, .. } => out.write_all(&self.line),
        };
        self.check(result, batch.entries.len());
    }

    /// Note a write's outcome; a failed one loses `lines` lines.
    fn check(&mut self, result: io::Result<()>, lines: usize) {
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

/// `2026-12-01T08:26:38` of the current second, rebuilt only when the second changes: most
/// lines of a busy proxy share it.
#[derive(Default)]
struct SecondCache {
    second: u64,
    text: String,
}

impl SecondCache {
    /// Append `time` as RFC 3339 UTC with milliseconds.
    fn write(&mut self, out: &mut Vec<u8>, time: SystemTime) {
        let since = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        if since.as_secs() != self.second || self.text.is_empty() {
            self.second = since.as_secs();
            let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(self.second);
            // `2026-12-01T08:26:38Z` without the `Z`.
            let mut text = humantime::format_rfc3339_seconds(whole).to_string();
            text.pop();
            self.text = text;
        }
        out.extend_from_slice(self.text.as_bytes());
        let _ = write!(out, ".{:03}Z", since.subsec_millis());
    }
}

/// Append `s` as a JSON string.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for (i, c) in s.char_indices() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            _ => out.extend_from_slice(&s.as_bytes()[i..i + c.len_utf8()]),
        }
    }
    out.push(b'"');
}

/// Append `value` as a JSON string, or `null`.
fn json_opt(out: &mut Vec<u8>, value: Option<impl std::fmt::Display>) {
    match value {
        Some(v) => {
            let _ = write!(out, "\"{v}\"");
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// Milliseconds with microsecond resolution (plenty, and keeps lines short).
fn write_ms(out: &mut Vec<u8>, d: Duration) {
    let us = d.as_micros();
    let _ = write!(out, "{}.{:03}", us / 1000, us % 1000);
}

/// One JSON object, keys in the documented order. Hand-written: this runs once per request
/// on the writer thread, and the process's CPU is what the benchmark charges the log with.
fn json_line(out: &mut Vec<u8>, text: &str, e: &Entry, clock: &mut SecondCache) {
    out.extend_from_slice(b"{\"time\":\"");
    clock.write(out, e.time);
    out.extend_from_slice(b"\",\"client\":");
    json_opt(out, e.client);
    out.extend_from_slice(b",\"method\":");
    json_str(out, &text[e.method.clone()]);
    out.extend_from_slice(b",\"host\":");
    match &e.host {
        Some(r) => json_str(out, &text[r.clone()]),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"path\":");
    json_str(out, &text[e.path.clone()]);
    let _ = write!(out, ",\"status\":{},\"route\":", e.status);
    match &e.route {
        Some(r) => json_str(out, &text[r.clone()]),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"decision\":");
    json_opt(out, e.decision.map(Decision::as_str));
    out.extend_from_slice(b",\"upstream\":");
    json_opt(out, e.upstream);
    out.extend_from_slice(b",\"upstream_ms\":");
    match e.upstream_time {
        Some(d) => write_ms(out, d),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"duration_ms\":");
    write_ms(out, e.duration);
    let _ = writeln!(out, ",\"bytes_sent\":{}}}", e.bytes_sent);
}

/// nginx's `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
/// $body_bytes_sent "$http_referer" "$http_user_agent"`, with the query string left out of
/// `$request` and `-` for the user and both header values.
fn combined_line(out: &mut Vec<u8>, text: &str, e: &Entry) {
    let client = e.client.map(|c| c.to_string());
    let time = httpdate::fmt_http_date(e.time);
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
        &text[e.method.clone()],
        text[e.path.clone()].escape_default(),
        e.version,
        e.status,
        e.bytes_sent,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(batch: &mut Batch, path: &str, host: Option<&str>) {
        batch.push(&Record {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_577_598_123),
            client: Some("2001:db8::1".parse().unwrap()),
            method: "GET",
            host,
            path,
            version: Version::HTTP_11,
            status: 200,
            route: Some("r.1"),
            decision: Some(Decision::ShadowDenied),
            upstream: Some("127.0.0.1:3000".parse().unwrap()),
            upstream_time: Some(Duration::from_micros(1234)),
            duration: Duration::from_micros(5),
            bytes_sent: 42,
        });
    }

    /// Whatever the path holds, the line is one valid JSON object with the right values.
    #[test]
    fn json_lines_parse_and_escape() {
        let mut batch = Batch::default();
        let odd = "/a\"b\\c\u{1}d/é/\u{7f}";
        entry(&mut batch, odd, None);
        entry(&mut batch, "/plain", Some("example.com"));
        let mut out = Vec::new();
        let mut clock = SecondCache::default();
        for e in &batch.entries {
            json_line(&mut out, &batch.text, e, &mut clock);
        }
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2);
        let l = &lines[0];
        assert_eq!(l["time"], "2025-12-01T08:26:38.123Z");
        assert_eq!(l["client"], "2001:db8::1");
        assert_eq!(l["path"], odd);
        assert!(l["host"].is_null());
        assert_eq!(l["route"], "r.1");
        assert_eq!(l["decision"], "shadow_denied");
        assert_eq!(l["upstream"], "127.0.0.1:3000");
        assert_eq!(l["upstream_ms"], 1.234);
        assert_eq!(l["duration_ms"], 0.005);
        assert_eq!(l["bytes_sent"], 42);
        assert_eq!(lines[1]["host"], "example.com");
    }
}
