//! Operating a running proxy: rewrite its config (before SIGHUP), wait until it handles a
//! signal, start the process that takes over in a zero-downtime upgrade.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{spawn_slidegate, Proxy, ProxyOptions};

impl Proxy {
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
}
