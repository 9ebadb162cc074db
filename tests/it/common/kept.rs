//! One client connection, kept: requests are sent on it one after the other, over any
//! [`Protocol`], and it never reconnects. A connection the proxy closed fails the next
//! request, so "all N answered on it" counts exactly one connection (reqwest would silently
//! open another).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};

use super::http::Reply;
use super::proxy::Proxy;
use super::tls::Protocol;

/// The sending half of a kept connection.
pub enum Kept {
    /// HTTP/1.1, in the clear or over TLS.
    H1(http1::SendRequest<Full<Bytes>>),
    /// HTTP/2, h2c or over TLS.
    H2(http2::SendRequest<Full<Bytes>>),
}

/// A stream to `proxy` for `protocol`: TCP, or TLS to `localhost` trusting only `ca_pem`
/// with ALPN offering just the protocol's version.
pub async fn stream(proxy: &Proxy, protocol: Protocol, ca_pem: &str) -> Box<dyn hyper_io::Io> {
    let addr = if protocol.tls() {
        proxy.tls_addr()
    } else {
        proxy.addr()
    };
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect proxy");
    // Without it a body written after its head waits for the head's delayed ACK (Nagle).
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    if !protocol.tls() {
        return Box::new(tcp);
    }
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("CA pem"))
        .expect("CA root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![match protocol {
        Protocol::H2Tls => b"h2".to_vec(),
        _ => b"http/1.1".to_vec(),
    }];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .expect("TLS handshake timed out")
        .expect("TLS handshake");
    Box::new(tls)
}

/// Object-safe async I/O for the two stream types.
pub mod hyper_io {
    pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
    impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}
}

impl Kept {
    /// Open one connection to `proxy` speaking `protocol`.
    pub async fn open(proxy: &Proxy, protocol: Protocol, ca_pem: &str) -> Kept {
        let io = TokioIo::new(stream(proxy, protocol, ca_pem).await);
        match protocol {
            Protocol::H1 | Protocol::H1Tls => {
                let (send, conn) = http1::handshake(io).await.expect("h1 handshake");
                tokio::spawn(conn);
                Kept::H1(send)
            }
            Protocol::H2c | Protocol::H2Tls => {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .expect("h2 handshake");
                tokio::spawn(conn);
                Kept::H2(send)
            }
        }
    }

    /// Has the proxy closed the connection (or is it otherwise unusable)?
    pub fn is_closed(&self) -> bool {
        match self {
            Kept::H1(s) => s.is_closed(),
            Kept::H2(s) => s.is_closed(),
        }
    }

    /// Send `method path` with `headers` and `body` on this connection and read the whole
    /// response (30 s bound); an error when the connection is gone.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Reply, String> {
        let mut builder = http::Request::builder().method(method);
        builder = match self {
            Kept::H1(_) => builder.uri(path).header("host", "localhost"),
            Kept::H2(_) => builder.uri(format!("http://localhost{path}")),
        };
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder.body(Full::new(body)).map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = match self {
                Kept::H1(s) => {
                    s.ready().await.map_err(|e| format!("not ready: {e}"))?;
                    s.send_request(req).await
                }
                Kept::H2(s) => {
                    s.ready().await.map_err(|e| format!("not ready: {e}"))?;
                    s.send_request(req).await
                }
            }
            .map_err(|e| format!("send: {e}"))?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| format!("body: {e}"))?;
            Ok(Reply {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body: String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            })
        };
        tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .map_err(|_| "no response in 30 s".to_string())?
    }
}
