//! A real nginx (`/usr/sbin/nginx` or `nginx` on `PATH`) on a run-time loopback port, for tests
//! that compare slidegate's behaviour with nginx's byte for byte. Killed on drop.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process_group::{own_group, stop_group};

use super::ports::free_port;

/// A running nginx, its prefix directory (config, logs, temp paths) a temporary directory.
pub struct Nginx {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

/// The nginx binary: `nginx` on `PATH`, else `/usr/sbin/nginx`; panics with the install hint.
fn binary() -> PathBuf {
    let on_path = Command::new("nginx").arg("-v").output().is_ok();
    if on_path {
        return PathBuf::from("nginx");
    }
    let sbin = PathBuf::from("/usr/sbin/nginx");
    assert!(
        sbin.exists(),
        "this test needs nginx (apt-get install nginx-light); neither `nginx` nor /usr/sbin/nginx found"
    );
    sbin
}

impl Nginx {
    /// Start nginx (one worker, in the foreground, `TZ=UTC`) with one `server` listening on
    /// a free loopback port; `server_body` is that server block's content and `http_extra`
    /// more `http` lines. `@DIR@` in either is replaced by the prefix directory. Returns once
    /// the port accepts connections.
    pub fn start(http_extra: &str, server_body: &str) -> Nginx {
        let bin = binary();
        let dir = tempfile::Builder::new()
            .prefix("slidegate-nginx-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path().display().to_string();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
            .iter()
            .map(|m| format!("    {m}_temp_path {d}/{m};\n"))
            .collect();
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 64; }}\nhttp {{\n{temp}{}\n    server {{\n        \
             listen {addr};\n{}\n    }}\n}}\n",
            http_extra.replace("@DIR@", &d),
            server_body.replace("@DIR@", &d),
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = own_group(&mut Command::new(&bin))
            .args(["-p", &d, "-c"])
            .arg(&conf_path)
            .args(["-e", &format!("{d}/error.log"), "-g", "daemon off;"])
            .env("TZ", "UTC")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let mut nginx = Nginx { child, addr, dir };
        nginx.wait_listening();
        nginx
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "nginx exited ({status}): {}",
                    std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not listen on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its prefix directory (what `@DIR@` stood for).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // The workers are the master's children: SIGKILL to the master alone orphans them.
        stop_group(&mut self.child);
    }
}
