//! The tests' latency-injecting TCP proxy (`tests/it/common/delay_proxy.rs`, one definition) as a
//! program, so `scripts/bench-rtt` can put a Redis one network hop away.
//!
//! ```text
//! cargo run --release --example delay_proxy -- 127.0.0.1:6379 500
//! ```
//!
//! Forwards a free loopback port to UPSTREAM (a loopback address), delaying every chunk by
//! ONE_WAY_US microseconds in each direction (500: a 1 ms round trip). Prints the address it
//! listens on, then runs until killed.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

#[allow(dead_code)]
#[path = "../tests/it/common/delay_proxy.rs"]
mod delay_proxy;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: delay_proxy UPSTREAM ONE_WAY_US";
    let upstream: SocketAddr = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let one_way: u64 = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    anyhow::ensure!(
        upstream.ip().is_loopback(),
        "UPSTREAM must be a loopback address"
    );
    let proxy = delay_proxy::DelayProxy::start(upstream, Duration::from_micros(one_way));
    println!("{}", proxy.addr());
    std::io::stdout().flush()?;
    // The proxy's threads do the work; this one only keeps it alive.
    loop {
        std::thread::park();
    }
}
