//! `slidegate healthcheck`: `GET /healthz` on the admin listener over loopback, for a
//! container's HEALTHCHECK (the image has no curl). Exit 0 on a 200, 1 otherwise.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Where to probe an admin listener bound to `admin`: an unspecified address (`0.0.0.0`,
/// `[::]`) is reached on the loopback address of its family; the port is kept.
pub fn probe_addr(admin: SocketAddr) -> SocketAddr {
    let ip = match admin.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, admin.port())
}

/// The status code of an HTTP/1.x response head.
fn status_of(head: &str) -> Option<u16> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    parts.next().filter(|v| v.starts_with("HTTP/1."))?;
    parts.next()?.parse().ok()
}

/// `GET /healthz` at `addr` within `timeout` (connect, write and read each); `Ok` on 200.
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let mut conn = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .and_then(|()| conn.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{addr}: cannot send: {e}"))?;
    let mut head = [0u8; 256];
    let n = conn
        .read(&mut head)
        .map_err(|e| format!("{addr}: no answer: {e}"))?;
    match status_of(&String::from_utf8_lossy(&head[..n])) {
        Some(200) => Ok(()),
        Some(status) => Err(format!("http://{addr}/healthz answered {status}")),
        None => Err(format!(
            "http://{addr}/healthz answered no HTTP status line"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_are_probed_on_loopback() {
        let p = |s: &str| probe_addr(s.parse().unwrap()).to_string();
        assert_eq!(p("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(p("[::]:9090"), "[::1]:9090");
        assert_eq!(p("10.1.2.3:9090"), "10.1.2.3:9090");
    }

    #[test]
    fn status_lines_parse() {
        assert_eq!(status_of("HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of("HTTP/1.0 503 Service Unavailable\r\n"), Some(503));
        assert_eq!(status_of("SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_of(""), None);
    }
}
