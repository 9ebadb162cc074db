//! Client connection limits Pingora 0.9 does not have: a deadline for a whole request head
//! (nginx `client_header_timeout`), an idle keep-alive deadline (`keepalive_timeout`) and a cap
//! on concurrent client connections (`worker_connections`).
//!
//! Pingora only bounds each *read* of a request head (60 s), so a client trickling a byte every
//! 20 s holds a connection forever, and after the first request an HTTP/1.1 connection waits for
//! the next one without any timeout. Neither can be fixed from a `ProxyHttp` hook: the head is
//! read before the first hook runs. So [`EdgeApp`] wraps the proxy application and puts every
//! accepted stream in an [`EdgeStream`], whose reads carry the deadline of the current phase:
//!
//! | phase | starts | deadline | on expiry |
//! |---|---|---|---|
//! | head | accept, or the first byte after a response | `client_header_timeout` | `408` and close if part of a head arrived, else close |
//! | request | the head is parsed (`early_request_filter`) | none of ours (Pingora's body read timeout) | |
//! | idle | the response is done (`logging`) | `keepalive_timeout` | close |
//!
//! The proxy hooks move the phase through [`head_received`] and [`response_done`], which find
//! the stream behind the session by downcasting it.
//!
//! The connection cap is a semaphore taken when a connection is handed to the application:
//! beyond `max_connections` a new connection is closed at once (Pingora's accept loop is not
//! ours to gate), so it holds a descriptor only for that instant.

use std::any::Any;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::Session;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

use crate::forwarding::{OwnHop, Scheme};
use crate::metrics::METRICS;

/// Client connection settings, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Whole request head, from accept or the first byte after a response.
    pub client_header_timeout: Duration,
    /// Idle time between a response and the next request's first byte.
    pub keepalive_timeout: Duration,
    /// Concurrent client connections.
    pub max_connections: u32,
}

/// The response sent when a head does not arrive in time (then the connection is closed).
const TIMEOUT_RESPONSE: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

const PHASE_HEAD: u8 = 0;
const PHASE_REQUEST: u8 = 1;
const PHASE_IDLE: u8 = 2;

/// A client stream whose reads carry the deadline of the connection's phase (see the module
/// documentation).
pub struct EdgeStream {
    inner: Stream,
    limits: ConnLimits,
    /// Written by the proxy hooks (through `&`), read by `poll_read`.
    phase: AtomicU8,
    /// The phase whose deadline is set (`None`: set it before the next wait).
    armed: Option<u8>,
    /// When the armed phase expires.
    deadline: tokio::time::Instant,
    /// When the current head began (its first byte), for a head deadline set lazily.
    head_started: tokio::time::Instant,
    /// Fires at or before `deadline`; see [`EdgeStream::arm`].
    timer: Option<Pin<Box<Sleep>>>,
    /// Response bytes written but not sent yet; see [`EdgeStream::send_pending`].
    pending: Vec<u8>,
    /// Bytes received in the current head phase (a timeout with none is a quiet close).
    head_bytes: usize,
    /// The forwarding values of this connection's hop, built at its first proxied request.
    own_hop: OnceLock<Option<OwnHop>>,
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
        EdgeStream {
            inner,
            limits,
            phase: AtomicU8::new(PHASE_HEAD),
            armed: None,
            deadline: tokio::time::Instant::now(),
            head_started: tokio::time::Instant::now(),
            timer: None,
            pending: Vec::new(),
            head_bytes: 0,
            own_hop: OnceLock::new(),
        }
    }

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
}

/// Most response bytes held back to be sent together (one TCP segment's worth, about).
const COALESCE_MAX: usize = 16 * 1024;

impl EdgeStream {
    /// Send what `poll_write` held back.
    ///
    /// The listener's own write buffer is off so that a slowly written body streams as it
    /// arrives (Pingora flushes a `Content-Length` response only at its end). Sending each
    /// write at once would cost a small response two sends (head, body) instead of one, so
    /// writes are held here and sent together when Pingora flushes (end of the response, a
    /// `1xx` or a chunked head), when more than [`COALESCE_MAX`] is held, or when the proxy
    /// task next polls the client for reading, which it does whenever it is about to wait
    /// for the upstream: nothing written stays unsent while the proxy waits.
    fn send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.pending.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

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

/// The forwarding values of the connection behind `session` (from `peer`, on a `scheme`
/// listener), built at its first request; `None` where the connection is not an [`EdgeStream`]
/// (HTTP/2 streams share one).
pub fn own_hop(session: &Session, peer: IpAddr, scheme: Scheme) -> Option<&OwnHop> {
    let s = edge_stream(session)?;
    s.own_hop
        .get_or_init(|| OwnHop::new(peer, scheme).ok())
        .as_ref()
}

/// The response was sent: the connection is idle until the next request's first byte.
pub fn response_done(session: &Session) {
    if let Some(s) = edge_stream(session) {
        s.phase.store(PHASE_IDLE, Ordering::Release);
    }
}

impl AsyncRead for EdgeStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // About to wait for the client: send what is held (see `send_pending`). A full socket
        // is not an error here; the next write or flush waits for it.
        if !this.pending.is_empty() {
            if let Poll::Ready(Err(e)) = this.send_pending(cx) {
                return Poll::Ready(Err(e));
            }
        }
        let mut phase = this.phase.load(Ordering::Acquire);
        if phase == PHASE_REQUEST {
            this.armed = None;
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        if this.armed != Some(phase) {
            if phase == PHASE_HEAD {
                let started = this.head_started;
                this.arm(phase, started, this.limits.client_header_timeout);
            } else {
                this.head_bytes = 0;
                let now = tokio::time::Instant::now();
                this.arm(phase, now, this.limits.keepalive_timeout);
            }
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 && phase == PHASE_IDLE {
                    // The next head begins: its own deadline starts with its first byte. It is
                    // set only if the head does not arrive whole (the next read would wait).
                    phase = PHASE_HEAD;
                    this.phase.store(PHASE_HEAD, Ordering::Release);
                    this.head_started = tokio::time::Instant::now();
                    this.head_bytes = 0;
                    this.armed = None;
                }
                if phase == PHASE_HEAD {
                    this.head_bytes += n;
                }
                return Poll::Ready(Ok(()));
            }
            other => {
                if !matches!(other, Poll::Pending) {
                    return other;
                }
            }
        }
        if !this.timer_expired(cx) {
            return Poll::Pending;
        }
        if phase == PHASE_IDLE || this.head_bytes == 0 {
            // Nothing of a request arrived: close quietly (end of stream), as nginx does.
            METRICS.client_idle_closed.inc();
            return Poll::Ready(Ok(()));
        }
        METRICS.client_header_timeouts.inc();
        // Best effort, never waiting: the connection is closed right after.
        let inner = Pin::new(&mut this.inner);
        if let Poll::Ready(Ok(n)) = inner.poll_write(cx, TIMEOUT_RESPONSE) {
            if n == TIMEOUT_RESPONSE.len() {
                let _ = Pin::new(&mut this.inner).poll_flush(cx);
            }
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client_header_timeout: request head not received in time",
        )))
    }
}

impl AsyncWrite for EdgeStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.pending.len() + buf.len() > COALESCE_MAX {
            if let Poll::Ready(Err(e)) = this.send_pending(cx) {
                return Poll::Ready(Err(e));
            }
            if !this.pending.is_empty() {
                return Poll::Pending;
            }
            if buf.len() > COALESCE_MAX {
                return Pin::new(&mut this.inner).poll_write(cx, buf);
            }
        }
        this.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[async_trait]
impl Shutdown for EdgeStream {
    async fn shutdown(&mut self) {
        // Send what is held first: a close-delimited body ends with this shutdown.
        let _ = tokio::io::AsyncWriteExt::flush(self).await;
        self.inner.shutdown().await
    }
}

impl UniqueID for EdgeStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for EdgeStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for EdgeStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for EdgeStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for EdgeStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for EdgeStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

/// Wraps a server application (the proxy) with the connection cap and [`EdgeStream`].
pub struct EdgeApp<A> {
    inner: Arc<A>,
    limits: ConnLimits,
    permits: Arc<Semaphore>,
}

impl<A> EdgeApp<A> {
    /// Wrap `inner`.
    pub fn new(inner: A, limits: ConnLimits) -> Self {
        EdgeApp {
            inner: Arc::new(inner),
            limits,
            permits: Arc::new(Semaphore::new(limits.max_connections as usize)),
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for EdgeApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let Ok(_permit) = self.permits.clone().try_acquire_owned() else {
            // Over max_connections: close now (dropping the stream), keep the descriptor free.
            METRICS.client_connections_refused.inc();
            return None;
        };
        METRICS.client_connections.inc();
        let _gauge = scopeguard(|| METRICS.client_connections.dec());
        let mut next = Some(Box::new(EdgeStream::new(stream, self.limits)) as Stream);
        // Run any reuse here, not in Pingora's loop, so the permit is held until the end.
        while let Some(stream) = next {
            next = self.inner.process_new(stream, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// Runs `f` on drop (the connection gauge must go down however the connection ends).
fn scopeguard<F: FnMut()>(f: F) -> impl Drop {
    struct Guard<F: FnMut()>(F);
    impl<F: FnMut()> Drop for Guard<F> {
        fn drop(&mut self) {
            (self.0)()
        }
    }
    Guard(f)
}

// `Any` is required by Pingora's `IO` (blanket impl); asserted here so a missing trait shows up
// as an error in this file rather than at the call site.
const _: fn() = || {
    fn is_io<T: pingora::protocols::IO + Any>() {}
    is_io::<EdgeStream>();
};
