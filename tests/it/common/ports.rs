//! Loopback ports for the processes the tests start.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};

/// A loopback port that was free a moment ago, chosen at random *below* the kernel's ephemeral
/// range, so the thousands of client connections other tests open in parallel (which take
/// ephemeral ports) cannot grab it before the proxy binds it.
pub fn free_port() -> u16 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const FLOOR: u32 = 10_000;
    if ephemeral_low > FLOOR + 1_000 {
        for _ in 0..1_000 {
            let mut h = RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
            let port = FLOOR + (h.finish() % u64::from(ephemeral_low - FLOOR)) as u32;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    // Unusual port range: let the kernel choose.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A loopback address on which nothing listens (connections to it are refused).
pub fn closed_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}
