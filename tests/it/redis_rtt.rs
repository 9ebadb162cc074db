//! A Redis one network hop away: the store's decisions through a delay proxy
//! (`tests/it/common/delay_proxy.rs`) at 1 ms and 5 ms round trips. A lane keeps a few calls in
//! flight (`src/limiter/redis/batch.rs`), so a decision waits about one round trip whatever the
//! concurrency, and decisions for one bucket still run in arrival order.
//!
//! Latency is compared with the PING round trip measured through the same proxy in the same
//! run, and what the hop *adds* is a decision's p50 through the proxy less its p50 with the same
//! callers on loopback (measured alternately, same store code, same Redis; the lowest p50 of a
//! few rounds each): so the assertions are about round trips, not about how fast this (shared,
//! 2-core, debug-build) machine is.

use crate::common;

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::delay_proxy::DelayProxy;
use common::redis::{wait_ready, RedisServer};
use common::store::{limit, ROUTE};
use redis::IntoConnectionInfo;
use slidegate::limiter::redis::{RedisNodes, RedisStore};
use slidegate::limiter::{Buckets, Limit, Store, Verdict};
use tokio::task::JoinHandle;

/// Roomy: this file is about round trips, not deadlines; a store timeout fails the test.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Added p50 of a decision, in round trips, at most (issue #19).
const MAX_P50_RTTS: f64 = 1.3;

/// Plus this share of the loopback p50: at 256 callers this debug build is CPU-bound on two
/// cores before any hop (its loopback p50 is 4-8 ms, 3-5 round trips of pure local queueing),
/// and that queueing varies between rounds by about a round trip; a clean run's added 0.94
/// round trips measured 1.51 under CI. With one caller the allowance is under 0.1 ms.
const LOCAL_NOISE_SHARE: f64 = 0.25;

/// Measurements per concurrency and setup; the least disturbed counts.
const ROUNDS: usize = 5;

/// A Redis and a delay proxy in front of it, `rtt / 2` each way.
fn redis_behind_proxy(rtt: Duration) -> (RedisServer, DelayProxy) {
    let server = RedisServer::start();
    let upstream: SocketAddr = ([127, 0, 0, 1], server.port()).into();
    let proxy = DelayProxy::start(upstream, rtt / 2);
    (server, proxy)
}

/// A connected store for `server`, reached through `proxy`, or directly without one.
async fn store_through(server: &RedisServer, proxy: Option<&DelayProxy>) -> Arc<RedisStore> {
    let mut target = server.redis_target(TIMEOUT);
    if let Some(proxy) = proxy {
        let url = format!("redis://{}/", proxy.addr());
        target.nodes = RedisNodes::Single(Box::new(url.into_connection_info().unwrap()));
    }
    let store = Arc::new(RedisStore::new(&target).unwrap());
    wait_ready(store.as_ref(), Duration::from_secs(10)).await;
    // The first call loads the script (NOSCRIPT, SCRIPT LOAD, again): not what is measured.
    let warm = store
        .check(ROUTE, &Buckets::one("warm-up"), &[roomy()])
        .await
        .unwrap();
    assert!(warm.admitted);
    store
}

/// A limit no test here reaches.
fn roomy() -> Limit {
    limit(1_000_000, Duration::from_secs(60))
}

/// The median of `samples`.
fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median PING round trip through `proxy` on a plain socket (RESP inline command): the
/// injected delay plus the proxy's and Redis's own time, nothing of a client library.
fn raw_ping_rtt(proxy: &DelayProxy) -> Duration {
    let mut conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.set_nodelay(true).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut samples: Vec<Duration> = (0..40)
        .map(|_| {
            let started = Instant::now();
            conn.write_all(b"PING\r\n").unwrap();
            let mut reply = [0; 7];
            conn.read_exact(&mut reply).unwrap();
            assert_eq!(&reply, b"+PONG\r\n");
            started.elapsed()
        })
        .collect();
    p50(&mut samples)
}

/// Median PING round trip through `proxy` as a Redis client sees it: redis-rs's multiplexed
/// connection, from this runtime. This is the baseline of "added latency": one round trip of
/// the client library the store uses.
async fn ping_rtt(proxy: &DelayProxy) -> Duration {
    let client = redis::Client::open(format!("redis://{}/", proxy.addr())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut samples = Vec::new();
    for _ in 0..40 {
        let started = Instant::now();
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        samples.push(started.elapsed());
        assert_eq!(pong, "PONG");
    }
    p50(&mut samples)
}

/// `callers` concurrent callers, each on its own bucket, each making `rounds` decisions one
/// after the other: the latency of every decision.
async fn decisions(
    store: &Arc<RedisStore>,
    callers: usize,
    rounds: usize,
    prefix: &str,
) -> Vec<Duration> {
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let store = store.clone();
            let bucket = format!("{prefix}:{i}");
            tokio::spawn(async move {
                let mut took = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    let started = Instant::now();
                    let verdict = store
                        .check(ROUTE, &Buckets::one(&bucket), &[roomy()])
                        .await
                        .unwrap();
                    took.push(started.elapsed());
                    assert!(verdict.admitted);
                }
                took
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// At 1, 64 and 256 concurrent callers, what the hop adds to a decision's p50 is within
/// [`MAX_P50_RTTS`] round trips (plus [`LOCAL_NOISE_SHARE`] of the loopback p50).
async fn latency_is_about_one_round_trip(rtt: Duration) {
    let (server, proxy) = redis_behind_proxy(rtt);
    let raw = raw_ping_rtt(&proxy);
    let ping = ping_rtt(&proxy).await;
    assert!(
        raw >= rtt,
        "PING round trip {raw:?} under the injected {rtt:?}"
    );
    let local = store_through(&server, None).await;
    let remote = store_through(&server, Some(&proxy)).await;
    let mut report = Vec::new();
    for (callers, rounds) in [(1, 40), (64, 20), (256, 8)] {
        // Back to back, a few times: other processes on the machine only ever add latency, and
        // the two of one round share the machine's state, so the round whose hop added least is
        // the least disturbed one (the least of each side, taken apart, could pair a quiet
        // loopback round with a busy one through the hop: it failed once beside the suite). A
        // hop that costs more shows in every round; the machine's noise, in some.
        let (mut near, mut far) = (Duration::ZERO, Duration::MAX);
        for _ in 0..ROUNDS {
            let n = p50(&mut decisions(&local, callers, rounds, "l").await);
            let f = p50(&mut decisions(&remote, callers, rounds, "r").await);
            if f.saturating_sub(n) < far.saturating_sub(near) {
                (near, far) = (n, f);
            }
        }
        let added = far.saturating_sub(near);
        let ratio = added.as_secs_f64() / ping.as_secs_f64();
        let allowed = MAX_P50_RTTS * ping.as_secs_f64() + LOCAL_NOISE_SHARE * near.as_secs_f64();
        println!(
            "rtt {rtt:?}: PING p50 {ping:?} (raw socket {raw:?}); {callers} callers: decision p50 \
             {far:?} through the proxy, {near:?} on loopback: added {added:?} = {ratio:.2} round trips"
        );
        report.push((callers, added, ratio, allowed));
    }
    for (callers, added, ratio, allowed) in report {
        assert!(
            added.as_secs_f64() <= allowed,
            "{callers} callers at {rtt:?}: added p50 {added:?} is {ratio:.2} PING round trips \
             ({ping:?}); allowed {MAX_P50_RTTS} round trips + {LOCAL_NOISE_SHARE} x the loopback p50 \
             = {:.2} ms",
            allowed * 1e3
        );
    }
}

#[test]
fn a_ping_through_the_delay_proxy_takes_at_least_two_delays() {
    let (_server, proxy) = redis_behind_proxy(Duration::from_millis(10));
    let rtt = raw_ping_rtt(&proxy);
    assert!(rtt >= 2 * proxy.delay(), "round trip {rtt:?}");
    assert!(rtt < Duration::from_millis(100), "round trip {rtt:?}");
}

/// The latency measurements run one at a time: two at once (the test harness runs a file's
/// tests in parallel) would each measure the other's load on this machine's two cores.
static ONE_MEASUREMENT_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_latency_is_about_one_round_trip_at_1ms() {
    let _alone = ONE_MEASUREMENT_AT_A_TIME.lock().await;
    let _permit = common::heavy::heavy();
    latency_is_about_one_round_trip(Duration::from_millis(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_latency_is_about_one_round_trip_at_5ms() {
    let _alone = ONE_MEASUREMENT_AT_A_TIME.lock().await;
    let _permit = common::heavy::heavy();
    latency_is_about_one_round_trip(Duration::from_millis(5)).await;
}

/// A verdict and how long it took.
type Timed = (Verdict, Duration);

/// A check future, boxed so it can be polled once by hand.
type Check = Pin<Box<dyn Future<Output = Timed> + Send>>;

/// Several calls in flight carry decisions for one bucket (limit N, 3N decisions, spaced so
/// that the first ones each leave in a call of their own while earlier ones travel): Redis runs
/// them in arrival order. Exactly the first N are admitted, the i-th with N - 1 - i remaining
/// (so the i-th admission is the i-th arrival, not merely one of the first N), and the log in
/// Redis holds N timestamps in order.
#[tokio::test(flavor = "current_thread")]
async fn decisions_for_one_bucket_in_flight_together_run_in_arrival_order() {
    const N: u32 = 10;
    let rtt = Duration::from_millis(10);
    let (server, proxy) = redis_behind_proxy(rtt);
    let ping = ping_rtt(&proxy).await;
    let store = store_through(&server, Some(&proxy)).await;
    let limits = [limit(N, Duration::from_secs(600))];

    let mut checks: Vec<Result<Timed, JoinHandle<Timed>>> = Vec::new();
    for i in 0..3 * N {
        let store = store.clone();
        let mut check: Check = Box::pin(async move {
            let started = Instant::now();
            let verdict = store
                .check(ROUTE, &Buckets::one("hot"), &limits)
                .await
                .unwrap();
            (verdict, started.elapsed())
        });
        // The first poll queues the decision in its lane: arrival order is this loop's order.
        // (Only a denial the lane already knows answers at once.)
        match std::future::poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx))).await {
            Poll::Ready(done) => {
                assert!(i >= N, "arrival {i} answered without a round trip");
                checks.push(Ok(done));
            }
            // Spawned, so it is polled (and its latency read) as soon as it is answered.
            Poll::Pending => checks.push(Err(tokio::spawn(check))),
        }
        // Spacing, not waiting for readiness: about 1 ms between arrivals (tokio's timer
        // resolution), so the first few leave one per call while earlier ones are in flight.
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let mut verdicts = Vec::new();
    for check in checks {
        verdicts.push(match check {
            Ok(done) => done,
            Err(waiting) => waiting.await.unwrap(),
        });
    }

    for (i, (verdict, _)) in verdicts.iter().enumerate() {
        let i = i as u32;
        if i < N {
            assert!(verdict.admitted, "arrival {i} denied: {verdicts:?}");
            assert_eq!(
                verdict.states[0].remaining,
                N - 1 - i,
                "arrival {i} did not run {i}th: {verdicts:?}"
            );
        } else {
            assert!(!verdict.admitted, "arrival {i} admitted: {verdicts:?}");
        }
    }
    // Calls overlapped in flight: arrivals 1 and 2 came ~1 and ~2 ms after arrival 0, while its
    // call travelled (10 ms), and one of them at least was answered in well under two round
    // trips (one call at a time would have made each wait for that call, then for its own:
    // about two). The fastest of the two, so that one scheduling hiccup on a busy machine does
    // not decide; and against the slower of the PING and arrival 0's own wait (one round trip
    // taken under the same load as theirs), so that a machine busy with other work does not
    // either: one call at a time would still put them near two of those.
    let fastest = verdicts[1].1.min(verdicts[2].1);
    let one_trip = ping.max(verdicts[0].1);
    assert!(
        fastest.as_secs_f64() < 1.5 * one_trip.as_secs_f64(),
        "arrivals 1 and 2 took {:?} and {:?}; arrival 0 {:?}, PING round trip {ping:?}",
        verdicts[1].1,
        verdicts[2].1,
        verdicts[0].1
    );

    let mut conn = server.connection();
    let log: Vec<u64> = redis::cmd("LRANGE")
        .arg(store.key("hot", &limits[0]))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(log.len(), N as usize, "one entry per admission: {log:?}");
    assert!(log.is_sorted(), "the log is in arrival order: {log:?}");
}
