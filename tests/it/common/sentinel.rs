//! Real Redis Sentinel for tests: a master, one replica (`--replicaof`) and three Sentinels
//! (`redis-server <conf> --sentinel`, quorum 2, `down-after-milliseconds 1000`), all on loopback
//! ports chosen at run time, each in its own temporary directory, killed on drop.
//!
//! Readiness is polled, never slept for: the replica's `INFO replication` says its link is up,
//! and every Sentinel names the master (`SENTINEL get-master-addr-by-name`), sees the replica and
//! the two other Sentinels, which a failover vote needs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::process_group::{own_group, stop_group};

use super::redis::{free_port, RedisServer};
use super::require_tool;
use ::redis::IntoConnectionInfo;
use slidegate::limiter::redis::{RedisNodes, RedisTarget, SentinelNodes};

/// The name the Sentinels monitor the master under.
pub const MASTER_NAME: &str = "sgmaster";
/// How long the whole set may take to be ready (Sentinels discover each other by hello
/// messages every 2 s).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Quorum, and `down-after-milliseconds`: a master silent this long is subjectively down.
const QUORUM: u32 = 2;
const DOWN_AFTER_MS: u64 = 1000;
/// Also the time before a failed failover is retried (twice this).
const FAILOVER_TIMEOUT_MS: u64 = 2000;

/// One `redis-server --sentinel` process.
struct SentinelProcess {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl SentinelProcess {
    /// Write a config monitoring `master_port` and start; waits until it answers PING.
    fn start(master_port: u16) -> SentinelProcess {
        let port = free_port(false);
        let dir = tempfile::Builder::new()
            .prefix("slidegate-sentinel-")
            .tempdir()
            .expect("create temp dir");
        let conf = dir.path().join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.path().display(),
            log = dir.path().join("sentinel.log").display(),
        );
        std::fs::write(&conf, text).expect("write sentinel.conf");
        let child = own_group(&mut Command::new("redis-server"))
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let mut sentinel = SentinelProcess {
            port,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        while sentinel.query::<String>(&mut ::redis::cmd("PING")).is_err() {
            if let Some(status) = sentinel.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "Sentinel on port {port} exited ({status}): {}",
                    sentinel.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "Sentinel on port {port} did not answer PING: {}",
                sentinel.log_tail()
            );
            thread::sleep(Duration::from_millis(10));
        }
        sentinel
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Send `cmd` on a fresh connection bounded to 500 ms.
    fn query<T: ::redis::FromRedisValue>(&self, cmd: &mut ::redis::Cmd) -> ::redis::RedisResult<T> {
        let client = ::redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))?;
        cmd.query(&mut conn)
    }

    /// The master's port as this Sentinel names it now.
    fn master_port(&self) -> Option<u16> {
        let mut cmd = ::redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(MASTER_NAME);
        let addr: Option<(String, u16)> = self.query(&mut cmd).ok()?;
        addr.map(|(_, port)| port)
    }

    /// `SENTINEL master <name>` as field → value.
    fn master_info(&self) -> std::collections::HashMap<String, String> {
        let mut cmd = ::redis::cmd("SENTINEL");
        cmd.arg("master").arg(MASTER_NAME);
        self.query(&mut cmd).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_group(&mut child);
        }
    }
}

/// A master, its replica and three Sentinels watching them.
pub struct SentinelSet {
    /// `[0]` starts as the master, `[1]` as its replica.
    servers: [RedisServer; 2],
    sentinels: Vec<SentinelProcess>,
}

impl SentinelSet {
    /// Start everything and wait until a failover could happen.
    pub fn start() -> SentinelSet {
        require_tool("redis-server", "redis-server");
        let master = RedisServer::start();
        let master_port = master.port().to_string();
        let replica = RedisServer::start_args(&["--replicaof", "127.0.0.1", &master_port]);
        let sentinels = (0..3)
            .map(|_| SentinelProcess::start(master.port()))
            .collect();
        let set = SentinelSet {
            servers: [master, replica],
            sentinels,
        };
        set.wait_ready();
        set
    }

    /// Poll until the replica is in sync and every Sentinel sees the master, the replica and
    /// the other two Sentinels.
    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let master = self.servers[0].port();
        loop {
            let info: String = ::redis::cmd("INFO")
                .arg("replication")
                .query(&mut self.servers[1].connection())
                .unwrap_or_default();
            let replica_up = info.contains("master_link_status:up");
            let sentinels_ready = self.sentinels.iter().all(|s| {
                let m = s.master_info();
                s.master_port() == Some(master)
                    && m.get("num-slaves").map(String::as_str) == Some("1")
                    && m.get("num-other-sentinels").map(String::as_str) == Some("2")
            });
            if replica_up && sentinels_ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Sentinel set not ready within {READY_TIMEOUT:?} (replica link up: \
                 {replica_up}); first Sentinel's log:\n{}",
                self.sentinels[0].log_tail()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The Sentinels' URLs, for `[store] urls`.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelProcess::url).collect()
    }

    /// A store target asking these Sentinels for the master (no credentials, database 0).
    pub fn redis_target(&self, timeout: Duration) -> RedisTarget {
        let sentinels = self.urls().into_iter().map(|u| u.into_connection_info());
        RedisTarget {
            nodes: RedisNodes::Sentinel(Box::new(SentinelNodes {
                sentinels: sentinels.collect::<Result<_, _>>().expect("valid urls"),
                master_name: MASTER_NAME.into(),
                master: ::redis::RedisConnectionInfo::default(),
            })),
            prefix: "sgtest".into(),
            timeout,
            tls: None,
        }
    }

    /// The `[store]` lines of a slidegate using this set.
    pub fn store_toml(&self) -> String {
        format!(
            "backend = \"redis_sentinel\"\nurls = {:?}\nmaster_name = \"{MASTER_NAME}\"",
            self.urls()
        )
    }

    /// The server that started as the master, and the one that started as its replica.
    pub fn servers(&self) -> &[RedisServer; 2] {
        &self.servers
    }

    /// SIGKILL the server that started as the master.
    pub fn kill_master(&mut self) {
        self.servers[0].kill();
    }

    /// A planned failover (`SENTINEL FAILOVER`), asked of the first Sentinel: the replica is
    /// promoted while the old master still runs (and answers as a master until Sentinel
    /// reconfigures it).
    pub fn failover(&self) {
        let client = ::redis::Client::open(self.sentinels[0].url()).expect("Sentinel URL");
        let mut conn = client.get_connection().expect("connect to a Sentinel");
        let mut cmd = ::redis::cmd("SENTINEL");
        cmd.arg("failover").arg(MASTER_NAME);
        let ok: String = cmd.query(&mut conn).expect("SENTINEL FAILOVER");
        assert_eq!(ok, "OK");
    }

    /// The master's port as a majority of the Sentinels names it now, if they agree.
    pub fn master_port(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(|s| s.master_port()).collect();
        let first = ports.iter().flatten().next().copied()?;
        let agree = ports.iter().filter(|p| **p == Some(first)).count();
        (agree as u32 >= QUORUM).then_some(first)
    }

    /// Poll until the Sentinels name the replica as master and it reports `role:master`;
    /// how long that took. Panics after `within`, with a Sentinel's log.
    pub fn wait_failover(&self, within: Duration) -> Duration {
        let start = Instant::now();
        let replica = &self.servers[1];
        loop {
            let role: String = ::redis::cmd("INFO")
                .arg("replication")
                .query(&mut replica.connection())
                .unwrap_or_default();
            if self.master_port() == Some(replica.port()) && role.contains("role:master") {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "no failover to port {} within {within:?}; first Sentinel's log:\n{}",
                replica.port(),
                self.sentinels[0].log_tail()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}
