//! [`EdgeStream`]: the state of one client connection's deadlines and held writes, and the
//! `AsyncRead`/`AsyncWrite` impls that join them.

use std::any::Any;
use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::task::{Context, Poll};

use pingora::protocols::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::phase::PHASE_HEAD;
use super::refused::HeadLog;
use super::ConnLimits;
use crate::access_log::AccessLog;

/// A client stream whose reads carry the deadline of the connection's phase and whose writes
/// are held back and sent together (see the [module documentation](super)).
pub struct EdgeStream {
    pub(super) inner: Stream,
    pub(super) limits: ConnLimits,
    /// Written by the proxy hooks (through `&`), read by `poll_read`.
    pub(super) phase: AtomicU8,
    /// The phase whose deadline is set (`None`: set it before the next wait).
    pub(super) armed: Option<u8>,
    /// When the armed phase expires.
    pub(super) deadline: tokio::time::Instant,
    /// When the current head began (its first byte), for a head deadline set lazily.
    pub(super) head_started: tokio::time::Instant,
    /// Fires at or before `deadline`; see [`EdgeStream::arm`].
    pub(super) timer: Option<Pin<Box<Sleep>>>,
    /// Response bytes written but not sent yet; see [`EdgeStream::send_held`].
    pub(super) held: Vec<u8>,
    /// Bytes received in the current head phase (a timeout with none is a quiet close).
    pub(super) head_bytes: usize,
    /// HTTP/2 (by ALPN, or the h2c preface seen by the peek): past the preface, the
    /// connection's life is Pingora's h2 idle timeout, not a phase of ours.
    pub(super) h2: bool,
    /// Bytes read by the h2c peek, handed out again by the next reads.
    pub(super) peeked: Vec<u8>,
    /// Set while a write waits for the client; fires at `send_timeout`.
    pub(super) send_timer: Option<Pin<Box<Sleep>>>,
    /// Response bytes were written since the current request's head began: a deadline that
    /// expires now must not write a `408` after (or into) that response.
    pub(super) answered: bool,
    /// Held until the client's first byte (see [`super::first_request`]).
    pub(super) silent: Option<super::first_request::SilentGuard>,
    /// The current head's request line and a refusal being written (see [`super::refused`]).
    pub(super) heads: HeadLog,
    /// Why the edge answered `408` (then the connection closes).
    pub(super) answered_408: Option<&'static str>,
}

impl std::fmt::Debug for EdgeStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeStream")
            .field("inner", &self.inner)
            .finish()
    }
}

impl EdgeStream {
    /// Wrap a freshly accepted stream: the head phase (and its deadline) starts now.
    pub fn new(inner: Stream, limits: ConnLimits) -> Self {
        let h2 = inner.selected_alpn_proto() == Some(pingora::protocols::ALPN::H2);
        EdgeStream {
            inner,
            limits,
            phase: AtomicU8::new(PHASE_HEAD),
            armed: None,
            deadline: tokio::time::Instant::now(),
            head_started: tokio::time::Instant::now(),
            timer: None,
            held: Vec::new(),
            head_bytes: 0,
            h2,
            peeked: Vec::new(),
            send_timer: None,
            answered: false,
            silent: None,
            heads: HeadLog::default(),
            answered_408: None,
        }
    }

    /// Log the heads Pingora refuses on this connection (no hook sees them) to `log`.
    pub fn logging_refusals_to(mut self, log: Option<Arc<AccessLog>>) -> Self {
        self.heads = HeadLog::new(log);
        self
    }

    /// Keep this connection counted as silent (`guard`, taken when it was accepted) until its
    /// first byte arrives.
    pub fn silent_until_first_byte(mut self, guard: super::first_request::SilentGuard) -> Self {
        self.silent = Some(guard);
        self
    }
}

impl AsyncRead for EdgeStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // About to wait for the client: send what is held (see `send_held`). A full socket
        // is not an error here; the next write or flush waits for it.
        if !this.held.is_empty() {
            let sent = this.send_held(cx);
            if let Poll::Ready(Err(e)) = this.within_send_timeout(cx, sent) {
                return Poll::Ready(Err(e));
            }
        }
        if !this.peeked.is_empty() {
            let n = this.peeked.len().min(buf.remaining());
            buf.put_slice(&this.peeked[..n]);
            this.peeked.drain(..n);
            this.silent = None;
            return Poll::Ready(Ok(()));
        }
        let filled = buf.filled().len();
        let read = this.poll_read_in_phase(cx, buf);
        if buf.filled().len() > filled {
            this.silent = None;
        }
        read
    }
}

impl AsyncWrite for EdgeStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.before_write(buf);
        this.answered |= !buf.is_empty();
        let written = this.poll_write_held(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.heads.wrote(n);
        }
        this.within_send_timeout(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.after_held(cx, |inner, cx| inner.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.after_held(cx, |inner, cx| inner.poll_shutdown(cx))
    }
}

// `Any` is required by Pingora's `IO` (blanket impl); asserted here so a missing trait shows up
// as an error in this file rather than at the call site.
const _: fn() = || {
    fn is_io<T: pingora::protocols::IO + Any>() {}
    is_io::<EdgeStream>();
};

impl EdgeStream {
    /// Send the held writes, then `then` on the inner stream (flush, shutdown), all under
    /// the send deadline.
    fn after_held(
        &mut self,
        cx: &mut Context<'_>,
        then: impl FnOnce(Pin<&mut Stream>, &mut Context<'_>) -> Poll<io::Result<()>>,
    ) -> Poll<io::Result<()>> {
        let done = match self.send_held(cx) {
            Poll::Ready(Ok(())) => then(Pin::new(&mut self.inner), cx),
            other => other,
        };
        self.within_send_timeout(cx, done)
    }
}
