//! The pid file (`server.pid_file`): written once the proxy's listeners are bound, removed at
//! exit, and read by `slidegate -s reload|stop|reopen` to signal the running process (like
//! `nginx -s`).
//!
//! Pingora writes it only when it daemonizes, which slidegate never does (systemd, containers
//! and the tests run it in the foreground), so slidegate writes it itself. A zero-downtime
//! upgrade hands the file over: the new process writes its own pid, and the old one, exiting
//! after it, removes the file only if it still holds the old pid.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pingora::server::ListenFds;

/// What `-s` asks the running process to do, and the signal that does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Command {
    /// Re-read the config file (SIGHUP).
    Reload,
    /// Serve `shutdown_delay` more, then finish in-flight requests, at most `grace_period`,
    /// and exit (SIGTERM).
    Stop,
    /// Reopen the access log file, after logrotate moved it (SIGUSR1).
    Reopen,
}

impl Command {
    /// The signal sent for this command.
    pub fn signal(self) -> libc::c_int {
        match self {
            Command::Reload => libc::SIGHUP,
            Command::Stop => libc::SIGTERM,
            Command::Reopen => libc::SIGUSR1,
        }
    }
}

/// Why `-s` could not signal the running process.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// No pid file: the process is not running, or runs with another `pid_file`.
    #[error("cannot read pid file {}: {source} (is slidegate running with this config?)", path.display())]
    Missing {
        /// The pid file.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// The file does not hold a process id.
    #[error("pid file {} does not hold a process id: {text:?}", path.display())]
    Malformed {
        /// The pid file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// The file names a process that no longer exists (it was killed without cleaning up).
    #[error("pid file {} is stale: no process {pid} (remove the file)", path.display())]
    Stale {
        /// The pid file.
        path: PathBuf,
        /// The pid it holds.
        pid: i32,
    },
    /// The process exists but cannot be signalled (another user's).
    #[error("cannot signal process {pid}: {source}")]
    Denied {
        /// The pid.
        pid: i32,
        /// The `kill` error.
        source: std::io::Error,
    },
}

/// Parse a pid file's text: one positive decimal pid, surrounding whitespace allowed.
fn parse(text: &str) -> Option<i32> {
    text.trim().parse().ok().filter(|pid| *pid > 0)
}

/// The pid `path` holds.
pub fn read(path: &Path) -> Result<i32, SignalError> {
    let text = std::fs::read_to_string(path).map_err(|source| SignalError::Missing {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).ok_or_else(|| SignalError::Malformed {
        path: path.to_path_buf(),
        text: text.chars().take(40).collect(),
    })
}

/// Send `command`'s signal to the process `path` names; returns its pid.
pub fn send(path: &Path, command: Command) -> Result<i32, SignalError> {
    let pid = read(path)?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, command.signal()) } == 0 {
        return Ok(pid);
    }
    let source = std::io::Error::last_os_error();
    Err(match source.raw_os_error() {
        Some(libc::ESRCH) => SignalError::Stale {
            path: path.to_path_buf(),
            pid,
        },
        _ => SignalError::Denied { pid, source },
    })
}

/// Write this process's pid to `path`: a temporary file renamed over it, so a reader never
/// sees a half-written pid.
pub fn write(path: &Path) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("pid.{}.tmp", std::process::id()));
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{}", std::process::id())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Does `path` name another live process? After a SIGQUIT upgrade the successor has written its
/// own pid there.
pub fn names_another(path: &Path) -> bool {
    read(path).is_ok_and(|pid| pid != std::process::id() as i32)
}

/// Remove `path` if it still holds this process's pid (after an upgrade it holds the
/// successor's).
pub fn remove_if_ours(path: &Path) {
    if read(path).ok() == Some(std::process::id() as i32) {
        if let Err(e) = std::fs::remove_file(path) {
            log::warn!("cannot remove pid file {}: {e}", path.display());
        }
    }
}

/// Write the pid file once Pingora has bound (or, on upgrade, received) every address in
/// `addrs`: Pingora records each listening socket in `fds` right after binding it. Polled
/// every 10 ms, for at most a minute.
pub async fn write_when_bound(fds: ListenFds, addrs: Vec<String>, path: PathBuf) {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for _ in 0..6000 {
        tick.tick().await;
        let bound = {
            let table = fds.lock();
            addrs.iter().all(|a| table.get(a).is_some())
        };
        if bound {
            match write(&path) {
                Ok(()) => log::info!("pid {} written to {}", std::process::id(), path.display()),
                Err(e) => log::error!("cannot write pid file {}: {e}", path.display()),
            }
            return;
        }
    }
    log::error!(
        "listeners {addrs:?} not bound after 60 s; pid file {} not written",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_parse_with_whitespace_and_nothing_else() {
        assert_eq!(parse("1234\n"), Some(1234));
        assert_eq!(parse(" 7 "), Some(7));
        for bad in ["", "0", "-5", "12a", "abc"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn missing_malformed_and_stale_files_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.pid");
        let err = send(&path, Command::Reload).unwrap_err();
        assert!(matches!(err, SignalError::Missing { .. }), "{err}");
        std::fs::write(&path, "garbage").unwrap();
        let err = send(&path, Command::Reload).unwrap_err();
        assert!(matches!(err, SignalError::Malformed { .. }), "{err}");
        // Above the kernel's pid_max (at most 2^22), so no such process.
        std::fs::write(&path, "2147483647\n").unwrap();
        let err = send(&path, Command::Stop).unwrap_err();
        assert!(err.to_string().contains("stale"), "{err}");
    }

    #[test]
    fn the_file_is_removed_only_while_it_is_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.pid");
        write(&path).unwrap();
        assert_eq!(read(&path).unwrap(), std::process::id() as i32);
        std::fs::write(&path, "1\n").unwrap();
        remove_if_ours(&path);
        assert!(path.exists(), "a successor's pid file stays");
        write(&path).unwrap();
        remove_if_ours(&path);
        assert!(!path.exists());
    }
}
