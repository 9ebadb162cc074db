//! Issue 17 item 4, end to end: the memory store with a small `max_memory` cannot be emptied of
//! protection. A key-rotation flood (each made-up `X-Api-Key` sends exactly its quota) fills its
//! route's arena and makes it evict (since issue 32 into its summary: there is no overflow bucket
//! any more); afterwards another route's limit is still exact, and a fresh key on the flooded
//! route is still limited: answered 200 or 429 (never 503, never admitted unrecorded).

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::http::read_response;
use common::proxy::{limit, ConfigBuilder, Proxy};
use common::upstream::Upstream;

/// Quota of every client of both routes, per hour (nothing slides out during the test).
const QUOTA: u32 = 2;
/// Flood threads, each on one keep-alive connection.
const THREADS: usize = 4;
/// Made-up keys per round, over all threads.
const ROUND: usize = 500;
/// Upper bound on flood rounds (the 1 MB store fills well before).
const MAX_ROUNDS: usize = 40;

/// Send `GET <path>` with `header: value` for each value, `per_key` times each, on one
/// keep-alive connection; the statuses seen, counted.
fn keep_alive_gets(
    addr: SocketAddr,
    path: &str,
    header: &str,
    values: impl Iterator<Item = String>,
    per_key: u32,
) -> BTreeMap<u16, usize> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for value in values {
        for _ in 0..per_key {
            let req =
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{header}: {value}\r\n\r\n");
            s.write_all(req.as_bytes()).expect("send");
            let (status, text) = read_response(&mut s);
            assert_ne!(
                status, 0,
                "no response on a kept-alive connection: {text:?}"
            );
            *statuses.entry(status).or_default() += 1;
        }
    }
    statuses
}

/// One flood round: keys `round * ROUND ..` over [`THREADS`] connections, each sent [`QUOTA`]
/// times. Every answer must be 200 or 429.
fn flood_round(addr: SocketAddr, round: usize) -> BTreeMap<u16, usize> {
    let per = ROUND / THREADS;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let first = round * ROUND + t * per;
                let keys = (first..first + per).map(|i| format!("made-up-{i}"));
                keep_alive_gets(addr, "/k", "X-Api-Key", keys, QUOTA)
            })
        })
        .collect();
    let mut all: BTreeMap<u16, usize> = BTreeMap::new();
    for h in handles {
        for (status, n) in h.join().expect("flood thread") {
            *all.entry(status).or_default() += n;
        }
    }
    all
}

#[test]
fn a_key_rotation_flood_fills_its_arena_and_no_limit_opens() {
    let _permit = common::heavy::heavy();
    let up = Upstream::start();
    let route = |path: &str, header: &str| {
        format!(
            "path_prefix = \"{path}\"\nkey = \"header:{header}\"\non_error = \"allow\"\n{}",
            limit(QUOTA, "1h")
        )
    };
    let proxy = Proxy::start(
        &ConfigBuilder::new()
            .store("backend = \"memory\"\nmax_memory = \"1MB\"")
            .upstream("app", up.addr())
            .route("keys", &route("/k", "X-Api-Key"))
            .route("login", &route("/login", "X-User"))
            .build(),
    );
    let addr = proxy.addr();
    let evictions = || {
        proxy
            .metric("slidegate_store_evictions_total")
            .unwrap_or(0.0) as u64
    };
    let overflow = |route: &str| {
        proxy
            .metric(&format!(
                "slidegate_memory_overflow_total{{route=\"{route}\"}}"
            ))
            .unwrap_or(0.0) as u64
    };

    // Flood until the arena is full (its first eviction), then one more round.
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut rounds = 0;
    let mut filled_at = None;
    while rounds < MAX_ROUNDS {
        for (status, n) in flood_round(addr, rounds) {
            *statuses.entry(status).or_default() += n;
        }
        rounds += 1;
        if filled_at.is_some() {
            break;
        }
        if evictions() > 0 {
            filled_at = Some(rounds * ROUND);
        }
    }
    let filled_at = filled_at.unwrap_or_else(|| panic!("no eviction after {rounds} rounds"));
    let flooded = rounds * ROUND;
    assert!(
        statuses.keys().all(|s| [200, 429].contains(s)),
        "flood answers {statuses:?}"
    );
    let overflows = overflow("keys");
    assert_eq!(overflows, 0, "every key had a bucket of its own (issue 32)");

    // Another route: fresh clients each get exactly their limit.
    let users = (0..50).map(|i| format!("user-{i}"));
    let login = keep_alive_gets(addr, "/login", "X-User", users, QUOTA + 1);
    assert_eq!(
        login,
        BTreeMap::from([(200, 50 * QUOTA as usize), (429, 50)]),
        "another route's limit after the flood"
    );
    assert_eq!(overflow("login"), 0, "login decided in its own arena");

    // A fresh key on the flooded route: never more than its limit, answered 200/429 only.
    let fresh = keep_alive_gets(
        addr,
        "/k",
        "X-Api-Key",
        ["fresh".to_string()].into_iter(),
        10,
    );
    assert!(
        fresh.keys().all(|s| [200, 429].contains(s)),
        "fresh key answers {fresh:?}"
    );
    let fresh_admitted = fresh.get(&200).copied().unwrap_or(0);
    assert!(
        fresh_admitted <= QUOTA as usize,
        "fresh key admitted {fresh:?}"
    );

    // Nothing failed open or closed, and nothing was refused as full.
    for r in ["keys", "login"] {
        assert_eq!(
            proxy.decisions(r, "error_allowed"),
            0,
            "{r} admitted unrecorded"
        );
        assert_eq!(proxy.decisions(r, "error_denied"), 0, "{r} answered 503");
    }
    for kind in ["timeout", "unavailable", "backend"] {
        let sample = format!("slidegate_store_errors_total{{kind=\"{kind}\"}}");
        assert_eq!(proxy.counter(&sample), 0, "{sample}");
    }
    println!(
        "max_memory 1MB, 2 routes: arena of `keys` full after {filled_at} made-up keys \
         (each sent {QUOTA}); flooded with {flooded} keys: {statuses:?}, {} evictions; then \
         `login`: {login:?}; a fresh key on `keys`: {fresh:?}",
        evictions()
    );
}
