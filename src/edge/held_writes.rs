//! Held writes: what Pingora writes to a client is held back and sent together.
//!
//! The listener's own write buffer is off so that a slowly written body streams as it arrives
//! (Pingora flushes a `Content-Length` response only at its end). Sending each write at once
//! would cost a small response two sends (head, body) instead of one, so writes are held here
//! and sent together when Pingora flushes (end of the response, a `1xx` or a chunked head), when
//! more than [`HELD_MAX`] is held, or when the proxy task next polls the client for reading,
//! which it does whenever it is about to wait for the upstream: nothing written stays unsent
//! while the proxy waits.
//!
//! Every write also carries `send_timeout` (nginx's, 60 s by default): a client that takes no
//! byte for that long (it never reads its response, on HTTP/1 or HTTP/2) gets a write error,
//! which closes the connection. Pingora's own downstream write timeout is none.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use super::EdgeStream;

/// Most response bytes held back to be sent together (one TCP segment's worth, about).
const HELD_MAX: usize = 16 * 1024;

impl EdgeStream {
    /// Send what `poll_write` held back (see the [module documentation](self)).
    pub(super) fn send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.held) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.held.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Hold `buf` to be sent with what follows; past [`HELD_MAX`], send what is held first
    /// (and a large `buf` directly).
    pub(super) fn poll_write_held(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.held.len() + buf.len() > HELD_MAX {
            if let Poll::Ready(Err(e)) = self.send_held(cx) {
                return Poll::Ready(Err(e));
            }
            if !self.held.is_empty() {
                return Poll::Pending;
            }
            if buf.len() > HELD_MAX {
                return Pin::new(&mut self.inner).poll_write(cx, buf);
            }
        }
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
}

impl EdgeStream {
    /// Pass on the outcome of a write (or flush) to the client, unless it has waited for the
    /// client longer than `send_timeout`: any progress disarms the timer, a wait arms it.
    pub(super) fn within_send_timeout<T>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if outcome.is_ready() {
            self.send_timer = None;
            return outcome;
        }
        let limit = self.limits.send_timeout;
        let timer = self
            .send_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        crate::metrics::METRICS.client_send_timeouts.inc();
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "send_timeout: the client took no response bytes in time",
        )))
    }
}
