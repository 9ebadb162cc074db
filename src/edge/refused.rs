//! Access log lines for the heads Pingora answers itself, before any hook runs.
//!
//! Pingora's `handle_new_request` answers a head it cannot parse (a bad request line or header
//! name, a head over its 1 MiB limit, a `Content-Length` it refuses) with `400`, and `CONNECT`
//! with `405`, then closes; no `ProxyHttp` hook sees that request, so the proxy's `logging` never
//! logs it. The edge stream does see it: a response head written while the connection is still
//! waiting for a head (no hook moved its phase, see [`super::deadline`]) is Pingora's refusal.
//! So the stream keeps the current head's request line (nginx's `$request`: the bytes up to the
//! first CR or LF, leading empty lines skipped, at most [`MAX_REQUEST_LINE`]) and, when the
//! connection ends, sends one access log record for the refusal, as nginx logs its own `400`:
//! the peer's address, the status, the raw line and what was wrong. The edge's own `408` for a
//! head that did not arrive in time is logged the same way.
//!
//! The error log gets at most one line per [`EVENT_INTERVAL`] about them, with the count: a
//! flood of malformed heads is the access log's to record, one line each, not the process log's.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use http::Version;
use pingora::protocols::Stream;

use super::phase::{PHASE_HEAD, PHASE_IDLE};
use super::EdgeStream;
use crate::access_log::{escape_into, tls_version_name, AccessLog, LogLine, MAX_REQUEST_LINE};
use crate::logs::limit::{Throttled, EVENT_INTERVAL};

/// Pingora's `MAX_HEADER_SIZE` (private to pingora-core): a head still incomplete past this
/// many bytes is refused with `400`.
const PINGORA_MAX_HEAD: usize = 1_048_575;

/// One process-log line per interval about refused heads.
static REFUSED_LINE: LazyLock<Throttled> = LazyLock::new(Throttled::default);

/// The current head's request line, and the refusal being written, of one connection.
#[derive(Default)]
pub(super) struct HeadLog {
    /// Where refusals are logged; `None` with the access log off.
    log: Option<Arc<AccessLog>>,
    /// Keep request lines (only when they can be logged).
    keep_line: bool,
    /// The current head's request line so far.
    line: Vec<u8>,
    /// `line` is complete (a CR or LF came, or it reached [`MAX_REQUEST_LINE`]).
    line_done: bool,
    /// The response Pingora is writing to a head no hook saw.
    refusal: Option<Refusal>,
}

/// A response to a refused head: logged when the connection ends.
struct Refusal {
    status: u16,
    /// The line is the head's (not known for a head parsed from bytes an earlier request's
    /// reads brought in, i.e. pipelined after it).
    line_known: bool,
    client: Option<IpAddr>,
    tls_version: Option<&'static str>,
    /// Response bytes written, head included, and the head's length when known.
    written: usize,
    head_len: Option<usize>,
    head_bytes: usize,
    started: tokio::time::Instant,
    why: Option<&'static str>,
}

impl HeadLog {
    /// Log refusals to `log`.
    pub(super) fn new(log: Option<Arc<AccessLog>>) -> HeadLog {
        HeadLog {
            keep_line: log.is_some(),
            log,
            line: Vec::new(),
            line_done: false,
            refusal: None,
        }
    }

    /// A new head begins: forget the last one's line.
    pub(super) fn new_head(&mut self) {
        self.line.clear();
        self.line_done = false;
    }

    /// Bytes of the current head arrived: keep what belongs to its request line.
    pub(super) fn head_read(&mut self, bytes: &[u8]) {
        if !self.keep_line || self.line_done {
            return;
        }
        let mut rest = bytes;
        if self.line.is_empty() {
            // nginx skips empty lines before a request line (RFC 9112 §2.2).
            let start = rest.iter().position(|b| !matches!(b, b'\r' | b'\n'));
            rest = &rest[start.unwrap_or(rest.len())..];
        }
        let end = rest.iter().position(|b| matches!(b, b'\r' | b'\n'));
        let take = end.unwrap_or(rest.len());
        let room = MAX_REQUEST_LINE - self.line.len();
        self.line.extend_from_slice(&rest[..take.min(room)]);
        self.line_done = end.is_some() || self.line.len() >= MAX_REQUEST_LINE;
    }

    /// A write to the client while no hook has seen the current head (`line_known`: the head
    /// came in through this phase's reads). The first such write is Pingora's refusal.
    pub(super) fn wrote_unseen(&mut self, buf: &[u8], line_known: bool, at: &Stream, facts: Facts) {
        if self.refusal.is_some() {
            return;
        }
        let Some(status) = status_of(buf) else {
            return;
        };
        self.begin(status, line_known, at, facts);
        if let Some(r) = &mut self.refusal {
            r.head_len = find(buf, b"\r\n\r\n").map(|i| i + 4);
        }
    }

    /// Count `n` more response bytes of a refusal being written.
    pub(super) fn wrote(&mut self, n: usize) {
        if let Some(r) = &mut self.refusal {
            r.written += n;
        }
    }

    /// The edge answered a head itself (`408`); logged when the connection ends.
    pub(super) fn answered(&mut self, status: u16, at: &Stream, facts: Facts, why: &'static str) {
        self.begin(status, true, at, facts);
        if let Some(r) = &mut self.refusal {
            r.why = Some(why);
            r.head_len = Some(0);
        }
    }

    fn begin(&mut self, status: u16, line_known: bool, at: &Stream, facts: Facts) {
        let digest = at.get_socket_digest();
        let client = digest
            .as_ref()
            .and_then(|d| d.peer_addr())
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_canonical());
        let tls_version = at
            .get_ssl_digest()
            .and_then(|d| tls_version_name(&d.version));
        self.refusal = Some(Refusal {
            status,
            line_known,
            client,
            tls_version,
            written: 0,
            head_len: None,
            head_bytes: facts.head_bytes,
            started: facts.started,
            why: None,
        });
    }

    /// Log the refusal, if there was one (the connection ends).
    fn finish(&mut self) {
        let Some(r) = self.refusal.take() else {
            return;
        };
        let line: &[u8] = if r.line_known { &self.line } else { b"" };
        let why = r
            .why
            .unwrap_or_else(|| reason(r.status, r.head_bytes, line, self.line_done));
        if let Some(n) = REFUSED_LINE.note(EVENT_INTERVAL) {
            let client = r.client.map_or_else(|| "-".to_string(), |c| c.to_string());
            log::info!("{n} request head(s) refused before routing; the last: {why} from {client}");
        }
        let Some(log) = &self.log else {
            return;
        };
        let parts = RequestParts::of(line);
        log.send(LogLine {
            time: SystemTime::now(),
            client: r.client,
            method: parts.method,
            host: None,
            path: &parts.path,
            target: b"",
            version: parts.version,
            tls_version: r.tls_version,
            status: r.status,
            route: None,
            decision: None,
            limits: None,
            pk: None,
            cost: None,
            settled_cost: None,
            upstream: None,
            upstream_time: None,
            duration: r.started.elapsed(),
            bytes_received: 0,
            bytes_sent: r.written.saturating_sub(r.head_len.unwrap_or(r.written)),
            user_agent: None,
            referer: None,
            request_id: None,
            request_line: Some(line),
            error: Some(why),
        });
    }
}

impl Drop for HeadLog {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What the stream knows of the current head when a refusal begins.
#[derive(Clone, Copy)]
pub(super) struct Facts {
    /// Bytes received in the head phase.
    pub(super) head_bytes: usize,
    /// When the head began.
    pub(super) started: tokio::time::Instant,
}

impl EdgeStream {
    /// Before a write to the client: is it the start of Pingora's answer to a head no hook saw?
    /// In the head phase, the first write since the head began is; in the idle phase (a head
    /// parsed from bytes the previous request's reads brought in), one that starts a response
    /// head is (after `logging`, Pingora only ends a body: a last chunk, never a status line).
    pub(super) fn before_write(&mut self, buf: &[u8]) {
        if self.h2 || buf.is_empty() {
            return;
        }
        let phase = self.phase.load(Ordering::Acquire);
        let unseen = (phase == PHASE_HEAD && !self.answered) || phase == PHASE_IDLE;
        if unseen {
            let facts = Facts {
                head_bytes: self.head_bytes,
                started: self.head_started,
            };
            (self.heads).wrote_unseen(buf, phase == PHASE_HEAD, &self.inner, facts);
        }
    }
}

/// Pure: the status of a response head (`HTTP/1.1 400 Bad Request`), if `buf` starts one.
pub(super) fn status_of(buf: &[u8]) -> Option<u16> {
    let rest = buf.strip_prefix(b"HTTP/1.")?;
    let digits = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Pure: what was wrong with a head Pingora refused with `status`, from what the edge saw: its
/// size, and whether its request line (`done`: complete) has the form `method SP target SP
/// HTTP/1.x` (if so, a header field was refused).
pub(super) fn reason(status: u16, head_bytes: usize, line: &[u8], done: bool) -> &'static str {
    match status {
        400 if head_bytes > PINGORA_MAX_HEAD => "request head too large",
        400 if done && RequestParts::well_formed(line) => "invalid request header",
        400 if line.is_empty() => "invalid request head",
        400 => "invalid request line",
        405 => "method not allowed (CONNECT)",
        _ => "request refused before routing",
    }
}

/// The JSON fields of a refused head, from its raw request line: nginx-like `-` for what the
/// line does not hold. The path is escaped as the log escapes and never carries the query.
struct RequestParts {
    method: &'static str,
    path: String,
    version: Version,
}

impl RequestParts {
    fn of(line: &[u8]) -> RequestParts {
        let mut words = line.split(|b| *b == b' ');
        let (method, target) = (words.next().unwrap_or(b""), words.next());
        let method = match KNOWN_METHODS.iter().find(|m| m.as_bytes() == method) {
            Some(m) => m,
            None => "-",
        };
        let path = match target {
            Some(t) if !t.is_empty() => {
                let end = t.iter().position(|b| *b == b'?').unwrap_or(t.len());
                let mut path = String::new();
                escape_into(&mut path, &t[..end]);
                path
            }
            _ => "-".to_string(),
        };
        let version = match words.next() {
            Some(b"HTTP/1.0") => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        RequestParts {
            method,
            path,
            version,
        }
    }

    /// `token SP target SP HTTP/1.x`, the target without SP or control bytes.
    fn well_formed(line: &[u8]) -> bool {
        let words: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        let [method, target, version] = words.as_slice() else {
            return false;
        };
        let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
        !method.is_empty()
            && method.iter().all(tchar)
            && !target.is_empty()
            && target.iter().all(|b| b.is_ascii_graphic() || *b >= 0x80)
            && matches!(*version, b"HTTP/1.0" | b"HTTP/1.1")
    }
}

/// Methods logged by name for a refused head (JSON `method`); anything else is `-`, so a
/// client cannot choose what the field holds.
const KNOWN_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Pure: where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_recognised() {
        assert_eq!(status_of(b"HTTP/1.1 400 Bad Request\r\n"), Some(400));
        assert_eq!(status_of(b"HTTP/1.0 405 Method Not Allowed\r\n"), Some(405));
        assert_eq!(status_of(b"HTTP/1.1 40"), None);
        assert_eq!(status_of(b"0\r\n\r\n"), None);
        assert_eq!(status_of(b"HTTP/1.1 4x0 "), None);
    }

    #[test]
    fn a_request_line_is_kept_up_to_its_end_across_reads() {
        let mut h = HeadLog::new(None);
        h.head_read(b"GET / HTTP/1.1\r\n");
        assert!(h.line.is_empty(), "nothing is kept with the log off");
        h.keep_line = true;
        h.head_read(b"\r\n\r\nGET /a?");
        h.head_read(b"b HTTP/1.1\r\nHost: x\r\n");
        h.head_read(b"X: y\r\n");
        assert_eq!(h.line, b"GET /a?b HTTP/1.1");
        assert!(h.line_done);
        h.new_head();
        h.head_read(&vec![b'a'; 3 * MAX_REQUEST_LINE]);
        assert_eq!(h.line.len(), MAX_REQUEST_LINE);
        assert!(h.line_done);
    }

    #[test]
    fn reasons_follow_what_the_edge_saw() {
        assert_eq!(reason(400, 10, b"GARBAGE", true), "invalid request line");
        assert_eq!(
            reason(400, 40, b"GET / HTTP/1.1", true),
            "invalid request header"
        );
        assert_eq!(
            reason(400, 2 << 20, b"GET / HTTP/1.1", true),
            "request head too large"
        );
        assert_eq!(reason(400, 0, b"", false), "invalid request head");
        assert_eq!(
            reason(405, 40, b"CONNECT a:1 HTTP/1.1", true),
            "method not allowed (CONNECT)"
        );
    }

    #[test]
    fn json_parts_never_carry_the_query_or_a_made_up_method() {
        let p = RequestParts::of(b"GET /a/\"b?token=s3cr3t HTTP/1.0");
        assert_eq!((p.method, p.path.as_str()), ("GET", "/a/\\x22b"));
        assert_eq!(p.version, Version::HTTP_10);
        let p = RequestParts::of(b"\x16\x03\x01 hello");
        assert_eq!((p.method, p.path.as_str()), ("-", "hello"));
        let p = RequestParts::of(b"");
        assert_eq!(
            (p.method, p.path.as_str(), p.version),
            ("-", "-", Version::HTTP_11)
        );
    }
}
