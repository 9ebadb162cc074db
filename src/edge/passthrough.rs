//! The Pingora stream traits of [`EdgeStream`], each forwarded to the wrapped stream (only
//! `shutdown` sends what is held first, and `try_peek` is `edge::peek`'s).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};

use super::EdgeStream;

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
    /// Under the head deadline, and done at the first byte that is not the h2 preface's (see
    /// `edge::peek`).
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.peek_preface(buf).await
    }
}
