//! A real `redis-server` that speaks TLS only (`--port 0 --tls-port <p>`), with certificates
//! made at test time by [`super::tls::TestCa`], optionally requiring client certificates.
//! Readiness is polled with a TLS PING that trusts the test CA; killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::process_group::{own_group, stop_group};

use super::redis::free_port;
use super::require_tool;
use super::tls::{Issued, TestCa};

/// How long a server may take to answer PING over TLS after being spawned.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS-only Redis with its CA.
pub struct TlsRedis {
    port: u16,
    /// The CA that signed the server's certificate (and the client certificates it accepts).
    pub ca: TestCa,
    /// A client certificate signed by [`TlsRedis::ca`].
    pub client: Issued,
    dir: tempfile::TempDir,
    child: Child,
}

impl TlsRedis {
    /// Start one on a free loopback port; `require_client_cert` sets `--tls-auth-clients`.
    pub fn start(require_client_cert: bool) -> TlsRedis {
        require_tool("redis-server", "redis-server");
        let ca = TestCa::new("slidegate test redis CA");
        let server = ca.issue("redis", &["localhost", "127.0.0.1"]);
        let client = ca.issue("client", &["slidegate-client"]);
        let dir = tempfile::Builder::new()
            .prefix("slidegate-redis-tls-")
            .tempdir()
            .expect("create temp dir");
        let port = free_port(false);
        let auth = if require_client_cert { "yes" } else { "no" };
        let child = own_group(&mut Command::new("redis-server"))
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--tls-cert-file")
            .arg(&server.cert)
            .arg("--tls-key-file")
            .arg(&server.key)
            .arg("--tls-ca-cert-file")
            .arg(ca.ca_file())
            .args(["--tls-auth-clients", auth])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let mut redis = TlsRedis {
            port,
            ca,
            client,
            dir,
            child,
        };
        redis.wait_ready();
        redis
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("redis-server --tls-port exited ({status}): {}", self.log());
            }
            if self.ping().is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "TLS redis-server on {} did not answer PING within {START_TIMEOUT:?}: {}",
                self.port,
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server log (certificate errors show up here).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// `rediss://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }

    /// A synchronous client trusting the test CA, presenting the client certificate.
    pub fn client(&self) -> ::redis::Client {
        let read = |p: &PathBuf| std::fs::read(p).expect("read PEM");
        let certs = ::redis::TlsCertificates {
            client_tls: Some(::redis::ClientTlsConfig {
                client_cert: read(&self.client.cert),
                client_key: read(&self.client.key),
            }),
            root_cert: Some(read(&self.ca.ca_file())),
        };
        ::redis::Client::build_with_tls(self.url(), certs).expect("TLS client")
    }

    /// A connection for setup (e.g. `ACL SETUSER`) and inspection.
    pub fn connection(&self) -> ::redis::Connection {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to TLS redis")
    }

    fn ping(&self) -> ::redis::RedisResult<String> {
        let mut conn = self
            .client()
            .get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))?;
        ::redis::cmd("PING").query(&mut conn)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        stop_group(&mut self.child);
    }
}
