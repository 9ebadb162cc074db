//! Redis as operators secure it, end to end through the real binary: TLS with a private CA
//! (`store.ca_file`), client certificates (`--tls-auth-clients yes`), an ACL user with exactly
//! the commands slidegate needs, and one that lacks a command (not ready, an ERROR naming it,
//! ready again once granted, without a restart). Certificates are made at test time. And the
//! eviction policy: a Redis that may evict limit keys is warned about at start and by `-t`
//! (a log line, `slidegate_redis_eviction_policy_unsafe`); one whose policy cannot be read
//! (`CONFIG` not granted) is said once and still used.

use crate::common;

use std::time::{Duration, Instant};

use common::admin::{reset, wait_readyz, window};
use common::cli::check_config;
use common::control::poll_until;
use common::proxy::{get, ConfigBuilder, Proxy};
use common::redis::{RedisCluster, RedisServer};
use common::redis_tls::TlsRedis;
use common::tls::TestCa;
use common::upstream::Upstream;
use slidegate::limiter::redis::{REQUIRED_COMMANDS, TOP_COMMANDS};

/// How long a proxy may take to see its Redis (`maintain` runs once a second).
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A proxy in front of `up` with `store` lines and one route of 2 requests a minute.
fn proxy(up: &Upstream, store: &str) -> Proxy {
    let toml = ConfigBuilder::new()
        .store(store)
        .upstream("app", up.addr())
        .route(
            "api",
            "on_error = \"deny\"\nlimits = [ { requests = 2, window = \"1m\" } ]",
        )
        .build();
    Proxy::start(&toml)
}

/// The statuses of `n` requests in a row.
async fn statuses(proxy: &Proxy, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(proxy.addr(), "/").await.status);
    }
    out
}

/// Wait until a line of the proxy's log holds every one of `needles`; panics with the log
/// after `within`.
fn wait_log(proxy: &Proxy, needles: &[&str], within: Duration) -> String {
    let start = Instant::now();
    loop {
        let log = proxy.log();
        if let Some(line) = log.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_string();
        }
        assert!(
            start.elapsed() < within,
            "no log line with {needles:?} after {within:?}; log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `/readyz?store` stays 503 and a request gets `on_error = "deny"`'s 503.
async fn assert_not_ready(proxy: &Proxy) {
    // Two maintain periods: a store that was going to connect would have.
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_eq!(
            proxy.admin_get("/readyz?store").0,
            503,
            "log:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(proxy.addr(), "/").await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_and_decisions_work_over_tls() {
    let redis = TlsRedis::start(false);
    let up = Upstream::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nca_file = {:?}",
        redis.url(),
        redis.ca.ca_file()
    );
    let proxy = proxy(&up, &store);
    wait_readyz(&proxy, 200, READY_WITHIN);
    assert_eq!(statuses(&proxy, 3).await, [200, 200, 429]);
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("slidegate:*")
        .query(&mut redis.connection())
        .unwrap();
    // The bucket's; the top limited clients' keys (`slidegate:top:{…}:…`) may be there too.
    let keys: Vec<&String> = keys.iter().filter(|k| !k.contains(":top:{")).collect();
    assert_eq!(
        keys.len(),
        1,
        "the decision was recorded in the TLS Redis: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_leaves_the_store_not_ready_with_a_clear_log_line() {
    let redis = TlsRedis::start(false);
    let other = TestCa::new("not the redis CA");
    let up = Upstream::start();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nca_file = {:?}",
        redis.url(),
        other.ca_file()
    );
    let proxy = proxy(&up, &store);
    // A first attempt may time out on a loaded machine; then the certificate is named.
    let line = wait_log(&proxy, &["store not ready", "UnknownIssuer"], READY_WITHIN);
    eprintln!("wrong CA: {line}");
    assert_not_ready(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_requiring_client_certificates_takes_only_a_proxy_with_one() {
    let redis = TlsRedis::start(true);
    let up = Upstream::start();
    let base = format!(
        "backend = \"redis\"\nurl = \"{}\"\nca_file = {:?}",
        redis.url(),
        redis.ca.ca_file()
    );
    let without = proxy(&up, &base);
    let with = proxy(
        &up,
        &format!(
            "{base}\nclient_cert_file = {:?}\nclient_key_file = {:?}",
            redis.client.cert, redis.client.key
        ),
    );
    wait_readyz(&with, 200, READY_WITHIN);
    assert_eq!(statuses(&with, 3).await, [200, 200, 429]);
    let line = wait_log(&without, &["store not ready"], READY_WITHIN);
    assert_not_ready(&without).await;
    eprintln!("without a client certificate: {line}");
}

/// `ACL SETUSER app on >pw ~slidegate:* resetchannels -@all +<each of commands>`.
fn acl_user(redis: &RedisServer, commands: &[&str]) {
    let mut cmd = ::redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("app")
        .arg("reset")
        .arg("on")
        .arg(">pw")
        .arg("~slidegate:*")
        .arg("resetchannels")
        .arg("-@all");
    for c in commands {
        cmd.arg(format!("+{}", c.to_ascii_lowercase()));
    }
    let _: () = cmd.query(&mut redis.connection()).expect("ACL SETUSER");
}

/// The `[store]` lines of a proxy connecting as `app`.
fn as_app(redis: &RedisServer) -> String {
    format!(
        "backend = \"redis\"\nurl = \"redis://app:pw@127.0.0.1:{}/\"",
        redis.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_exactly_the_listed_commands_decides_and_inspects() {
    let redis = RedisServer::start();
    // Decisions' commands and the top limited clients' (issue 54).
    let commands: Vec<&str> = REQUIRED_COMMANDS
        .iter()
        .chain(TOP_COMMANDS)
        .copied()
        .collect();
    acl_user(&redis, &commands);
    let up = Upstream::start();
    let proxy = proxy(&up, &as_app(&redis));
    wait_readyz(&proxy, 200, READY_WITHIN);
    assert_eq!(statuses(&proxy, 3).await, [200, 200, 429]);
    let view = window(&proxy, "api", "127.0.0.1").await;
    assert!(view.to_string().contains("\"count\":2"), "{view}");
    reset(&proxy, "api", "127.0.0.1").await;
    assert_eq!(statuses(&proxy, 1).await, [200]);
    // A fold of the top limited clients (every 2 s) wrote the denial and `/api/v1/top` read
    // it back: waited for by what it shows, not by the fold counter, which a fold run between
    // the two admitted requests and the denial already raised (the denial then goes in the
    // next fold; `{"clients":[]}` after one fold, once, at 8 test threads on 2 cores).
    let mut top = String::new();
    let shown = poll_until(Duration::from_secs(10), || {
        let (status, body) = proxy.admin_get("/api/v1/top?route=api");
        top = body;
        status == 200 && top.contains("\"denied\":1")
    });
    assert!(shown.is_some(), "{top}");
    assert!(proxy.counter("slidegate_top_folds_total{result=\"ok\"}") >= 1);
    let denied: Vec<::redis::Value> = ::redis::cmd("ACL")
        .arg("LOG")
        .query(&mut redis.connection())
        .unwrap();
    // CONFIG GET maxmemory-policy is asked, not needed (see the eviction test below).
    let denied: Vec<String> = denied
        .iter()
        .map(|d| format!("{d:?}"))
        .filter(|d| !d.contains("config|get"))
        .collect();
    assert!(denied.is_empty(), "no command was denied: {denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_lacking_a_command_is_named_and_recovers_once_granted() {
    let redis = RedisServer::start();
    let lacking: Vec<&str> = REQUIRED_COMMANDS
        .iter()
        .copied()
        .filter(|c| *c != "RPUSH")
        .collect();
    acl_user(&redis, &lacking);
    let up = Upstream::start();
    let proxy = proxy(&up, &as_app(&redis));
    let line = wait_log(&proxy, &["may not run RPUSH"], READY_WITHIN);
    assert!(line.contains("ERROR"), "logged as an error: {line}");
    assert!(!line.contains("pw@"), "no password in the line: {line}");
    assert_not_ready(&proxy).await;
    // Granted at run time: ready again without a restart.
    acl_user(&redis, REQUIRED_COMMANDS);
    wait_readyz(&proxy, 200, READY_WITHIN);
    assert_eq!(statuses(&proxy, 3).await, [200, 200, 429]);
}

/// The sample of `slidegate_redis_eviction_policy_unsafe` once the store has connected.
fn eviction_gauge(proxy: &Proxy) -> f64 {
    wait_readyz(proxy, 200, READY_WITHIN);
    let sample = "slidegate_redis_eviction_policy_unsafe";
    proxy.metric(sample).expect("the gauge is exported")
}

/// Issue 52 row 4: every policy but `noeviction` lets Redis delete a limit key (all have a
/// TTL) under memory pressure, which opens the limit. At start the proxy reads
/// `maxmemory-policy` and warns (WARN line, gauge 1), and so does `-t` (still valid: exit 0);
/// `noeviction` gives no warning (gauge 0); an ACL user without `CONFIG` is said once (gauge
/// -1) and the store is used all the same. Before: nothing read, nothing said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_limit_keys_is_warned_about_at_start_and_by_dash_t() {
    let up = Upstream::start();
    let store = |r: &RedisServer| format!("backend = \"redis\"\nurl = \"{}\"", r.url());
    for policy in ["allkeys-lru", "volatile-lru"] {
        let redis = RedisServer::start_args(&["--maxmemory-policy", policy, "--maxmemory", "3mb"]);
        let proxy = proxy(&up, &store(&redis));
        assert_eq!(eviction_gauge(&proxy), 1.0, "{policy}");
        let line = wait_log(&proxy, &["maxmemory-policy is", policy], READY_WITHIN);
        assert!(
            line.contains("WARN") && line.contains("noeviction"),
            "{line}"
        );
        let checked = check_config(proxy.config_path(), &[]);
        assert!(checked.ok, "-t warns, never fails: {}", checked.output());
        assert!(
            checked.stderr.contains("warning") && checked.stderr.contains(policy),
            "-t: {}",
            checked.output()
        );
        println!("{policy}: {line}\n-t: {}", checked.stderr.trim());
    }
    let redis = RedisServer::start_args(&["--maxmemory-policy", "noeviction"]);
    let safe = proxy(&up, &store(&redis));
    assert_eq!(eviction_gauge(&safe), 0.0);
    wait_log(&safe, &["maxmemory-policy is noeviction"], READY_WITHIN);
    assert!(!safe.log().contains("may evict"), "{}", safe.log());
    let checked = check_config(safe.config_path(), &[]);
    assert!(
        checked.ok && !checked.stderr.contains("warning"),
        "{}",
        checked.output()
    );
    // CONFIG refused by the ACL: said once, never a reason to stay closed.
    acl_user(&redis, REQUIRED_COMMANDS);
    let acl = proxy(&up, &as_app(&redis));
    assert_eq!(eviction_gauge(&acl), -1.0);
    assert_eq!(statuses(&acl, 3).await, [200, 200, 429]);
    let said = acl
        .log()
        .matches("cannot read Redis maxmemory-policy")
        .count();
    assert_eq!(said, 1, "{}", acl.log());
    let checked = check_config(acl.config_path(), &[]);
    assert!(
        checked.ok
            && checked
                .stderr
                .contains("cannot read Redis maxmemory-policy"),
        "{}",
        checked.output()
    );
}

/// A Cluster is read on every master: one master of three that may evict is enough for the
/// warning (and the gauge), naming its policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cluster_master_that_may_evict_is_warned_about() {
    let cluster = RedisCluster::start(3);
    let _: () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-ttl")
        .query(&mut cluster.nodes()[1].connection())
        .expect("CONFIG SET");
    let up = Upstream::start();
    let store = format!("backend = \"redis_cluster\"\nurls = {:?}", cluster.urls());
    let proxy = proxy(&up, &store);
    assert_eq!(eviction_gauge(&proxy), 1.0);
    let line = wait_log(&proxy, &["maxmemory-policy is volatile-ttl"], READY_WITHIN);
    assert!(line.contains("WARN"), "{line}");
    let checked = check_config(proxy.config_path(), &[]);
    assert!(
        checked.ok && checked.stderr.contains("volatile-ttl"),
        "{}",
        checked.output()
    );
}
