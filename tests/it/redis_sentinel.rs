//! `[store] backend = "redis_sentinel"` for real: a master, a replica and three Sentinels
//! (`redis-server --sentinel`, quorum 2, `down-after-milliseconds 1000`) on loopback, two
//! slidegate processes sharing them, 30 clients under traffic, and the master SIGKILLed:
//!
//! - every request is answered within 1 s (the slowest is printed);
//! - during the gap the route's `on_error = "deny"` answers (503, counted as `error_denied`);
//! - a fresh bucket is exact again across both proxies within 15 s of the kill, with nothing
//!   restarted (the time is printed);
//! - no client is admitted more than its limit + 1 (writes the master acknowledged but had not
//!   yet replicated are the only excess; the excess seen is printed).
//!
//! And the config: `master_name` required here and refused elsewhere, with file:line:key, and
//! `slidegate -t` checks a Sentinel config without connecting to any Sentinel.

use crate::common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cli::check_config;
use common::proxy::{request, ConfigBuilder, Proxy};
use common::sentinel::SentinelSet;
use common::upstream::Upstream;

/// Per client, per hour: a window longer than the test, so "admitted in a window" is "admitted".
const LIMIT: usize = 20;
const CLIENTS: usize = 30;
/// Each client sends one request per this period, alternating between the proxies.
const PACE: Duration = Duration::from_millis(200);
/// The fresh-bucket probe's limit.
const PROBE_LIMIT: usize = 5;
/// Every request must be answered within this.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// Exact again within this of the kill.
const EXACT_WITHIN: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// The config.

/// A whole config file with `store` as the `[store]` table.
fn config_with_store(store: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:19090\"\n\n\
         [store]\n{store}\n\n[upstreams.app]\nservers = [\"127.0.0.1:3000\"]\n\n\
         [[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
         key = \"client_ip\"\nlimits = [ {{ requests = 10, window = \"1m\" }} ]\n"
    )
}

/// `slidegate -t -c <path>`: (success, stdout + stderr).
fn check(path: &Path) -> (bool, String) {
    let checked = check_config(path, &[]);
    (checked.ok, checked.output())
}

#[test]
fn sentinel_config_is_checked_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    // A "Sentinel" that would see any connection: `-t` must not make one.
    let sentinel = TcpListener::bind("127.0.0.1:0").unwrap();
    sentinel.set_nonblocking(true).unwrap();
    let url = format!("redis://user:secret@{}", sentinel.local_addr().unwrap());
    let good = format!(
        "backend = \"redis_sentinel\"\nurls = [\"{url}\"]\nmaster_name = \"m\"\n\
         master_username = \"app\"\nmaster_password = \"pw\"\ndb = 2"
    );
    let file = dir.path().join("good.toml");
    std::fs::write(&file, config_with_store(&good)).unwrap();
    let (ok, out) = check(&file);
    assert!(ok, "slidegate -t refused a Sentinel config: {out}");
    match sentinel.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("slidegate -t connected to the Sentinel: {other:?}"),
    }
    println!("valid: {}", out.trim());

    // (what, [store] lines, key, line of the key in the file, message part)
    let cases: [(&str, String, &str, &str, &str); 5] = [
        (
            "missing master_name",
            format!("backend = \"redis_sentinel\"\nurls = [\"{url}\"]"),
            "store.master_name",
            "backend = \"redis_sentinel\"",
            "required with backend = \"redis_sentinel\"",
        ),
        (
            "master_name on redis",
            "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nmaster_name = \"m\"".into(),
            "store.master_name",
            "master_name",
            "only used with backend = \"redis_sentinel\"",
        ),
        (
            "db on redis_cluster",
            "backend = \"redis_cluster\"\nurls = [\"redis://127.0.0.1:7000\"]\ndb = 1".into(),
            "store.db",
            "db = 1",
            "only used with backend = \"redis_sentinel\"",
        ),
        (
            "database in a Sentinel URL",
            "backend = \"redis_sentinel\"\nurls = [\"redis://127.0.0.1:26379/3\"]\n\
             master_name = \"m\""
                .into(),
            "store.urls[0]",
            "urls =",
            "set store.db",
        ),
        (
            "username without password",
            format!(
                "backend = \"redis_sentinel\"\nurls = [\"{url}\"]\nmaster_name = \"m\"\n\
                 master_username = \"app\""
            ),
            "store.master_username",
            "master_username",
            "needs store.master_password",
        ),
    ];
    for (what, store, key, line_of, message) in cases {
        let text = config_with_store(&store);
        let line = text.lines().position(|l| l.contains(line_of)).unwrap() + 1;
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, &text).unwrap();
        let (ok, out) = check(&file);
        assert!(!ok, "{what}: slidegate -t accepted it: {out}");
        let prefix = format!("{}:{line}: `{key}`: ", file.display());
        assert!(
            out.contains(&prefix) && out.contains(message),
            "{what}: {out:?} lacks {prefix:?} or {message:?}"
        );
        assert!(!out.contains("secret"), "{what}: a password in the output");
        println!("{what:<28} {}", out.trim());
    }
}

// ---------------------------------------------------------------------------------------------
// The failover.

/// What the clients saw.
#[derive(Default)]
struct Seen {
    /// Admissions per client.
    admitted: BTreeMap<usize, usize>,
    /// `503`s per client (the store could not answer).
    unavailable: BTreeMap<usize, usize>,
    /// Statuses, all clients.
    statuses: BTreeMap<u16, usize>,
    /// Statuses of requests sent after the kill and before the probe was exact.
    gap_statuses: BTreeMap<u16, usize>,
    slowest: Duration,
    /// The slowest answer to a request sent after the kill and before the probe was exact.
    slowest_in_gap: Duration,
    requests: usize,
}

/// One request with the 1 s answer bound asserted; status and latency.
async fn timed(addr: SocketAddr, path: &str, key: &str) -> (u16, Duration) {
    let start = Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        request(addr, "GET", path, &[("X-Api-Key", key)]),
    )
    .await;
    let took = start.elapsed();
    match reply {
        Ok(Ok(reply)) => (reply.status, took),
        Ok(Err(e)) => panic!("GET {path} ({key}) via {addr}: {e}"),
        Err(_) => panic!("GET {path} ({key}) via {addr}: no answer in 10 s"),
    }
}

/// Client `i` until `stop`: one request per [`PACE`], alternating proxies. Its statuses with
/// the time each request was sent and how long it took.
async fn client(
    i: usize,
    addrs: [SocketAddr; 2],
    stop: Arc<AtomicBool>,
    admitted: Arc<AtomicUsize>,
) -> Vec<(Instant, u16, Duration)> {
    let mut tick = tokio::time::interval(PACE);
    let mut out = Vec::new();
    let key = format!("client-{i}");
    for n in 0.. {
        tick.tick().await;
        if stop.load(Ordering::Acquire) || n > 10_000 {
            break;
        }
        let sent = Instant::now();
        let (status, took) = timed(addrs[(i + n) % 2], "/api/x", &key).await;
        if status == 200 {
            admitted.fetch_add(1, Ordering::AcqRel);
        }
        out.push((sent, status, took));
    }
    out
}

/// After the kill: a fresh bucket every 200 ms, [`PROBE_LIMIT`] + 3 requests alternating the
/// proxies, until exactly [`PROBE_LIMIT`] are admitted and the rest denied with 429. The time
/// from `killed` until then, and the probes that were not exact.
async fn time_to_exact(
    addrs: [SocketAddr; 2],
    killed: Instant,
) -> (Duration, Vec<BTreeMap<u16, usize>>) {
    let mut misses = Vec::new();
    for k in 0.. {
        assert!(
            killed.elapsed() < EXACT_WITHIN,
            "not exact within {EXACT_WITHIN:?} of the kill; probes {misses:?}"
        );
        let key = format!("probe-{k}");
        let mut statuses = BTreeMap::new();
        for n in 0..PROBE_LIMIT + 3 {
            let (status, took) = timed(addrs[n % 2], "/probe", &key).await;
            assert!(took < ANSWER_WITHIN, "probe answered in {took:?}");
            *statuses.entry(status).or_insert(0) += 1;
        }
        let exact = statuses.get(&200) == Some(&PROBE_LIMIT) && statuses.get(&429) == Some(&3);
        if exact {
            return (killed.elapsed(), misses);
        }
        misses.push(statuses);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_under_traffic_is_followed_to_the_promoted_replica() {
    let mut set = tokio::task::spawn_blocking(SentinelSet::start)
        .await
        .unwrap();
    let up = Upstream::start();
    let toml = failover_config(&set, &up);
    let proxies = [Proxy::start(&toml), Proxy::start(&toml)];
    for p in &proxies {
        common::admin::wait_readyz(p, 200, Duration::from_secs(10));
    }
    let addrs = [proxies[0].addr(), proxies[1].addr()];

    // Healthy: the probe is exact from the start.
    let (_, misses) = time_to_exact(addrs, Instant::now()).await;
    assert!(misses.is_empty(), "not exact before the kill: {misses:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Vec<Arc<AtomicUsize>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(client(i, addrs, stop.clone(), admitted[i].clone())))
        .collect();
    // About half the limit admitted before the kill, so the clients are mid-window.
    tokio::time::sleep(PACE * (LIMIT as u32 / 2)).await;
    let killed = Instant::now();
    tokio::task::block_in_place(|| set.kill_master());
    let set = Arc::new(set);
    let failover = {
        let set = set.clone();
        tokio::task::spawn_blocking(move || set.wait_failover(EXACT_WITHIN))
    };
    let (exact_after, misses) = time_to_exact(addrs, killed).await;
    let failover = failover.await.unwrap();
    // Until every client has reached its limit, then a few more rounds in which any excess
    // (a lost write) would show.
    let deadline = Instant::now() + EXACT_WITHIN;
    while admitted.iter().any(|a| a.load(Ordering::Acquire) < LIMIT) && Instant::now() < deadline {
        tokio::time::sleep(PACE).await;
    }
    tokio::time::sleep(PACE * 5).await;
    stop.store(true, Ordering::Release);

    let seen = tally(clients, killed, killed + exact_after).await;
    let error_denied: u64 = proxies
        .iter()
        .map(|p| p.decisions("api", "error_denied"))
        .sum();
    let most = seen.admitted.values().copied().max().unwrap_or(0);
    let least = (0..CLIENTS)
        .map(|i| seen.admitted.get(&i).copied().unwrap_or(0))
        .min()
        .unwrap();
    let excess: usize = seen
        .admitted
        .values()
        .map(|a| a.saturating_sub(LIMIT))
        .sum();
    println!(
        "Sentinel failover: the Sentinels named the replica {failover:?} after the kill, \
         exact again {exact_after:?} after the kill; probes not exact meanwhile: {misses:?}; \
         {} requests, slowest {:?} ({:?} during the gap); statuses {:?}, during the gap {:?}; \
         error_denied {error_denied}; admitted per client {least}..={most} of {LIMIT}, excess \
         {excess} in all",
        seen.requests, seen.slowest, seen.slowest_in_gap, seen.statuses, seen.gap_statuses,
    );
    assert!(
        seen.slowest < ANSWER_WITHIN,
        "slowest answer {:?}",
        seen.slowest
    );
    assert!(exact_after < EXACT_WITHIN);
    assert!(
        seen.gap_statuses.get(&503).copied().unwrap_or(0) > 0 && error_denied > 0,
        "on_error = \"deny\" never answered during the gap: {:?}, error_denied {error_denied}",
        seen.gap_statuses
    );
    assert!(
        most <= LIMIT + 1,
        "a client was admitted {most} times (limit {LIMIT})"
    );
    // A client sends one request at a time, so at most one was in flight when the master died:
    // the old master may have run its script (and the replica copied the entry) while the answer
    // was lost, a `503` to the client but a request counted. That one, and no other, may be
    // missing after recovery.
    for i in 0..CLIENTS {
        let admitted = seen.admitted.get(&i).copied().unwrap_or(0);
        let lost = seen.unavailable.get(&i).copied().unwrap_or(0).min(1);
        assert!(
            admitted + lost >= LIMIT,
            "client {i} was admitted only {admitted} of {LIMIT} after recovery ({lost} answer \
             possibly lost with the master)"
        );
    }
    for p in &proxies {
        assert!(
            p.log().contains("asking the Sentinels"),
            "no re-discovery logged:\n{}",
            p.log()
        );
    }
}

/// A planned failover (`SENTINEL FAILOVER`) leaves the old master running, and a master still
/// (Sentinel reconfigures it about 10 s later): the proxy follows the master the Sentinels name
/// within its once-a-second check, while the old one still answers as a master. Before, it kept
/// deciding on the old master until its demotion, and the promoted replica, which never saw
/// those writes, admitted each client's limit a second time (100 of 50 in the audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_is_followed_while_the_old_master_still_answers() {
    let set = tokio::task::spawn_blocking(SentinelSet::start)
        .await
        .unwrap();
    let up = Upstream::start();
    let proxy = Proxy::start(&failover_config(&set, &up));
    common::admin::wait_readyz(&proxy, 200, Duration::from_secs(10));
    let addr = proxy.addr();
    assert_eq!(timed(addr, "/api/x", "before").await.0, 200);
    let set = Arc::new(set);
    let promoted = {
        let set = set.clone();
        tokio::task::spawn_blocking(move || {
            set.failover();
            set.wait_failover(EXACT_WITHIN)
        })
    };
    promoted.await.unwrap();
    let is_master = |i: usize| {
        let mut conn = set.servers()[i].connection();
        let info: String = ::redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .unwrap();
        info.contains("role:master")
    };
    // A fresh key per request until one is decided on the promoted replica.
    let started = Instant::now();
    let mut followed = None;
    for n in 0..40 {
        let key = format!("after-{n}");
        let (status, _) = timed(addr, "/api/x", &key).await;
        let mut conn = set.servers()[1].connection();
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("*{key}*"))
            .query(&mut conn)
            .unwrap();
        if status == 200 && !keys.is_empty() {
            followed = Some((started.elapsed(), is_master(0)));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (after, old_still_master) = followed.expect("never decided on the promoted replica");
    assert!(after < Duration::from_secs(3), "followed after {after:?}");
    assert!(
        old_still_master,
        "the old master was demoted first: this run shows nothing about following the Sentinels"
    );
    assert!(
        proxy.log().contains("the Sentinels name a new master"),
        "{}",
        proxy.log()
    );
}

/// Two routes, both keyed by `X-Api-Key`, failing closed: `/api` for the clients, `/probe`
/// for the fresh-bucket probe.
fn failover_config(set: &SentinelSet, up: &Upstream) -> String {
    let limit = |n: usize| format!("limits = [ {{ requests = {n}, window = \"1h\" }} ]");
    ConfigBuilder::new()
        .store(&set.store_toml())
        .upstream("app", up.addr())
        .route(
            "api",
            &format!(
                "path_prefix = \"/api\"\nkey = \"header:X-Api-Key\"\non_error = \"deny\"\n{}",
                limit(LIMIT)
            ),
        )
        .route(
            "probe",
            &format!(
                "path_prefix = \"/probe\"\nkey = \"header:X-Api-Key\"\non_error = \"deny\"\n{}",
                limit(PROBE_LIMIT)
            ),
        )
        .build()
}

/// What the clients saw; "the gap" is `[killed, exact)`.
async fn tally(
    clients: Vec<tokio::task::JoinHandle<Vec<(Instant, u16, Duration)>>>,
    killed: Instant,
    exact: Instant,
) -> Seen {
    let mut seen = Seen::default();
    for (i, task) in clients.into_iter().enumerate() {
        for (sent, status, took) in task.await.unwrap() {
            seen.requests += 1;
            seen.slowest = seen.slowest.max(took);
            *seen.statuses.entry(status).or_insert(0) += 1;
            if sent >= killed && sent < exact {
                *seen.gap_statuses.entry(status).or_insert(0) += 1;
                seen.slowest_in_gap = seen.slowest_in_gap.max(took);
            }
            if status == 200 {
                *seen.admitted.entry(i).or_insert(0) += 1;
            }
            if status == 503 {
                *seen.unavailable.entry(i).or_insert(0) += 1;
            }
        }
    }
    seen
}
