//! Issue 52 row 13 through the real binary: on the memory store, a client holding its 3 leases
//! (`concurrent = 3` beside a request limit) while a made-up-key flood on the same route pushes
//! buckets out of its arena. Before the fix the flood evicted the client's bucket into the
//! summary, which keeps counts but not leases: the running requests' renewals found nothing
//! ("lease lapsed"), and once the summary's copy of the leases freed at `lease_ttl` the client
//! had 3 more admitted, 6 in flight against 3. A bucket holding leases is now never evicted.
//!
//! The arena is made small (sixteen limited routes share 1 MB: about 1 KiB a shard, a few
//! buckets each), so a flood of a few thousand keys turns every shard over many times within
//! one renewal period (`lease_ttl = "1s"`: renewed every ⅓ s, which makes the bucket new
//! again). HTTP/1.1 only: this is the store's eviction, the same whatever the client protocol.

use crate::common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::control::poll_until;
use common::http::read_response;
use common::proxy::{ConfigBuilder, Proxy};
use common::upstream::{Upstream, DELAY_HEADER};

const N: u64 = 3;
/// Flood connections.
const THREADS: usize = 4;

/// One request on a new connection to `/c/` as `who`, held `delay_ms` at the upstream.
fn get(addr: SocketAddr, who: &str, delay_ms: u64) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "GET /c/x HTTP/1.1\r\nHost: x\r\nX-Client: {who}\r\n{DELAY_HEADER}: {delay_ms}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("send");
    read_response(&mut s).0
}

/// Made-up keys on keep-alive connections until `stop`; how many were sent.
fn flood(addr: SocketAddr, stop: Arc<AtomicBool>) -> usize {
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sent = 0;
                let mut s: Option<TcpStream> = None;
                while !stop.load(Ordering::Relaxed) {
                    let conn = s.get_or_insert_with(|| {
                        let c = TcpStream::connect(addr).expect("connect");
                        c.set_nodelay(true).unwrap();
                        c
                    });
                    let req = format!(
                        "GET /c/x HTTP/1.1\r\nHost: x\r\nX-Client: made-up-{t}-{sent}\r\n\r\n"
                    );
                    let status = match conn.write_all(req.as_bytes()) {
                        Ok(()) => read_response(conn).0,
                        Err(_) => 0,
                    };
                    if status == 0 {
                        s = None; // recycled by the keep-alive cap: open another
                        continue;
                    }
                    assert_eq!(status, 200, "a made-up key");
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
fn a_client_holding_its_leases_through_a_key_flood_never_has_more_than_n_in_flight() {
    let up = Upstream::start();
    let mut config = ConfigBuilder::new()
        .store("backend = \"memory\"\nmax_memory = \"1MB\"")
        .upstream("app", up.addr())
        .route(
            "c",
            &format!(
                "path_prefix = \"/c/\"\nkey = \"header:X-Client\"\n\
                 limits = [{{ concurrent = {N}, lease_ttl = \"1s\" }}, \
                 {{ requests = 100000, window = \"1m\" }}]"
            ),
        );
    // Fifteen more limited routes, each an arena: 1 MB / 16 an arena.
    for i in 0..15 {
        config = config.route(
            &format!("d{i}"),
            &format!("path_prefix = \"/d{i}/\"\nlimits = [{{ requests = 5, window = \"1m\" }}]"),
        );
    }
    let proxy = Proxy::start(&config.build());
    let addr = proxy.addr();

    // The client's 3 requests, held at the upstream for the whole test.
    let held: Vec<_> = (0..N)
        .map(|_| std::thread::spawn(move || get(addr, "victim", 20_000)))
        .collect();
    let at_upstream = poll_until(Duration::from_secs(5), || up.in_flight() == N);
    assert!(at_upstream.is_some(), "{} in flight", up.in_flight());

    // The flood, long enough for a renewal period to see every shard turned over many times.
    let evicted_before = proxy
        .metric("slidegate_store_evictions_total")
        .unwrap_or(0.0);
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = {
        let stop = stop.clone();
        std::thread::spawn(move || flood(addr, stop))
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let flooded = flooding.join().unwrap();
    let evicted = proxy
        .metric("slidegate_store_evictions_total")
        .unwrap_or(0.0)
        - evicted_before;
    // The flood's own requests are done: only the client's are at the upstream.
    let settled = poll_until(Duration::from_secs(5), || up.in_flight() == N);
    assert!(settled.is_some(), "{} in flight", up.in_flight());
    // Past `lease_ttl`, so a copy of the leases in the summary would have freed.
    std::thread::sleep(Duration::from_millis(1_300));

    // Three more: each a 429 at once while the 3 run; none may reach the upstream.
    let more: Vec<_> = (0..N)
        .map(|_| std::thread::spawn(move || get(addr, "victim", 3_000)))
        .collect();
    let mut most = 0;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_millis(1_500) {
        most = most.max(up.in_flight());
        std::thread::sleep(Duration::from_millis(5));
    }
    let statuses: Vec<u16> = more.into_iter().map(|t| t.join().unwrap()).collect();
    let lapsed = proxy.log().matches("concurrency lease lapsed").count();
    let at = format!(
        "{flooded} made-up keys in 4 s, {evicted} evicted; then: {statuses:?}, \
         most in flight {most}, {lapsed} lapsed leases"
    );
    println!("{at}");
    assert!(evicted > 1_000.0, "the flood evicted too little: {at}");
    assert_eq!(most, N, "{at}");
    assert_eq!(statuses, [429; N as usize], "{at}");
    assert_eq!(lapsed, 0, "{at}");
    drop(held);
}
