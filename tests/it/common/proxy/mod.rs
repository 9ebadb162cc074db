//! The real slidegate binary under test: a process harness that starts the binary on loopback
//! ports chosen at run time and waits until it serves (`mod.rs`), reads its metrics
//! (`metrics.rs`) and operates it as an operator would: rewrite its config, signal it, hand over
//! to an upgrade (`operate.rs`).
//!
//! The config builder ([`super::config`]), ports ([`super::ports`]) and HTTP clients
//! ([`super::http`]) are re-exported here, so tests import one harness.
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

use std::fmt::Write as _;
use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

// Not every test crate uses every re-export.
#[allow(unused_imports)]
pub use super::config::{limit, limited, ConfigBuilder};
#[allow(unused_imports)]
pub use super::http::{
    connect, exchange, get, http_get_blocking, read_response, request, send, Conn, Reply,
};
#[allow(unused_imports)]
pub use super::ports::{closed_addr, free_port};

mod metrics;
mod operate;

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
    /// Listen on `[::]:<port>` (IPv6 and IPv4-mapped peers) instead of `127.0.0.1:<port>`;
    /// [`Proxy::addr`] stays `127.0.0.1:<port>`, so its clients arrive as `::ffff:127.0.0.1`.
    pub dual_stack: bool,
}

impl ProxyOptions {
    /// h2c on, two worker threads: the product's HTTP/2 path under real concurrency.
    pub fn h2c_two_threads() -> ProxyOptions {
        ProxyOptions {
            threads: 2,
            server_extra: "h2c = true".into(),
            ..ProxyOptions::default()
        }
    }
}

/// Start a proxy with `opts` and wait until its store answers (`/readyz?store` 200).
pub fn start_ready(config_toml: &str, opts: ProxyOptions) -> Proxy {
    let proxy = Proxy::start_with(config_toml, opts);
    super::admin::wait_readyz(&proxy, 200, Duration::from_secs(10));
    proxy
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
            dual_stack: false,
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
        let bind = match opts.dual_stack {
            true => format!("[::]:{}", listen.port()),
            false => listen.to_string(),
        };
        let mut server_section = format!(
            "[server]\nlisten = \"{bind}\"\nadmin_listen = \"{admin}\"\nthreads = {}\n\
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
    // A dual-stack `[::]:<port>` listener (see `ProxyOptions::dual_stack`) serves the IPv4
    // address too.
    let any_v6 = format!("{:032X}:{:04X}", 0, v4.port());
    ["tcp", "tcp6"].iter().any(|table| {
        let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            return false;
        };
        table.lines().skip(1).any(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            f.len() > 9
                && (f[1] == local || f[1] == any_v6)
                && f[3] == "0A"
                && inodes.contains(f[9])
        })
    })
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
