//! A scripted HTTP/1.1 upstream for hostile-upstream tests: every request head gets the bytes
//! a test's function writes for it (interim `1xx` heads, forged fields, malformed heads), on a
//! kept connection. A request body of a `Content-Length` is read and dropped; after a `101` the
//! connection becomes an echo tunnel.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Answers a request head (its text, lossy) with the bytes to send back.
pub type Script = dyn Fn(&str) -> Vec<u8> + Send + Sync;

/// Answers a request head with the bytes to send back in parts, written [`PART_PAUSE`] apart
/// (so the proxy reads each part on its own).
pub type PartsScript = dyn Fn(&str) -> Vec<Vec<u8>> + Send + Sync;

/// The pause between two parts of a [`PartsScript`]'s answer.
pub const PART_PAUSE: std::time::Duration = std::time::Duration::from_millis(40);

/// A running scripted upstream; its listener thread lives as long as the test process.
pub struct RawUpstream {
    addr: SocketAddr,
    heads: Arc<AtomicUsize>,
}

impl RawUpstream {
    /// Listen on a loopback port and answer each request head with `script(head)`.
    pub fn start(script: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> RawUpstream {
        RawUpstream::start_in_parts(move |head| vec![script(head)])
    }

    /// Listen on a loopback port and answer each request head with the parts `script(head)`
    /// returns, each written (and flushed) [`PART_PAUSE`] after the last.
    pub fn start_in_parts(
        script: impl Fn(&str) -> Vec<Vec<u8>> + Send + Sync + 'static,
    ) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind raw upstream");
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(AtomicUsize::new(0));
        let script: Arc<PartsScript> = Arc::new(script);
        let seen = heads.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (script, seen) = (script.clone(), seen.clone());
                std::thread::spawn(move || serve(conn, &*script, &seen));
            }
        });
        RawUpstream { addr, heads }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Request heads received so far.
    pub fn heads(&self) -> usize {
        self.heads.load(Ordering::SeqCst)
    }
}

fn serve(mut conn: TcpStream, script: &PartsScript, seen: &AtomicUsize) {
    let mut buf = [0u8; 16 * 1024];
    let mut got = Vec::new();
    loop {
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end + 4]).into_owned();
        got.drain(..end + 4);
        seen.fetch_add(1, Ordering::SeqCst);
        let parts = script(&head);
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(PART_PAUSE);
            }
            if conn.write_all(part).and_then(|_| conn.flush()).is_err() {
                return;
            }
        }
        let reply = parts.concat();
        if reply.starts_with(b"HTTP/1.1 101") {
            return echo(conn, got);
        }
        // Drop the request's body, if it has a length.
        let mut left = content_length(&head).saturating_sub(got.len());
        got.drain(..got.len().min(content_length(&head)));
        while left > 0 {
            match conn.read(&mut buf[..left.min(16 * 1024)]) {
                Ok(0) | Err(_) => return,
                Ok(n) => left -= n,
            }
        }
    }
}

fn content_length(head: &str) -> usize {
    (head.lines())
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

fn echo(mut conn: TcpStream, pending: Vec<u8>) {
    if !pending.is_empty() && conn.write_all(&pending).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = conn.read(&mut buf) {
        if conn.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}
