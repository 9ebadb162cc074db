//! The phases of a client connection and their deadlines:
//!
//! | phase | starts | deadline | on expiry |
//! |---|---|---|---|
//! | head | accept, or the first byte after a response | `client_header_timeout` | `408` and close if part of a head arrived, else close |
//! | body | the head of a request with a body is parsed (`early_request_filter`), timed from its first read | `client_body_timeout` on the whole body | `408` and close (only close if a response already went out) |
//! | request | the body is done (`request_body_filter`), or the head without a body | none of ours | |
//! | idle | the response is done (`logging`) | `keepalive_timeout` | close |
//! | h2 | the HTTP/2 connection preface arrived (in the head phase) | none of ours: Pingora's `h2_idle_timeout` (set to `keepalive_timeout`) closes a connection with no stream open | close |
//!
//! The proxy hooks move the phase through [`head_received`], [`body_done`] and
//! [`response_done`]. They find the stream behind the session by downcasting it: the phase
//! belongs to the connection, and the only per-connection state Pingora hands the hooks
//! (`persist_connection_context`) starts after the first request, too late for its head. On
//! HTTP/2 the session has no stream, so they are no-ops there; the stream knows it carries
//! HTTP/2 (ALPN, or the h2c preface) and leaves the head phase once the preface is in. An h2
//! stream's header block is delivered whole by the h2 codec, so no per-stream head deadline is
//! possible in Pingora 0.9; a stalled block keeps no stream open, so the idle timeout still
//! closes the connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use pingora::proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::phase::{PHASE_BODY, PHASE_H2, PHASE_HEAD, PHASE_IDLE, PHASE_REQUEST};
use super::EdgeStream;
use crate::metrics::METRICS;

/// The response sent when a head does not arrive in time (then the connection is closed).
const TIMEOUT_RESPONSE: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

/// The HTTP/2 connection preface (RFC 9113 §3.4).
pub(super) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The [`EdgeStream`] behind a proxy session, if it is one.
fn edge_stream(session: &Session) -> Option<&EdgeStream> {
    let stream = session.as_downstream().stream()?;
    (**stream).as_any().downcast_ref::<EdgeStream>()
}

/// The head of a request was parsed: no header deadline until the response is done. With
/// `keepalive_timeout = "0s"` the connection closes after this response.
pub fn head_received(session: &mut Session) {
    let body_to_come = !session.as_downstream_mut().is_body_done();
    let Some(s) = edge_stream(session) else {
        return;
    };
    let phase = if body_to_come {
        PHASE_BODY
    } else {
        PHASE_REQUEST
    };
    s.phase.store(phase, Ordering::Release);
    if s.limits.keepalive_timeout.is_zero() {
        session.set_keepalive(None);
    }
}

/// The whole request body arrived: no deadline of ours until the response is done.
pub fn body_done(session: &Session) {
    if let Some(s) = edge_stream(session) {
        let _ = s.phase.compare_exchange(
            PHASE_BODY,
            PHASE_REQUEST,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// Why the edge answered this request `408` itself (its body did not arrive in time), if it
/// did: Pingora's session has no response written then, and sees only a failed read.
pub fn answered_408(session: &Session) -> Option<&'static str> {
    edge_stream(session)?.answered_408
}

/// The response was sent: the connection is idle until the next request's first byte.
pub fn response_done(session: &Session) {
    if let Some(s) = edge_stream(session) {
        s.phase.store(PHASE_IDLE, Ordering::Release);
    }
}

impl EdgeStream {
    /// Set the deadline of `phase` to `start + after`. The timer is only moved when it would
    /// fire too late: a timer set for an earlier instant is left alone, and when it fires
    /// [`EdgeStream::timer_expired`] re-aims it at the real deadline. A busy keep-alive
    /// connection then costs one timer wake-up per `keepalive_timeout`, not two timer-wheel
    /// updates per request.
    fn arm(&mut self, phase: u8, start: tokio::time::Instant, after: Duration) {
        self.armed = Some(phase);
        self.deadline = start + after;
        match &mut self.timer {
            Some(t) if t.deadline() <= self.deadline => {}
            Some(t) => t.as_mut().reset(self.deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(self.deadline))),
        }
    }

    /// Has the armed deadline passed? Registers for a wake-up when it has not.
    fn timer_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(t) = self.timer.as_mut() else {
            return false;
        };
        while t.as_mut().poll(cx).is_ready() {
            if tokio::time::Instant::now() >= self.deadline {
                return true;
            }
            t.as_mut().reset(self.deadline);
        }
        false
    }

    /// Read from the client under the deadline of the current phase.
    pub(super) fn poll_read_in_phase(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut phase = self.phase.load(Ordering::Acquire);
        if phase == PHASE_REQUEST || phase == PHASE_H2 {
            self.armed = None;
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        if self.armed != Some(phase) {
            let now = tokio::time::Instant::now();
            match phase {
                PHASE_HEAD => {
                    let started = self.head_started;
                    self.arm(phase, started, self.limits.client_header_timeout);
                }
                PHASE_BODY => self.arm(phase, now, self.limits.client_body_timeout),
                _ => {
                    self.head_bytes = 0;
                    self.arm(phase, now, self.limits.keepalive_timeout);
                }
            }
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 && phase == PHASE_IDLE {
                    // The next head begins: its own deadline starts with its first byte. It is
                    // set only if the head does not arrive whole (the next read would wait).
                    phase = PHASE_HEAD;
                    self.phase.store(PHASE_HEAD, Ordering::Release);
                    self.head_started = tokio::time::Instant::now();
                    self.head_bytes = 0;
                    self.answered = false;
                    self.armed = None;
                    self.heads.new_head();
                }
                if phase == PHASE_HEAD {
                    self.head_bytes += n;
                    self.heads.head_read(&buf.filled()[before..]);
                    if self.h2 && self.head_bytes >= H2_PREFACE.len() {
                        self.phase.store(PHASE_H2, Ordering::Release);
                    }
                }
                return Poll::Ready(Ok(()));
            }
            other => {
                if !matches!(other, Poll::Pending) {
                    return other;
                }
            }
        }
        if !self.timer_expired(cx) {
            return Poll::Pending;
        }
        self.expire(phase, cx)
    }

    /// The deadline of `phase` passed with the client silent: close, with a `408` if part of a
    /// head (or a body) arrived.
    fn expire(&mut self, phase: u8, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if phase == PHASE_BODY {
            METRICS.client_body_timeouts.inc();
            if self.answered {
                // The upstream answered before reading the whole body (and the answer went
                // out): a 408 now would be a second response. Close, as nginx does.
                return Poll::Ready(Ok(()));
            }
            return self.answer_408(cx, "client_body_timeout: request body not received in time");
        }
        if phase == PHASE_IDLE || self.head_bytes == 0 || self.h2 {
            // Nothing of a request arrived: close quietly (end of stream), as nginx does.
            METRICS.client_idle_closed.inc();
            return Poll::Ready(Ok(()));
        }
        METRICS.client_header_timeouts.inc();
        let facts = super::refused::Facts {
            head_bytes: self.head_bytes,
            started: self.head_started,
        };
        let why = "client_header_timeout: request head not received in time";
        (self.heads).answered(408, &self.inner, facts, why);
        self.answer_408(cx, why)
    }

    /// Write the `408` (best effort, never waiting: the connection is closed right after) and
    /// fail the read.
    fn answer_408(&mut self, cx: &mut Context<'_>, why: &'static str) -> Poll<io::Result<()>> {
        // Logged as sent (a body's request by the proxy's `logging`, see [`answered_408`]),
        // even if the write fails: nginx logs its 408 with no response at all.
        self.answered_408 = Some(why);
        let inner = Pin::new(&mut self.inner);
        if let Poll::Ready(Ok(n)) = inner.poll_write(cx, TIMEOUT_RESPONSE) {
            if n == TIMEOUT_RESPONSE.len() {
                let _ = Pin::new(&mut self.inner).poll_flush(cx);
            }
        }
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
    }
}
