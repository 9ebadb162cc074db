//! The real slidegate binary under test: a config builder, a process harness that starts the
//! binary on loopback ports chosen at run time and waits until it serves, and small HTTP/1.1
//! clients (a fresh TCP connection per request) to talk to it.
//!
//! ```ignore
//! let up = Upstream::start();
//! let toml = ConfigBuilder::new()
//!     .upstream("app", up.addr())
//!     .route("api", r#"limits = [{ requests = 10, window = "1m" }]"#)
//!     .build();
//! let proxy = Proxy::start(&toml);
//! let reply = get(proxy.addr(), "/").await;
//! ```

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Ports.

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

// ---------------------------------------------------------------------------------------------
// Config.

/// Builds the part of a slidegate config below `[server]` (which [`Proxy::start`] writes itself,
/// with run-time ports and per-test paths), so tests state only what they are about.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    store: Option<String>,
    trusted_proxies: Vec<String>,
    upstreams: Vec<(String, Vec<String>, String)>,
    routes: Vec<(String, String)>,
    raw: String,
}

impl ConfigBuilder {
    /// An empty config: memory store, no trusted proxies, no upstreams, no routes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The config many tests need, built: upstream `app` at `addr` and one route, `all`, for
    /// every request, with no limits.
    pub fn unlimited(addr: impl std::fmt::Display) -> String {
        Self::new().upstream("app", addr).route("all", "").build()
    }

    /// Raw lines of the `[store]` table (default: the memory store).
    pub fn store(mut self, lines: &str) -> Self {
        self.store = Some(lines.to_string());
        self
    }

    /// `[client_ip] trusted_proxies`, as CIDRs.
    pub fn trusted_proxies(mut self, cidrs: &[&str]) -> Self {
        self.trusted_proxies = cidrs.iter().map(|c| c.to_string()).collect();
        self
    }

    /// `[upstreams.<name>]` with one server.
    pub fn upstream(self, name: &str, addr: impl std::fmt::Display) -> Self {
        self.upstream_servers(name, &[addr.to_string()])
    }

    /// `[upstreams.<name>]` with several servers.
    pub fn upstream_servers(mut self, name: &str, servers: &[String]) -> Self {
        self.upstreams
            .push((name.to_string(), servers.to_vec(), String::new()));
        self
    }

    /// `[upstreams.<name>]` with one server and `lines` as its other keys (e.g. `tls = true`).
    pub fn upstream_with(mut self, name: &str, addr: impl std::fmt::Display, lines: &str) -> Self {
        self.upstreams
            .push((name.to_string(), vec![addr.to_string()], lines.to_string()));
        self
    }

    /// Raw TOML appended after everything else, e.g. a `[log]` table.
    pub fn raw(mut self, toml: &str) -> Self {
        self.raw.push_str(toml);
        self.raw.push('\n');
        self
    }

    /// A `[[routes]]` entry named `name`, with `lines` as its other keys (TOML, one per line).
    /// Unless `lines` sets `upstream`, the route uses the first upstream added.
    pub fn route(mut self, name: &str, lines: &str) -> Self {
        self.routes.push((name.to_string(), lines.to_string()));
        self
    }

    /// The TOML text, for [`Proxy::start`].
    pub fn build(&self) -> String {
        let mut out = String::new();
        out.push_str("[store]\n");
        out.push_str(self.store.as_deref().unwrap_or("backend = \"memory\""));
        out.push_str("\n\n[client_ip]\ntrusted_proxies = [");
        for (i, c) in self.trusted_proxies.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            let _ = write!(out, "{sep}{c:?}");
        }
        out.push_str("]\n");
        for (name, servers, lines) in &self.upstreams {
            let _ = write!(
                out,
                "\n[upstreams.{name}]\nservers = {servers:?}\n{lines}\n"
            );
        }
        let default_upstream = self.upstreams.first().map(|(n, _, _)| n.as_str());
        for (name, lines) in &self.routes {
            let _ = writeln!(out, "\n[[routes]]\nname = {name:?}");
            let sets_upstream = lines
                .lines()
                .any(|l| l.trim_start().starts_with("upstream"));
            if let (false, Some(up)) = (sets_upstream, default_upstream) {
                let _ = writeln!(out, "upstream = {up:?}");
            }
            out.push_str(lines);
            out.push('\n');
        }
        out.push('\n');
        out.push_str(&self.raw);
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The process.

/// How to start the binary, beyond the config.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// `server.threads`.
    pub threads: usize,
    /// Extra command-line arguments after `-c <file>`.
    pub args: Vec<String>,
    /// Extra environment (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// How long to wait for `/healthz` and the proxy port before giving up.
    pub ready_timeout: Duration,
    /// Leave `server.pid_file` and `server.upgrade_sock` out of the config, so the binary derives
    /// them from the listen port under its temporary directory (set `TMPDIR` in `env` to choose
    /// it).
    pub default_paths: bool,
    /// `server.grace_period` (humantime).
    pub grace_period: &'static str,
    /// More `[server]` lines (TOML), e.g. `client_header_timeout = "500ms"` or `h2c = true`.
    pub server_extra: String,
    /// Start the process with this `RLIMIT_NOFILE` (soft and hard), like `prlimit --nofile=N`.
    pub nofile: Option<u64>,
    /// A TLS listener on a run-time port with this certificate chain and key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            threads: 1,
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(60),
            default_paths: false,
            grace_period: "1s",
            server_extra: String::new(),
            nofile: None,
            tls: None,
        }
    }
}

/// A running slidegate process, SIGKILLed on drop. Its config, pid file, upgrade socket and
/// log (stdout and stderr together) live in a temporary directory of its own.
pub struct Proxy {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
    tls_listen: Option<SocketAddr>,
    server_section: String,
    config_path: PathBuf,
    log_path: PathBuf,
    /// The upgrade socket this process (or one started with `-u` on its config) uses.
    upgrade_sock: PathBuf,
    // Last: removed after the process is killed (shared with processes started by
    // [`Proxy::spawn_upgrade`]).
    dir: Arc<TempDir>,
}

enum SpawnError {
    /// A port was taken between choosing it and the proxy binding it: try other ports.
    PortTaken(String),
}

impl Proxy {
    /// Start the real binary with `config_toml` (everything below `[server]`, typically from
    /// [`ConfigBuilder::build`]) and wait until `/healthz` answers 200 and the proxy port
    /// accepts connections. Panics, with the process log, if it does not get there.
    pub fn start(config_toml: &str) -> Proxy {
        Self::start_with(config_toml, ProxyOptions::default())
    }

    /// [`Proxy::start`] with options.
    pub fn start_with(config_toml: &str, opts: ProxyOptions) -> Proxy {
        assert!(
            !config_toml.contains("[server]"),
            "Proxy::start writes [server] itself; pass only the tables below it"
        );
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_spawn(config_toml, &opts) {
                Ok(proxy) => return proxy,
                Err(SpawnError::PortTaken(log)) => last = log,
            }
        }
        panic!("slidegate could not bind its ports after 5 attempts; last log:\n{last}");
    }

    fn try_spawn(config_toml: &str, opts: &ProxyOptions) -> Result<Proxy, SpawnError> {
        let dir = tempfile::Builder::new()
            .prefix("slidegate-test-")
            .tempdir()
            .expect("tempdir");
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        while admin == listen {
            admin.set_port(free_port());
        }
        let mut server_section = format!(
            "[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin}\"\nthreads = {}\n\
             grace_period = \"{}\"\n",
            opts.threads, opts.grace_period,
        );
        for line in opts.server_extra.lines() {
            server_section.push_str(line.trim());
            server_section.push('\n');
        }
        let mut tls_listen = None;
        if let Some((cert, key)) = &opts.tls {
            let mut addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            while addr == listen || addr == admin {
                addr.set_port(free_port());
            }
            let _ = write!(
                server_section,
                "tls_listen = \"{addr}\"\ntls_cert = {cert:?}\ntls_key = {key:?}\n"
            );
            tls_listen = Some(addr);
        }
        let upgrade_sock = if opts.default_paths {
            // As src/config/validate.rs derives it: `<temp dir>/slidegate-<listen port>.sock`.
            let tmp = opts
                .env
                .iter()
                .find(|(k, _)| k == "TMPDIR")
                .map(|(_, v)| PathBuf::from(v))
                .unwrap_or_else(std::env::temp_dir);
            tmp.join(format!("slidegate-{}.sock", listen.port()))
        } else {
            let sock = dir.path().join("upgrade.sock");
            let _ = write!(
                server_section,
                "pid_file = {:?}\nupgrade_sock = {sock:?}\n",
                dir.path().join("slidegate.pid"),
            );
            sock
        };
        server_section.push('\n');
        let config_path = dir.path().join("slidegate.toml");
        std::fs::write(&config_path, format!("{server_section}{config_toml}"))
            .expect("write config");
        let log_path = dir.path().join("slidegate.log");
        let child = spawn_slidegate(&config_path, &[], opts, &log_path);
        let mut proxy = Proxy {
            child,
            listen,
            admin,
            tls_listen,
            server_section,
            config_path,
            log_path,
            upgrade_sock,
            dir: Arc::new(dir),
        };
        proxy.wait_ready(opts.ready_timeout)?;
        Ok(proxy)
    }

    /// Wait until this process holds both listening sockets and answers on them.
    fn wait_ready(&mut self, timeout: Duration) -> Result<(), SpawnError> {
        let (listen, admin) = (self.listen, self.admin);
        // Without a TLS listener, check the plain one twice.
        let tls = self.tls_listen.unwrap_or(listen);
        let proxy = self;
        let deadline = Instant::now() + timeout;
        // Pingora retries a bind that finds its port taken (once a second, 30 times) and
        // logs "<addr> is in use, will try again"; another test's server may have taken the
        // port since it was chosen, so start over on fresh ports instead of waiting.
        let taken = [
            format!("{listen} is in use"),
            format!("{admin} is in use"),
            format!("{tls} is in use"),
        ];
        loop {
            if let Some(status) = proxy.child.try_wait().expect("try_wait") {
                let log = proxy.log();
                if log.contains("in use") || log.contains("os error 98") {
                    return Err(SpawnError::PortTaken(log));
                }
                panic!("slidegate exited with {status} before it was ready; log:\n{log}");
            }
            let log = proxy.log();
            if taken.iter().any(|t| log.contains(t.as_str())) {
                // Drop kills the process.
                return Err(SpawnError::PortTaken(log));
            }
            // Both ports must be held by *this* process (something else answering on a
            // reused port must not pass for it), then actually answer.
            let pid = proxy.child.id();
            if listens_on(pid, admin)
                && listens_on(pid, listen)
                && listens_on(pid, tls)
                && matches!(http_get_blocking(admin, "/healthz"), Ok((200, _)))
                && TcpStream::connect_timeout(&listen, Duration::from_secs(1)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                panic!(
                    "slidegate not ready after {timeout:?}; log:\n{}",
                    proxy.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The proxy listener.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// The TLS listener (panics if the proxy was started without one).
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls_listen.expect("started without ProxyOptions::tls")
    }

    /// The admin listener (`/metrics`, `/healthz`, `/readyz`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal (`libc::SIGTERM`, `libc::SIGHUP`, ...) to the process.
    pub fn signal(&self, sig: i32) -> std::io::Result<()> {
        // SAFETY: kill(2) has no memory-safety preconditions.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, sig) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Wait up to `timeout` for the process to exit; its status, or `None` if still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Status and body of `GET <path>` on the admin listener.
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get_blocking(self.admin, path)
            .unwrap_or_else(|e| panic!("admin GET {path}: {e}; log:\n{}", self.log()))
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics_text(&self) -> String {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "/metrics answered {status}: {body}");
        body
    }

    /// One sample of `/metrics`, written as in the exposition format with labels in any order,
    /// e.g. `slidegate_requests_total{route="x",decision="denied"}` or
    /// `slidegate_no_route_total`. `None` when there is no such series.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        find_sample(&self.metrics_text(), sample)
    }

    /// Like [`Proxy::metric`] but for a counter that must exist: its value as an integer.
    pub fn counter(&self, sample: &str) -> u64 {
        let text = self.metrics_text();
        match find_sample(&text, sample) {
            Some(v) => v as u64,
            None => panic!("no sample {sample} in /metrics:\n{text}"),
        }
    }

    /// `slidegate_requests_total{route,decision}`.
    pub fn decisions(&self, route: &str, decision: &str) -> u64 {
        self.counter(&format!(
            "slidegate_requests_total{{route=\"{route}\",decision=\"{decision}\"}}"
        ))
    }

    /// The config file the process was started with.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Replace the config file (same `[server]` section, new `config_toml` below it) atomically,
    /// e.g. before sending SIGHUP.
    pub fn write_config(&self, config_toml: &str) {
        let tmp = self.dir.path().join("slidegate.toml.new");
        std::fs::write(&tmp, format!("{}{config_toml}", self.server_section)).expect("write");
        std::fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    /// The temporary directory holding config, pid file, upgrade socket and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `[server]` section this process was started with (ports, threads, paths).
    pub fn server_section(&self) -> &str {
        &self.server_section
    }

    /// Replace the whole config file, `[server]` included, atomically (e.g. to change a
    /// restart-only setting before SIGHUP).
    pub fn write_config_text(&self, full_toml: &str) {
        let tmp = self.dir.path().join("slidegate.toml.new");
        std::fs::write(&tmp, full_toml).expect("write");
        std::fs::rename(&tmp, &self.config_path).expect("rename config");
    }

    /// The upgrade socket path of this process's config.
    pub fn upgrade_sock(&self) -> &Path {
        &self.upgrade_sock
    }

    /// Wait up to `timeout` until the process has installed a handler for `sig` (read from
    /// `SigCgt` in `/proc/<pid>/status`): a signal sent before that gets its default action
    /// (SIGHUP and SIGTERM kill, SIGQUIT dumps core). Panics on timeout.
    pub fn wait_signal_handler(&self, sig: i32, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let caught = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
                .ok()
                .and_then(|s| {
                    let line = s.lines().find(|l| l.starts_with("SigCgt:"))?.to_string();
                    u64::from_str_radix(line["SigCgt:".len()..].trim(), 16).ok()
                })
                .is_some_and(|mask| mask & (1u64 << (sig - 1)) != 0);
            if caught {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "slidegate installed no handler for signal {sig} within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Start a second slidegate on this one's config file (same ports, pid file, upgrade socket)
    /// with `-u`, as in a zero-downtime upgrade, and return once it listens on the upgrade
    /// socket. Send this process SIGQUIT next (the new one gives up after about 5 s without it),
    /// then call [`Proxy::wait_upgraded`] on the returned one. Its log is a file of its own.
    pub fn spawn_upgrade(&self, opts: &ProxyOptions) -> Proxy {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let log_path = self.dir.path().join(format!("slidegate-upgrade-{n}.log"));
        // The new process binds the socket path itself; a leftover file would look like it.
        let _ = std::fs::remove_file(&self.upgrade_sock);
        let child = spawn_slidegate(&self.config_path, &["-u"], opts, &log_path);
        let mut next = Proxy {
            child,
            listen: self.listen,
            admin: self.admin,
            tls_listen: self.tls_listen,
            server_section: self.server_section.clone(),
            config_path: self.config_path.clone(),
            log_path,
            upgrade_sock: self.upgrade_sock.clone(),
            dir: self.dir.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !next.upgrade_sock.exists() {
            if let Some(status) = next.child.try_wait().expect("try_wait") {
                panic!(
                    "slidegate -u exited with {status} before listening on {}; log:\n{}",
                    next.upgrade_sock.display(),
                    next.log()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "slidegate -u did not create {} in 30 s; log:\n{}",
                    next.upgrade_sock.display(),
                    next.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        next
    }

    /// For a process from [`Proxy::spawn_upgrade`], after the old one got SIGQUIT: wait until it
    /// holds both inherited listening sockets and answers on them.
    pub fn wait_upgraded(&mut self, timeout: Duration) {
        if self.wait_ready(timeout).is_err() {
            panic!("slidegate -u did not take over; log:\n{}", self.log());
        }
    }

    /// The process's stdout and stderr, as written so far.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The content of [`Proxy::log_path`].
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let mut start = log.len().saturating_sub(8_000);
            while !log.is_char_boundary(start) {
                start += 1;
            }
            let tail = &log[start..];
            eprintln!(
                "---- slidegate (pid {}) log tail ----\n{tail}\n---- end ----",
                self.child.id()
            );
        }
    }
}

/// Does process `pid` hold a listening TCP socket bound to exactly `addr` (IPv4)? Reads the
/// process's socket inodes from `/proc/<pid>/fd` and matches them in `/proc/<pid>/net/tcp`.
fn listens_on(pid: u32, addr: SocketAddr) -> bool {
    let SocketAddr::V4(v4) = addr else {
        return false;
    };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    // The kernel prints the address as the native-endian value of the network-order u32.
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(v4.ip().octets()),
        v4.port()
    );
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        f.len() > 9 && f[1] == local && f[3] == "0A" && inodes.contains(f[9])
    })
}

/// Find `name{labels}` (labels in any order) in Prometheus text.
fn find_sample(text: &str, sample: &str) -> Option<f64> {
    let want = parse_series(sample.trim())?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (parse_series(series)? == want).then(|| value.parse().ok())?
        })
}

/// `name{a="x",b="y"}` as (name, sorted label pairs).
fn parse_series(s: &str) -> Option<(String, Vec<(String, String)>)> {
    let Some((name, rest)) = s.split_once('{') else {
        return Some((s.to_string(), Vec::new()));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let end = after.find('"')?;
        labels.push((
            key.trim_start_matches(',').trim().to_string(),
            after[..end].to_string(),
        ));
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels.sort();
    Some((name.to_string(), labels))
}

// ---------------------------------------------------------------------------------------------
// Clients.

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

/// Start the real binary on `config` with `extra` arguments, output to `log_path`.
fn spawn_slidegate(config: &Path, extra: &[&str], opts: &ProxyOptions, log_path: &Path) -> Child {
    let log = File::create(log_path).expect("create log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slidegate"));
    if let Some(n) = opts.nofile {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.arg("-c")
        .arg(config)
        .args(extra)
        .args(&opts.args)
        .env("RUST_BACKTRACE", "1")
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone log handle"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn slidegate {extra:?}: {e}"))
}
