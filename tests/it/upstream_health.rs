//! Upstream health (`[upstreams.*]` `health_check`, `max_fails`, `fail_timeout`): a server
//! found dead gets no client request until it passes again, a pool whose servers are all down
//! is still tried (and answered `502`), passive ejection alone bounds what a dead server costs,
//! `slidegate_upstream_server_up` and one log line per change; bad health keys refused naming
//! file, line and key.
//!
//! The servers are [`Switch`]es: a port that can stop listening (its connects refused, its
//! connections closed) and listen again, counting client requests and health checks apart.
//! A client request to a dead server shows as a failed connect
//! (`slidegate_upstream_connect_failures_total`), retried on another server.
//!
//! `resolve_interval` is tested through the binary in `upstream_resolve.rs` (a name the test
//! points through an `LD_PRELOAD` resolver shim), and in `src/upstream_health/tests.rs` through
//! a resolver the test scripts (`Resolve`), on paused time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use crate::common::cli::check_config;
use crate::common::config::{assert_invalid, ConfigBuilder};
use crate::common::control::poll_until;
use crate::common::heavy::heavy;
use crate::common::http::get;
use crate::common::kept::Kept;
use crate::common::proxy::Proxy;
use crate::common::tls::{tls_options, Protocol, TestCa};

/// Requests a [`Switch`] answered: client requests, and `GET /healthz` checks.
#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    checks: AtomicU64,
}

/// An HTTP/1.1 server on a fixed loopback port that can be stopped and started again.
struct Switch {
    addr: SocketAddr,
    counts: Arc<Counts>,
    running: Option<(Arc<AtomicBool>, JoinHandle<Socket>)>,
    /// While stopped, the port bound without listening ([`hold_port`]).
    held: Option<Socket>,
}

/// Bind `addr` without listening: connects to it are refused, as to a dead server, and no test
/// running beside this one can be given the port (a clean-clone run once had 4 requests for a
/// stopped server answered `200` by some other test's server on its reused port).
fn hold_port(addr: SocketAddr) -> Socket {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket.set_reuse_address(true).expect("SO_REUSEADDR");
    socket
        .bind(&addr.into())
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    socket
}

impl Switch {
    fn start() -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut s = Switch {
            addr,
            counts: Arc::default(),
            running: None,
            held: None,
        };
        s.listen(listener);
        s
    }

    fn listen(&mut self, listener: TcpListener) {
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (counts, halt, addr) = (self.counts.clone(), stop.clone(), self.addr);
        let accept = std::thread::spawn(move || {
            let conns = Mutex::new(Vec::new());
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (counts, halt) = (counts.clone(), halt.clone());
                        let conn = std::thread::spawn(move || serve(stream, &counts, &halt));
                        conns.lock().unwrap().push(conn);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            drop(listener);
            let held = hold_port(addr);
            for conn in conns.into_inner().unwrap() {
                let _ = conn.join();
            }
            held
        });
        self.running = Some((stop, accept));
    }

    /// Stop listening and close every connection: connects are refused from now on.
    fn kill(&mut self) {
        if let Some((stop, accept)) = self.running.take() {
            stop.store(true, Ordering::SeqCst);
            self.held = Some(accept.join().unwrap());
        }
    }

    /// Listen again on the same port.
    fn revive(&mut self) {
        drop(self.held.take());
        self.listen(TcpListener::bind(self.addr).unwrap());
    }

    fn hits(&self) -> u64 {
        self.counts.hits.load(Ordering::SeqCst)
    }

    fn checks(&self) -> u64 {
        self.counts.checks.load(Ordering::SeqCst)
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Answer each request head on `stream` `200` (keep-alive) until the switch stops.
fn serve(mut stream: TcpStream, counts: &Counts, halt: &AtomicBool) {
    stream
        .set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !halt.load(Ordering::SeqCst) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
            Err(_) => return,
        }
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            let check = head.starts_with("GET /healthz ");
            let counter = if check { &counts.checks } else { &counts.hits };
            counter.fetch_add(1, Ordering::SeqCst);
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
            if stream.write_all(answer).is_err() {
                return;
            }
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// `slidegate_upstream_server_up` of `server` in upstream `app`.
fn server_up(proxy: &Proxy, server: SocketAddr) -> Option<f64> {
    proxy.metric(&format!(
        "slidegate_upstream_server_up{{upstream=\"app\",server=\"{server}\"}}"
    ))
}

fn connect_failures(proxy: &Proxy) -> u64 {
    proxy.counter("slidegate_upstream_connect_failures_total{upstream=\"app\"}")
}

/// Wait until `server`'s gauge is `want`, or fail naming what the log says.
fn wait_up(proxy: &Proxy, server: SocketAddr, want: f64, within: Duration) {
    let seen = poll_until(within, || server_up(proxy, server) == Some(want));
    assert!(
        seen.is_some(),
        "{server} never became {want} in {within:?}: {:?}\n{}",
        server_up(proxy, server),
        proxy.log()
    );
}

/// The process log's lines about `server` going up or down.
fn transitions(proxy: &Proxy, server: SocketAddr) -> Vec<String> {
    let down = format!("server {server} is down");
    let up = format!("server {server} is up");
    (proxy.log().lines())
        .filter(|l| l.contains(&down) || l.contains(&up))
        .map(str::to_string)
        .collect()
}

fn three(lines: &str) -> (Vec<Switch>, String) {
    let servers: Vec<Switch> = (0..3).map(|_| Switch::start()).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
    let config = ConfigBuilder::new()
        .upstream_servers("app", &addrs)
        .route("all", "")
        .build()
        .replace(
            &format!("servers = {addrs:?}\n"),
            &format!("servers = {addrs:?}\n{lines}\n"),
        );
    (servers, config)
}

const CHECKED: &str = "health_check = { path = \"/healthz\", interval = \"100ms\", \
                       timeout = \"200ms\", healthy = 2, unhealthy = 2 }\nmax_fails = 0";

/// The status of `GET /x` on a new connection of `protocol`.
async fn get_over(proxy: &Proxy, ca: &TestCa, protocol: Protocol) -> u16 {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let reply = conn.send("GET", "/x", &[], bytes::Bytes::new()).await;
    reply.unwrap_or_else(|e| panic!("{protocol:?}: {e}")).status
}

/// The clients' protocols in turn: the choice of a server is the same for each.
const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

#[tokio::test]
async fn a_dead_server_gets_no_request_once_its_checks_fail_and_traffic_once_they_pass() {
    let (mut servers, config) = three(CHECKED);
    let ca = TestCa::new("ca");
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    for s in &servers {
        wait_up(&proxy, s.addr, 1.0, Duration::from_secs(5));
        assert!(poll_until(Duration::from_secs(5), || s.checks() >= 1).is_some());
    }
    for _ in 0..6 {
        assert_eq!(get(proxy.addr(), "/x").await.status, 200);
    }
    assert!(servers.iter().all(|s| s.hits() >= 1), "round-robin first");

    let dead = servers[1].addr;
    servers[1].kill();
    wait_up(&proxy, dead, 0.0, Duration::from_secs(5));
    let failures = connect_failures(&proxy);
    let before: Vec<u64> = servers.iter().map(Switch::hits).collect();
    for i in 0..30 {
        let protocol = PROTOCOLS[i % 3];
        assert_eq!(get_over(&proxy, &ca, protocol).await, 200, "{protocol:?}");
    }
    assert_eq!(
        connect_failures(&proxy),
        failures,
        "a request paid a failed connect to the dead server"
    );
    let after: Vec<u64> = servers.iter().map(Switch::hits).collect();
    assert_eq!(after[1], before[1]);
    assert_eq!(after[0] + after[2], before[0] + before[2] + 30);
    assert!(after[0] > before[0] && after[2] > before[2], "{after:?}");

    let checks = servers[1].checks();
    servers[1].revive();
    wait_up(&proxy, dead, 1.0, Duration::from_secs(5));
    assert!(
        servers[1].checks() >= checks + 2,
        "back before `healthy` checks passed"
    );
    for i in 0..30 {
        let protocol = PROTOCOLS[i % 3];
        assert_eq!(get_over(&proxy, &ca, protocol).await, 200, "{protocol:?}");
    }
    assert!(
        servers[1].hits() >= 5,
        "no traffic again: {}",
        servers[1].hits()
    );

    let lines = transitions(&proxy, dead);
    assert_eq!(lines.len(), 2, "one line per change: {lines:#?}");
    assert!(lines[0].contains("WARN") && lines[0].contains("failed 2 health check"));
    assert!(lines[1].contains("INFO") && lines[1].contains("passed 2 health check"));
    for s in [&servers[0], &servers[2]] {
        assert!(transitions(&proxy, s.addr).is_empty());
    }
}

#[tokio::test]
async fn a_tcp_check_takes_a_server_out_without_a_path() {
    let tcp = "health_check = { interval = \"100ms\", timeout = \"200ms\", unhealthy = 1 }\n\
               max_fails = 0";
    let (mut servers, config) = three(tcp);
    let proxy = Proxy::start(&config);
    let dead = servers[2].addr;
    servers[2].kill();
    wait_up(&proxy, dead, 0.0, Duration::from_secs(5));
    let failures = connect_failures(&proxy);
    for _ in 0..12 {
        assert_eq!(get(proxy.addr(), "/x").await.status, 200);
    }
    assert_eq!(connect_failures(&proxy), failures);
    assert!(
        servers.iter().all(|s| s.checks() == 0),
        "a TCP check sends no request"
    );
}

#[tokio::test]
async fn when_every_server_is_down_requests_are_still_tried_and_answered_502() {
    let (mut servers, config) = three(CHECKED);
    let proxy = Proxy::start(&config);
    for s in &mut servers {
        s.kill();
    }
    for s in &servers {
        wait_up(&proxy, s.addr, 0.0, Duration::from_secs(5));
    }
    let failures = connect_failures(&proxy);
    assert_eq!(get(proxy.addr(), "/x").await.status, 502);
    assert_eq!(
        connect_failures(&proxy),
        failures + 3,
        "each server tried once"
    );
    // Still down by its checks, but tried: a revived server answers at once.
    servers[0].revive();
    assert_eq!(get(proxy.addr(), "/x").await.status, 200);
    assert_eq!(servers[0].hits(), 1);
}

#[tokio::test]
async fn passive_ejection_alone_sends_at_most_max_fails_requests_per_fail_timeout() {
    let (mut servers, config) = three("max_fails = 2\nfail_timeout = \"1s\"");
    let proxy = Proxy::start(&config);
    let dead = servers[0].addr;
    servers[0].kill();
    let failures = connect_failures(&proxy);
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_millis(2500) {
        assert_eq!(get(proxy.addr(), "/x").await.status, 200);
        sent += 1;
    }
    let paid = connect_failures(&proxy) - failures;
    // Windows of 1 s started within 2.5 s: at most 3, each with at most max_fails failures.
    assert!(sent > 30, "only {sent} requests");
    assert!(
        (2..=6).contains(&paid),
        "{paid} failed connects in {sent} requests"
    );
    let lines = transitions(&proxy, dead);
    assert!(
        lines[0].contains("is down: out for 1s: 2 failure(s)"),
        "{lines:#?}"
    );
    assert!(lines
        .iter()
        .any(|l| l.contains("is up: fail_timeout is over")));
    assert_eq!(servers[1].hits() + servers[2].hits(), sent);
}

#[tokio::test]
async fn by_default_one_failure_takes_a_server_out_for_ten_seconds() {
    let (mut servers, config) = three("");
    let proxy = Proxy::start(&config);
    let dead = servers[1].addr;
    servers[1].kill();
    let failures = connect_failures(&proxy);
    for _ in 0..30 {
        assert_eq!(get(proxy.addr(), "/x").await.status, 200);
    }
    assert_eq!(
        connect_failures(&proxy),
        failures + 1,
        "nginx's max_fails = 1"
    );
    assert_eq!(server_up(&proxy, dead), Some(0.0));
    let lines = transitions(&proxy, dead);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("out for 10s"), "{lines:#?}");
}

#[test]
fn bad_health_keys_are_refused_naming_file_line_and_key() {
    let base = "[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"\n\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n";
    let route = "\n[[routes]]\nname = \"r\"\nupstream = \"app\"\n";
    let cases = [
        (
            "health_check = { interval = \"0s\" }",
            "upstreams.app.health_check.interval",
            "shorter than 100ms",
        ),
        (
            "health_check = { interval = \"often\" }",
            "upstreams.app.health_check.interval",
            "invalid duration",
        ),
        (
            "health_check = { healthy = 0 }",
            "upstreams.app.health_check.healthy",
            "must be 1 to 100",
        ),
        (
            "health_check = { unhealthy = 101 }",
            "upstreams.app.health_check.unhealthy",
            "must be 1 to 100",
        ),
        (
            "health_check = { path = \"healthz\" }",
            "upstreams.app.health_check.path",
            "not an origin-form path",
        ),
        (
            "health_check = { port = 8081 }",
            "upstreams.app.health_check.port",
            "unknown field `port`",
        ),
        (
            "fail_timeout = \"0s\"",
            "upstreams.app.fail_timeout",
            "shorter than 1ms",
        ),
        ("max_fails = -1", "upstreams.app.max_fails", "invalid value"),
        (
            "resolve_interval = \"10ms\"",
            "upstreams.app.resolve_interval",
            "shorter than 1s",
        ),
        (
            "tls = true\nresolve_interval = \"30s\"",
            "upstreams.app.resolve_interval",
            "needs sni",
        ),
    ];
    for (lines, key, message) in cases {
        let text = format!("{base}{lines}\n{route}");
        let line = base.lines().count() + lines.lines().count();
        assert_invalid(&text, key, line, message);
    }
    // Through the binary, as an operator sees it: the file, its line, the key.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("health.toml");
    std::fs::write(
        &path,
        format!("{base}health_check = {{ healthy = 0 }}\n{route}"),
    )
    .unwrap();
    let out = check_config(&path, &[]);
    assert!(!out.ok);
    let said = out.output();
    let at = format!("{}:7", path.display());
    assert!(said.contains(&at), "{said}");
    assert!(
        said.contains("upstreams.app.health_check.healthy"),
        "{said}"
    );
}

#[test]
fn the_defaults_are_nginx_s_and_the_health_keys_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    let text = "[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"\n\n\
                [upstreams.app]\nservers = [\"localhost:1\"]\nresolve_interval = \"30s\"\n\
                health_check = { path = \"/healthz\" }\n\n\
                [[routes]]\nname = \"r\"\nupstream = \"app\"\n";
    std::fs::write(&path, text).unwrap();
    let t = crate::common::cli::effective_config(&path, &[("TMPDIR", "/tmp")]);
    let app = &t["upstreams"]["app"];
    assert_eq!(app["max_fails"].as_integer(), Some(1));
    assert_eq!(app["fail_timeout"].as_str(), Some("10s"));
    assert_eq!(app["resolve_interval"].as_str(), Some("30s"));
    let check = &app["health_check"];
    assert_eq!(check["interval"].as_str(), Some("5s"));
    assert_eq!(check["timeout"].as_str(), Some("1s"));
    assert_eq!(check["healthy"].as_integer(), Some(2));
    assert_eq!(check["unhealthy"].as_integer(), Some(3));
}

/// A burst of 300 h2c connections × 10 streams while one of three servers is dead: every
/// request answered 200 by the two up, none sent to the dead one, no failed connect.
#[test]
fn an_h2_burst_never_reaches_a_dead_server() {
    let _permit = heavy();
    use crate::common::load::{h2load, Burst};
    use crate::common::proxy::ProxyOptions;
    let (mut servers, config) = three(CHECKED);
    let proxy = Proxy::start_with(&config, ProxyOptions::h2c_two_threads());
    let dead = servers[1].addr;
    servers[1].kill();
    wait_up(&proxy, dead, 0.0, Duration::from_secs(5));
    let failures = connect_failures(&proxy);
    let before = servers[1].hits();
    let burst = Burst {
        connections: 300,
        streams: 10,
        requests: 3000,
        headers: vec![],
        path: "/x".into(),
    };
    let r = h2load(proxy.addr(), &burst);
    println!("300 x 10 h2c, one of three servers dead: {r:?}");
    assert_eq!((r.s2xx, r.failed), (3000, 0), "{r:?}");
    assert_eq!(
        servers[1].hits(),
        before,
        "a request reached the dead server"
    );
    assert_eq!(
        connect_failures(&proxy),
        failures,
        "a request paid a failed connect"
    );
    assert!(servers[0].hits() + servers[2].hits() >= 3000);
}
