//! Request metrics on the real binary (issue 10 §4): request and upstream duration histograms per
//! route, the in-flight gauge, and the standard `process_*` metrics on `/metrics`.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use common::proxy::{get, ConfigBuilder, Proxy};
use common::upstream::Upstream;

/// An upstream that answers every request with `100 Continue`, then waits `delay`, then `200`:
/// the upstream's response head is the 200, not the 100.
fn continue_then_slow_upstream(delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        // Bounded: the test sends a handful of requests; the thread ends with the process.
        for stream in listener.incoming().take(16) {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
                std::thread::sleep(delay);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                );
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_in_flight_and_process_metrics() {
    let up = Upstream::start();
    let slow = continue_then_slow_upstream(Duration::from_millis(300));
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .upstream("slow", slow)
        .route(
            "limited",
            "path_prefix = \"/limited\"\nlimits = [{ requests = 2, window = \"1m\" }]",
        )
        .route("slow", "path_prefix = \"/slow\"\nupstream = \"slow\"")
        .build();
    let proxy = Proxy::start(&toml);

    // Before any request the unlabelled series exist at zero.
    assert_eq!(proxy.metric("slidegate_requests_in_flight"), Some(0.0));

    // 2 forwarded, 1 answered 429 by the proxy, 1 with no route; one delayed upstream answer.
    for _ in 0..3 {
        get(proxy.addr(), "/limited").await;
    }
    assert_eq!(get(proxy.addr(), "/nowhere").await.status, 404);
    assert_eq!(get(proxy.addr(), "/limited").await.status, 429);
    // The slow request is in flight while the upstream sits on it.
    let addr = proxy.addr();
    let slow_request = tokio::spawn(async move { get(addr, "/slow").await });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while proxy.metric("slidegate_requests_in_flight") != Some(1.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "in-flight never showed 1"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let slow_reply = slow_request.await.unwrap();
    assert_eq!(slow_reply.status, 200, "{}", slow_reply.body);

    let count = |s: &str| proxy.metric(s).unwrap_or_else(|| panic!("no {s}"));
    assert_eq!(
        count("slidegate_request_duration_seconds_count{route=\"limited\"}"),
        4.0,
        "every request, denied ones included"
    );
    assert_eq!(
        count("slidegate_request_duration_seconds_count{route=\"\"}"),
        1.0
    );
    assert_eq!(
        count("slidegate_upstream_duration_seconds_count{route=\"limited\"}"),
        2.0,
        "only forwarded requests reach an upstream"
    );
    assert_eq!(
        count("slidegate_upstream_duration_seconds_count{route=\"slow\"}"),
        1.0
    );
    let slow_upstream = count("slidegate_upstream_duration_seconds_sum{route=\"slow\"}");
    assert!(
        slow_upstream >= 0.3,
        "the 100 Continue is not the response head: upstream time {slow_upstream}s"
    );
    assert!(count("slidegate_request_duration_seconds_sum{route=\"slow\"}") >= slow_upstream);
    assert_eq!(count("slidegate_requests_in_flight"), 0.0, "nothing leaked");
    for p in [
        "process_start_time_seconds",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ] {
        assert!(count(p) > 0.0 || p == "process_cpu_seconds_total", "{p}");
    }
}
