//! Coalesced response writes: what Pingora writes is held and sent together.
//!
//! The listener's own write buffer is off so that a slowly written body streams as it arrives
//! (Pingora flushes a `Content-Length` response only at its end). Sending each write at once
//! would cost a small response two sends (head, body) instead of one, so writes are held here
//! and sent together when Pingora flushes (end of the response, a `1xx` or a chunked head), when
//! more than [`COALESCE_MAX`] is held, or when the proxy task next polls the client for reading,
//! which it does whenever it is about to wait for the upstream: nothing written stays unsent
//! while the proxy waits.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use super::EdgeStream;

/// Most response bytes held back to be sent together (one TCP segment's worth, about).
const COALESCE_MAX: usize = 16 * 1024;

impl EdgeStream {
    /// Send what `poll_write` held back (see the [module documentation](self)).
    pub(super) fn send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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

    /// Hold `buf` to be sent with what follows; past [`COALESCE_MAX`], send what is held first
    /// (and a large `buf` directly).
    pub(super) fn poll_write_coalesced(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.pending.len() + buf.len() > COALESCE_MAX {
            if let Poll::Ready(Err(e)) = self.send_pending(cx) {
                return Poll::Ready(Err(e));
            }
            if !self.pending.is_empty() {
                return Poll::Pending;
            }
            if buf.len() > COALESCE_MAX {
                return Pin::new(&mut self.inner).poll_write(cx, buf);
            }
        }
        self.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
}
