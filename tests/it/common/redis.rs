//! Real Redis for tests: a standalone [`RedisServer`] and a [`RedisCluster`] of masters, each on
//! loopback ports chosen at run time, with its own temporary directory, killed on drop.
//!
//! A test starts its own Redis, so tests run in parallel without sharing state; a suite whose
//! cases never stop or freeze a server may share one per binary under per-case key prefixes
//! (`shared.rs`). Readiness is
//! polled (PING, `CLUSTER INFO`), never assumed after a sleep. Missing `redis-server` or
//! `redis-cli` is a panic with instructions: a skipped Redis test would read as a passing one.

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::require_tool;
use super::shared::{unique_prefix, Shared};
use ::redis::IntoConnectionInfo;
use slidegate::limiter::redis::{RedisNodes, RedisTarget};

/// How long a server may take to answer PING after being spawned.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster may take to agree on `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Cluster bus ports are `port + 10000`, so data ports stay below this.
const MAX_CLUSTER_PORT: u16 = 55535;

/// Ports handed out by this process, never handed out twice: the kernel may return a just-freed
/// ephemeral port to the next `bind(0)`, and two tests must not race for it.
fn taken() -> &'static Mutex<HashSet<u16>> {
    static TAKEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    TAKEN.get_or_init(Default::default)
}

/// A free loopback port; with `cluster_bus`, `port + 10000` is free too.
pub fn free_port(cluster_bus: bool) -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        if cluster_bus {
            if port >= MAX_CLUSTER_PORT {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port + 10000)).is_err() {
                continue;
            }
        }
        if taken().lock().unwrap().insert(port) {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// Send a signal with `kill(1)`: the test crate has no libc binding, and this runs rarely.
fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// One `redis-server` process, standalone or a cluster node.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    /// Extra arguments (cluster mode), kept to restart identically.
    extra: Vec<String>,
    /// Extra environment (a faked clock: `fake_clock.rs`), kept to restart identically.
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl RedisServer {
    /// Start a standalone Redis on a free loopback port (no persistence) and wait for PING.
    pub fn start() -> RedisServer {
        Self::start_with(false, &[])
    }

    /// Start a standalone Redis with `extra` arguments (e.g. `--replicaof 127.0.0.1 <port>`).
    pub fn start_args(extra: &[&str]) -> RedisServer {
        Self::start_with(false, extra)
    }

    /// Start a standalone Redis with `extra` arguments and `env` in its environment (e.g. a
    /// faked clock: [`super::fake_clock::env`]).
    pub fn start_env(extra: &[&str], env: &[(String, String)]) -> RedisServer {
        Self::start_with_env(false, extra, env)
    }

    /// Start a server; `cluster_bus` reserves `port + 10000` as well.
    fn start_with(cluster_bus: bool, extra: &[&str]) -> RedisServer {
        Self::start_with_env(cluster_bus, extra, &[])
    }

    /// [`RedisServer::start_with`] with `env` in the server's environment: a faked clock,
    /// which also needs [`super::fake_clock::REDIS_ARGS`] (added here, for every node of a
    /// Cluster too).
    fn start_with_env(cluster_bus: bool, extra: &[&str], env: &[(String, String)]) -> RedisServer {
        require_tool("redis-server", "redis-server");
        let faked: &[&str] = if env.is_empty() {
            &[]
        } else {
            &super::fake_clock::REDIS_ARGS
        };
        let mut last_error = String::new();
        // A port can still be grabbed by another process between our probe and redis' bind;
        // then try another one.
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port(cluster_bus),
                dir: tempfile::Builder::new()
                    .prefix("slidegate-redis-")
                    .tempdir()
                    .expect("create temp dir"),
                extra: extra.iter().chain(faked).map(|s| s.to_string()).collect(),
                env: env.to_vec(),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// Spawn `redis-server` on `self.port` and wait until it answers PING.
    fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited ({status}): {}",
                    self.port,
                    self.log_tail()
                ));
            }
            if self.ping() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {} did not answer PING within {START_TIMEOUT:?}: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// True when the server answers PING within 200 ms.
    fn ping(&self) -> bool {
        let Ok(client) = ::redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
        ::redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `[store]` lines of a slidegate using this server.
    pub fn store_toml(&self) -> String {
        format!("backend = \"redis\"\nurl = \"{}\"", self.url())
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Its working directory (holds `redis.log`, and `nodes.conf` for cluster nodes).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A redis-rs client for it.
    pub fn client(&self) -> ::redis::Client {
        ::redis::Client::open(self.url()).expect("valid url")
    }

    /// A new synchronous connection, for test setup and inspection. Tests inject faults
    /// (failovers, restarts, `CLIENT KILL`): a refused or reset connect is tried again, with a
    /// `PING` to prove the connection works, for up to 10 s.
    pub fn connection(&self) -> ::redis::Connection {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let attempt = self
                .client()
                .get_connection_with_timeout(Duration::from_secs(5))
                .and_then(|mut c| ::redis::cmd("PING").query::<String>(&mut c).map(|_| c));
            match attempt {
                Ok(conn) => return conn,
                Err(e) if Instant::now() >= deadline => {
                    panic!("connect to test redis on port {}: {e}", self.port)
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Completed calls of the sliding-window script (`EVALSHA`, or `EVAL`) since it started or
    /// the last `CONFIG RESETSTAT`. A call that failed (`NOSCRIPT` before redis-rs loads the
    /// script, then retries) is not counted.
    pub fn script_calls(&self) -> u64 {
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .expect("INFO commandstats");
        let field = |line: &str, name: &str| -> u64 {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .map(|l| field(l, "calls") - field(l, "failed_calls"))
            .sum()
    }

    /// Where a `RedisStore` for this server connects.
    pub fn redis_target(&self, timeout: Duration) -> RedisTarget {
        RedisTarget {
            nodes: RedisNodes::Single(Box::new(
                self.url().into_connection_info().expect("valid url"),
            )),
            prefix: "sgtest".into(),
            timeout,
            tls: None,
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: the server keeps its sockets but answers nothing (a hung Redis).
    pub fn freeze(&self) {
        signal(self.pid().expect("server is running"), "STOP");
    }

    /// SIGCONT after [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        signal(self.pid().expect("server is running"), "CONT");
    }

    /// SIGKILL and reap: connections are reset, the port is closed, data is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill (if running) and start again, empty, on the same port; waits for PING.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        // The old process is reaped, but give the kernel a moment if the port is still held.
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restart failed: {e}"),
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL works on a frozen process too.
        self.kill();
    }
}

/// A Redis Cluster of masters only (no replicas), all on loopback.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start `masters` (≥ 3) cluster-enabled servers, join them with
    /// `redis-cli --cluster create`, and wait until every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        Self::start_env(masters, &[])
    }

    /// [`RedisCluster::start`] with `env` in every node's environment (a faked clock).
    pub fn start_env(masters: usize, env: &[(String, String)]) -> RedisCluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        require_tool("redis-server", "redis-server");
        require_tool("redis-cli", "redis-tools");
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_with_env(
                    true,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                    env,
                )
            })
            .collect();
        let cluster = RedisCluster { nodes };
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port())),
            )
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok();
        cluster
    }

    /// Poll every node until it sees all nodes, all slots, and `cluster_state:ok`.
    fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let all_ok = self.nodes.iter().all(|node| {
                let mut conn = node.connection();
                let info: String = ::redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut conn)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&known)
            });
            if all_ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes, in port order of creation.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to the nodes (to freeze, kill or restart one).
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The `[store]` lines of a slidegate on this cluster under a key prefix no other test
    /// uses: what a test on the [`shared_cluster`] gives every proxy it starts.
    pub fn own_store(&self) -> String {
        format!(
            "backend = \"redis_cluster\"\nurls = {:?}\nprefix = \"{}\"",
            self.urls(),
            unique_prefix("cluster")
        )
    }

    /// Where a cluster `RedisStore` for these nodes connects.
    pub fn redis_target(&self, timeout: Duration) -> RedisTarget {
        let seeds = self.urls().into_iter().map(|u| u.into_connection_info());
        RedisTarget {
            nodes: RedisNodes::Cluster(seeds.collect::<Result<_, _>>().expect("valid urls")),
            prefix: "sgtest".into(),
            timeout,
            tls: None,
        }
    }

    /// A redis-rs cluster client for direct inspection.
    pub fn client(&self) -> ::redis::cluster::ClusterClient {
        ::redis::cluster::ClusterClient::new(self.urls()).expect("valid cluster urls")
    }
}

/// Drive `store.maintain()` (as the proxy's once-a-second task would, but faster) until the store
/// reports ready; panics after `within`.
pub async fn wait_ready(store: &dyn slidegate::limiter::Store, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        store.maintain().await;
        if store.is_ready() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} store not ready within {within:?}",
            store.backend()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The 3-master Cluster started once per test run and shared by the tests that only use it as
/// the store of their proxies (each under [`RedisCluster::own_store`]'s prefix): they never stop,
/// freeze, fail over or reconfigure a node. A test that does starts a Cluster of its own.
pub fn shared_cluster() -> Arc<RedisCluster> {
    static CLUSTER: Shared<Arc<RedisCluster>> = Shared::new();
    CLUSTER.with(|| Arc::new(RedisCluster::start(3)), Arc::clone)
}
