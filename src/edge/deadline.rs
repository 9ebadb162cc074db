//! The phases of a client connection and their deadlines:
//!
//! | phase | starts | deadline | on expiry |
//! |---|---|---|---|
//! | head | accept, or the first byte after a response | `client_header_timeout` | `408` and close if part of a head arrived, else close |
//! | request | the head is parsed (`early_request_filter`) | none of ours (Pingora's body read timeout) | |
//! | idle | the response is done (`logging`) | `keepalive_timeout` | close |
//!
//! The proxy hooks move the phase through [`head_received`] and [`response_done`]. They find the
//! stream behind the session by downcasting it: the phase belongs to the connection, and the only
//! per-connection state Pingora hands the hooks (`persist_connection_context`) starts after the
//! first request, too late for its head. On HTTP/2 the session has no stream, so both are no-ops
//! there.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use pingora::proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::EdgeStream;
use crate::metrics::METRICS;

/// The response sent when a head does not arrive in time (then the connection is closed).
const TIMEOUT_RESPONSE: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

pub(super) const PHASE_HEAD: u8 = 0;
const PHASE_REQUEST: u8 = 1;
const PHASE_IDLE: u8 = 2;

/// The [`EdgeStream`] behind a proxy session, if it is one.
fn edge_stream(session: &Session) -> Option<&EdgeStream> {
    let stream = session.as_downstream().stream()?;
    (**stream).as_any().downcast_ref::<EdgeStream>()
}

/// The head of a request was parsed: no header deadline until the response is done. With
/// `keepalive_timeout = "0s"` the connection closes after this response.
pub fn head_received(session: &mut Session) {
    let Some(s) = edge_stream(session) else {
        return;
    };
    s.phase.store(PHASE_REQUEST, Ordering::Release);
    if s.limits.keepalive_timeout.is_zero() {
        session.set_keepalive(None);
    }
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
        if phase == PHASE_REQUEST {
            self.armed = None;
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        if self.armed != Some(phase) {
            if phase == PHASE_HEAD {
                let started = self.head_started;
                self.arm(phase, started, self.limits.client_header_timeout);
            } else {
                self.head_bytes = 0;
                let now = tokio::time::Instant::now();
                self.arm(phase, now, self.limits.keepalive_timeout);
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
                    self.armed = None;
                }
                if phase == PHASE_HEAD {
                    self.head_bytes += n;
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
    /// head arrived.
    fn expire(&mut self, phase: u8, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if phase == PHASE_IDLE || self.head_bytes == 0 {
            // Nothing of a request arrived: close quietly (end of stream), as nginx does.
            METRICS.client_idle_closed.inc();
            return Poll::Ready(Ok(()));
        }
        METRICS.client_header_timeouts.inc();
        // Best effort, never waiting: the connection is closed right after.
        let inner = Pin::new(&mut self.inner);
        if let Poll::Ready(Ok(n)) = inner.poll_write(cx, TIMEOUT_RESPONSE) {
            if n == TIMEOUT_RESPONSE.len() {
                let _ = Pin::new(&mut self.inner).poll_flush(cx);
            }
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client_header_timeout: request head not received in time",
        )))
    }
}
