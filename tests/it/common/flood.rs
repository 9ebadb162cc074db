//! Made-up-key floods over keep-alive HTTP/1.1 connections: one header carries the key, each
//! key sends a few requests, and every answer must be 200 or 429.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::http::read_response;

/// Flood threads, each on one keep-alive connection.
pub const THREADS: usize = 4;

/// One keep-alive connection that sends `GET <path>` with one header and counts statuses.
pub struct Client {
    addr: SocketAddr,
    stream: TcpStream,
    path: String,
    header: String,
}

impl Client {
    pub fn new(addr: SocketAddr, path: &str, header: &str) -> Client {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            addr,
            stream,
            path: path.into(),
            header: header.into(),
        }
    }

    /// The status of one request carrying `value`; only 200 and 429 are acceptable answers.
    /// A connection the proxy recycled (its keep-alive request cap) is opened again.
    pub fn get(&mut self, value: &str) -> u16 {
        let (path, header) = (&self.path, &self.header);
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{header}: {value}\r\n\r\n");
        let sent = self.stream.write_all(req.as_bytes()).is_ok();
        let (mut status, mut text) = if sent {
            read_response(&mut self.stream)
        } else {
            (0, String::new())
        };
        if status == 0 {
            *self = Client::new(self.addr, &self.path.clone(), &self.header.clone());
            self.stream.write_all(req.as_bytes()).expect("send");
            (status, text) = read_response(&mut self.stream);
        }
        assert!([200, 429].contains(&status), "{value}: {status} {text:?}");
        status
    }
}

/// Made-up keys `prefix-first ..` on [`THREADS`] connections, `per_key` requests each, `n`
/// keys in all; the statuses seen.
pub fn flood(
    addr: SocketAddr,
    route: (&str, &str),
    prefix: &str,
    first: usize,
    n: usize,
    per_key: u32,
) -> BTreeMap<u16, usize> {
    let per = n / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (path, header, prefix) =
                (route.0.to_string(), route.1.to_string(), prefix.to_string());
            std::thread::spawn(move || {
                let mut c = Client::new(addr, &path, &header);
                let mut seen: BTreeMap<u16, usize> = BTreeMap::new();
                for i in first + t * per..first + (t + 1) * per {
                    for _ in 0..per_key {
                        *seen.entry(c.get(&format!("{prefix}-{i}"))).or_default() += 1;
                    }
                }
                seen
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for h in handles {
        for (s, n) in h.join().expect("flood thread") {
            *all.entry(s).or_default() += n;
        }
    }
    all
}
