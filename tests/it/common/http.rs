//! Small HTTP/1.1 clients for the binary under test, each on a fresh TCP connection: a hyper
//! client ([`send`], [`get`], [`connect`]), a blocking one for the admin listener
//! ([`http_get_blocking`]) and a raw-socket one that sends exact bytes ([`exchange`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// `GET <path>` over a new blocking connection: status and body. Handles `Content-Length`,
/// chunked and close-delimited bodies. For the admin listener and readiness polling; usable from
/// any thread, inside or outside a Tokio runtime.
pub fn http_get_blocking(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or_else(|| bad("bad chunk"))?;
            let size_text = String::from_utf8_lossy(&rest[..eol]);
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            rest = &rest[eol + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(rest.get(..size).ok_or_else(|| bad("short chunk"))?);
            rest = rest.get(size + 2..).unwrap_or(&[]);
        }
        body = out;
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// Body, lossily decoded.
    pub body: String,
}

impl Reply {
    /// A header's value as text (`None` when absent or not visible ASCII).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// An open client connection on which one request can be sent; see [`connect`].
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<hyper::Result<()>>,
}

/// Open a TCP connection to `addr` (without sending anything yet), e.g. to have thousands of
/// connections open before any of them sends its request.
pub async fn connect(addr: SocketAddr) -> Result<Conn, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    handshake(stream).await
}

/// [`connect`] from the local address `from` (any of 127.0.0.0/8 on Linux): a test client
/// with an address of its own.
pub async fn connect_from(addr: SocketAddr, from: std::net::IpAddr) -> Result<Conn, String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    socket
        .bind(SocketAddr::new(from, 0))
        .map_err(|e| format!("bind {from}: {e}"))?;
    let stream = socket
        .connect(addr)
        .await
        .map_err(|e| format!("connect {addr} from {from}: {e}"))?;
    handshake(stream).await
}

async fn handshake(stream: tokio::net::TcpStream) -> Result<Conn, String> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    Ok(Conn {
        sender,
        driver: tokio::spawn(conn),
    })
}

impl Conn {
    /// Send one HTTP/1.1 request (with `Connection: close`) and read the whole response, then
    /// close the connection. `Host: localhost` is sent unless `headers` has a `Host`; repeated
    /// names in `headers` become repeated header lines.
    pub async fn send(
        mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let mut builder = http::Request::builder().method(method).uri(path);
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            builder = builder.header("host", "localhost");
        }
        builder = builder.header("connection", "close");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("build request: {e}"))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        drop(self.sender);
        let _ = self.driver.await;
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// Send one request on a new TCP connection; see [`Conn::send`].
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    connect(addr).await?.send(method, path, headers).await
}

/// [`request`] that panics on a transport error, with a 30 s bound.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    match tokio::time::timeout(
        Duration::from_secs(30),
        request(addr, method, path, headers),
    )
    .await
    {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => panic!("{method} {path} via {addr}: {e}"),
        Err(_) => panic!("{method} {path} via {addr}: no response in 30 s"),
    }
}

/// `GET <path>` with no extra headers; see [`send`].
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, &[]).await
}

/// Send `bytes` on a new connection (no half-close: Pingora drops a request whose client
/// half-closed before the answer) and read one response: `(status, head and body)`; status 0
/// when the connection closed without one.
pub fn exchange(addr: SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    read_response(&mut s)
}

/// Read one response from `s`: until the body given by `Content-Length` is complete, EOF, or
/// the read timeout.
pub fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                break;
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    (status_of(&text), text)
}

/// The status code of raw response text starting `HTTP/1.x NNN`; 0 when it does not.
pub fn status_of(text: &str) -> u16 {
    text.strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Send `bytes` on a new connection and read everything until the proxy closes it (10 s
/// bound): every head of the exchange, interim `1xx` ones included, as text.
pub fn exchange_to_close(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}
