//! A command run in a process group of its own, so a test can tell whether anything it started
//! is still running after it exits (background jobs of a non-interactive shell stay in the
//! shell's group), and stop all of it when the test ends.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the leader ended.
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output (and that of every process that shared it).
    pub stdout: String,
    /// Its standard error (likewise).
    pub stderr: String,
    /// Processes of the group still running when the leader had exited: `(pid, command line)`.
    pub survivors: Vec<(i32, String)>,
}

/// The running group; dropping it sends SIGKILL to every process left in it.
pub struct ProcessGroup {
    child: Child,
    /// The group id: the leader's pid.
    pgid: i32,
}

impl ProcessGroup {
    /// Start `cmd` as the leader of a new process group, its output captured.
    pub fn spawn(mut cmd: Command) -> ProcessGroup {
        let child = cmd
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the group leader");
        let pgid = child.id() as i32;
        ProcessGroup { child, pgid }
    }

    /// Wait for the leader to exit, at most `within` (then the group is killed and what it had
    /// printed returned as the error: a hung script shows where it hung). What was still
    /// running in the group the moment it exited is recorded, then killed.
    pub fn wait_leader(&mut self, within: Duration) -> Result<Finished, String> {
        let deadline = Instant::now() + within;
        // Read the pipes on threads, so a chatty leader never blocks on a full pipe.
        fn read(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
            std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_string(&mut text);
                }
                text
            })
        }
        let out = read(self.child.stdout.take());
        let err = read(self.child.stderr.take());
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let running = self.members();
                self.kill();
                return Err(format!(
                    "still running after {within:?}: {running:?}\n--- stdout\n{}--- stderr\n{}",
                    out.join().unwrap(),
                    err.join().unwrap()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let survivors = self.members();
        // The pipes close when every process holding them has exited, so survivors are
        // stopped before the output is read to its end.
        if !survivors.is_empty() {
            self.kill();
        }
        Ok(Finished {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
            survivors,
        })
    }

    /// Every live process in the group, as `(pid, command line)`, read from /proc.
    pub fn members(&self) -> Vec<(i32, String)> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if pid == self.pgid {
                // The reaped leader's pid is not reused while we run; a zombie leader is not
                // "still running".
                continue;
            }
            // SAFETY: getpgid only reads the process table.
            if unsafe { libc::getpgid(pid) } != self.pgid {
                continue;
            }
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // A zombie (state Z, after `) `) has exited; its parent has just not reaped it.
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
            {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim().to_string()));
        }
        found
    }

    /// SIGKILL to the whole group.
    pub fn kill(&self) {
        // SAFETY: a signal to our own group id; ESRCH (nothing left) is fine.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
        let _ = self.child.wait();
    }
}

/// Make `cmd` the leader of a process group of its own, so that [`stop_group`] reaches every
/// process it starts (nginx's workers, chromedriver's chromium), not only the leader.
pub fn own_group(cmd: &mut Command) -> &mut Command {
    cmd.process_group(0)
}

/// SIGKILL to the group `child` leads (started with [`own_group`]), then reap the leader: a
/// fixture's `Drop` leaves nothing running, not even children its leader would have orphaned.
pub fn stop_group(child: &mut Child) {
    // SAFETY: a signal to a group id we created; ESRCH (nothing left) is fine.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.kill();
    let _ = child.wait();
}
