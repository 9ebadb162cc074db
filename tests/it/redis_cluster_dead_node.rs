//! One dead Cluster master fails only its own slots (issue 52 row 5). A 3-master Cluster,
//! `on_error = "deny"`, 60 clients (20 whose bucket lives on each master) over ~100 h2c
//! connections; one master SIGKILLed mid-load. Clients on the two healthy masters must keep
//! being decided by the store (200 or 429, not 503) throughout, the dead master's clients get
//! `on_error` (503), and `/readyz` stays 200 while part of the slot space answers; once the
//! master is restarted, its clients are decided again. Real binary, real Cluster, real h2load.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::admin::wait_readyz;
use common::load::{h2load_paths_for, Burst, BurstResult};
use common::proxy::{http_get_blocking, ConfigBuilder, Proxy, ProxyOptions};
use common::redis::RedisCluster;
use common::upstream::Upstream;

/// Clients per master.
const CLIENTS: usize = 20;

/// Connections per master's h2load (3 × 33 ≈ the 100), streams each.
const CONNECTIONS: usize = 33;
const STREAMS: usize = 4;

/// Seconds of load while the master is killed, and after.
const DURING: u32 = 4;
const AFTER: u32 = 4;
/// Seconds of load once the master is back.
const BACK: u32 = 2;

/// Which master (index into `cluster.nodes()`) serves each hash slot, from `CLUSTER SLOTS`.
fn slot_owners(cluster: &RedisCluster) -> Vec<usize> {
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    let mut conn = cluster.nodes()[0].connection();
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).unwrap();
    let mut owner = vec![usize::MAX; 16384];
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            panic!("CLUSTER SLOTS entry {range:?}")
        };
        let int = |v: &redis::Value| match v {
            redis::Value::Int(i) => *i as usize,
            other => panic!("not an integer: {other:?}"),
        };
        let redis::Value::Array(master) = &fields[2] else {
            panic!("CLUSTER SLOTS master {:?}", fields[2])
        };
        let port = int(&master[1]) as u16;
        let node = ports.iter().position(|p| *p == port).unwrap();
        owner[int(&fields[0])..=int(&fields[1])].fill(node);
    }
    assert!(owner.iter().all(|n| *n != usize::MAX), "unassigned slots");
    owner
}

/// `CLIENTS` query values per master whose bucket (`api:q.u:<value>`, the hash tag of every key
/// of the route's client: docs/redis.md, Key layout) hashes to a slot of that master.
fn clients_per_master(cluster: &RedisCluster) -> Vec<Vec<String>> {
    let owner = slot_owners(cluster);
    let mut conn = cluster.nodes()[0].connection();
    let mut groups = vec![Vec::new(); cluster.nodes().len()];
    for i in 0.. {
        if groups.iter().all(|g: &Vec<String>| g.len() == CLIENTS) {
            break;
        }
        let value = format!("c{i}");
        let slot: usize = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("slidegate:{{api:q.u:{value}}}:60000"))
            .query(&mut conn)
            .unwrap();
        let group = &mut groups[owner[slot]];
        if group.len() < CLIENTS {
            group.push(value);
        }
    }
    groups
}

fn paths(values: &[String]) -> Vec<String> {
    values.iter().map(|v| format!("/?u={v}")).collect()
}

/// One h2load per master's clients, at once, for `seconds`; `during` runs beside them.
fn load_all(
    proxy: &Proxy,
    groups: &[Vec<String>],
    seconds: u32,
    during: impl FnOnce() + Send,
) -> Vec<BurstResult> {
    let addr = proxy.addr();
    std::thread::scope(|s| {
        let runs: Vec<_> = groups
            .iter()
            .map(|values| {
                let paths = paths(values);
                s.spawn(move || {
                    let burst = Burst {
                        connections: CONNECTIONS,
                        streams: STREAMS,
                        requests: 0,
                        headers: Vec::new(),
                        path: paths[0].clone(),
                    };
                    h2load_paths_for(addr, &burst, &paths[1..], seconds)
                })
            })
            .collect();
        during();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

fn total(r: &BurstResult) -> u64 {
    r.s2xx + r.s3xx + r.s4xx + r.s5xx + r.failed
}

/// Share of `r`'s requests the store decided (200 or 429).
fn decided(r: &BurstResult) -> f64 {
    (r.s2xx + r.s4xx) as f64 / total(r).max(1) as f64
}

fn error_counts(proxy: &Proxy) -> HashMap<&'static str, u64> {
    ["timeout", "unavailable", "backend"]
        .into_iter()
        .map(|k| {
            let sample = format!("slidegate_store_errors_total{{kind=\"{k}\"}}");
            (k, proxy.counter(&sample))
        })
        .collect()
}

#[test]
fn a_dead_master_fails_only_its_own_clients() {
    let _permit = common::heavy::heavy();
    let mut cluster = RedisCluster::start(3);
    let upstream = Upstream::start();
    let groups = clients_per_master(&cluster);
    let toml = ConfigBuilder::new()
        .store(&format!(
            // A 250 ms deadline, not the default 50 ms: at 4 test threads on 2 cores a healthy
            // master's decisions missed 50 ms for want of a core (8 % of them once), which is
            // this machine's load, not the dead master's reach.
            "backend = \"redis_cluster\"\nurls = {:?}\non_error = \"deny\"\ntimeout = \"250ms\"",
            cluster.urls()
        ))
        .upstream("app", upstream.addr())
        .route(
            "api",
            "key = \"query:u\"\nlimits = [ { requests = 1000000, window = \"1m\" } ]",
        )
        .build();
    let proxy = Proxy::start_with(&toml, ProxyOptions::h2c_two_threads());
    wait_readyz(&proxy, 200, Duration::from_secs(10));

    // Every client's keys are where the test thinks: on its group's master. (Not measured: a
    // cold proxy on a busy machine may miss a few 50 ms deadlines here.)
    let warm = load_all(&proxy, &groups, 1, || {});
    eprintln!("warm-up: {warm:?}");
    for (n, (node, group)) in cluster.nodes().iter().zip(&groups).enumerate() {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("slidegate:*")
            .query(&mut node.connection())
            .unwrap();
        // The top limited clients' keys (`slidegate:top:{api}:…`) are no bucket's.
        let keys: Vec<String> = keys.into_iter().filter(|k| !k.contains(":top:{")).collect();
        assert!(!keys.is_empty(), "master {n} holds no key");
        for key in keys {
            let value = key.split("q.u:").nth(1).unwrap().split('}').next().unwrap();
            assert!(group.iter().any(|v| v == value), "{key} on master {n}");
        }
    }

    // Redis's default (`yes`) makes every master refuse every key once the cluster marks the
    // dead one failed (`cluster-node-timeout`, 5 s here) until a replica takes its slots: no
    // proxy can decide then. This Cluster has no replica, so it serves what it still covers.
    for node in cluster.nodes() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query(&mut node.connection())
            .unwrap();
    }
    // Kill master 0 a second into the load.
    let dead = 0;
    let killed_at = std::sync::Mutex::new(None);
    let during = load_all(&proxy, &groups, DURING, || {
        std::thread::sleep(Duration::from_secs(1));
        cluster.nodes_mut()[dead].kill();
        *killed_at.lock().unwrap() = Some(Instant::now());
    });
    let readyz = std::sync::Mutex::new(Vec::new());
    let after = load_all(&proxy, &groups, AFTER, || {
        for _ in 0..AFTER * 4 {
            readyz.lock().unwrap().push(proxy.admin_get("/readyz").0);
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    let readyz = readyz.into_inner().unwrap();
    let errors = error_counts(&proxy);

    // The master comes back (empty, same address, its slots in nodes.conf): its clients are
    // decided again once its PING answers, the others never stopped.
    cluster.nodes_mut()[dead].restart();
    let restarted = Instant::now();
    let probe = format!("/?u={}", groups[dead][0]);
    let back = common::control::poll_until(Duration::from_secs(10), || {
        matches!(http_get_blocking(proxy.addr(), &probe), Ok((200, _)))
    });
    let again = load_all(&proxy, &groups, BACK, || {});

    for (phase, results) in [("during", &during), ("after", &after)] {
        for (n, r) in results.iter().enumerate() {
            eprintln!(
                "{phase}: master {n}{}: {} requests, {} 200, {} 429, {} 503, {} failed, \
                 decided {:.1} %",
                if n == dead { " (killed)" } else { "" },
                total(r),
                r.s2xx,
                r.s4xx,
                r.s5xx,
                r.failed,
                100.0 * decided(r)
            );
        }
    }
    eprintln!("store errors {errors:?}; /readyz after the kill: {readyz:?}");
    eprintln!(
        "restarted: its clients decided again after {back:?} (killed {:?} before the restart)",
        restarted - killed_at.lock().unwrap().unwrap()
    );
    for (n, r) in again.iter().enumerate() {
        eprintln!(
            "back: master {n}: {} requests, decided {:.1} %",
            total(r),
            100.0 * decided(r)
        );
    }
    let log = proxy.log();
    let store_lines: Vec<&str> = (log.lines())
        .filter(|l| l.contains("store") || l.contains("master"))
        .take(20)
        .collect();
    eprintln!("the proxy's store log lines:\n{}", store_lines.join("\n"));

    for (phase, results) in [("during", &during), ("after", &after)] {
        for (n, r) in results.iter().enumerate().filter(|(n, _)| *n != dead) {
            assert!(
                // Enough requests to read a share from (over 1000 on an idle machine; 522 with
                // three builds beside it), and 95 % of them decided.
                total(r) > 200 && decided(r) >= 0.95,
                "{phase}: healthy master {n}'s clients were not decided: {r:?}"
            );
        }
    }
    let gone = &after[dead];
    assert!(
        gone.s5xx as f64 >= 0.95 * total(gone) as f64,
        "after: the dead master's clients should get on_error (503): {gone:?}"
    );
    assert!(
        readyz.iter().all(|s| *s == 200),
        "/readyz while two of three masters answer: {readyz:?}"
    );
    assert!(
        back.is_some(),
        "the restarted master's clients were not decided within 10 s"
    );
    // Its return may pause the cluster connection (redis-rs refreshes its slots when it first
    // sends there again, and may stall until the store rebuilds it): 82-100 % measured over
    // seven runs. Asserted loosely: a connection that never delivers again fails it.
    for (n, r) in again.iter().enumerate() {
        assert!(
            decided(r) >= 0.5,
            "back: master {n}'s clients were not decided: {r:?}"
        );
    }
}
