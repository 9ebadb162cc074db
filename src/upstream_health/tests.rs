//! The pool's health on its own: names looked up again on the interval through a resolver
//! the test scripts (paused time), and passive ejection's counting.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::upstreams::peer::HttpPeer;

use super::{service, PoolHealth, Resolve, SERVER_UP};
use crate::config::{HostPort, UpstreamHealth, UpstreamSpec, UpstreamTimeouts};

/// Answers each look-up with the next scripted list (the last one once the script is done),
/// counting the calls.
struct Scripted {
    calls: AtomicUsize,
    answers: Mutex<VecDeque<std::io::Result<Vec<SocketAddr>>>>,
    last: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Resolve for Scripted {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        assert_eq!((host, port), ("app.internal", 8080));
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.answers.lock().unwrap().pop_front() {
            Some(Ok(addrs)) => {
                *self.last.lock().unwrap() = addrs.clone();
                Ok(addrs)
            }
            Some(Err(e)) => Err(e),
            None => Ok(self.last.lock().unwrap().clone()),
        }
    }
}

fn addr(last: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, last], 8080))
}

fn spec(name: &str, health: UpstreamHealth) -> UpstreamSpec {
    let t = Duration::from_secs(1);
    UpstreamSpec {
        name: name.into(),
        servers: vec![HostPort {
            host: "app.internal".into(),
            port: 8080,
        }],
        timeouts: UpstreamTimeouts {
            connect: t,
            read: t,
            write: t,
            idle: t,
        },
        tls: None,
        h2: false,
        health,
    }
}

fn health(resolve_interval: Option<Duration>) -> UpstreamHealth {
    UpstreamHealth {
        check: None,
        max_fails: 2,
        fail_timeout: Duration::from_secs(10),
        resolve_interval,
    }
}

fn members(pool: &PoolHealth) -> Vec<SocketAddr> {
    let backends = pool.lb.backends().get_backend();
    backends
        .iter()
        .filter_map(|b| b.addr.as_inet().copied())
        .collect()
}

/// The gauge of `server` in `upstream`, if it has a series (reading never makes one).
fn gauge(upstream: &str, server: SocketAddr) -> Option<i64> {
    use prometheus::core::Collector;
    let server = server.to_string();
    let is = |m: &prometheus::proto::Metric, name: &str, value: &str| {
        (m.get_label().iter()).any(|l| l.name() == name && l.value() == value)
    };
    let families = SERVER_UP.collect();
    let found = (families.iter().flat_map(|f| f.get_metric()))
        .find(|m| is(m, "upstream", upstream) && is(m, "server", &server));
    found.map(|m| m.gauge.value() as i64)
}

#[tokio::test(start_paused = true)]
async fn names_are_looked_up_again_every_interval_and_the_pool_follows() {
    let resolver = Arc::new(Scripted {
        calls: AtomicUsize::new(0),
        answers: Mutex::new(VecDeque::from([
            Ok(vec![addr(1), addr(2)]),
            Err(std::io::Error::other("SERVFAIL")),
            Ok(vec![addr(2), addr(3)]),
        ])),
        last: Mutex::new(Vec::new()),
    });
    let spec = spec("resolved", health(Some(Duration::from_secs(30))));
    let template = HttpPeer::new(addr(1), false, String::new());
    let pool = PoolHealth::build(&spec, vec![vec![addr(1)]], template, resolver.clone());
    assert_eq!(members(&pool), [addr(1)]);
    assert_eq!(pool.size(), 1);
    tokio::spawn(service::resolves(
        Arc::downgrade(&pool),
        Duration::from_secs(30),
    ));

    let calls = || resolver.calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(calls(), 0, "not before the interval");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(calls(), 1);
    assert_eq!(members(&pool), [addr(1), addr(2)], "an address added");
    assert_eq!(pool.size(), 2);
    assert_eq!(gauge("resolved", addr(2)), Some(1));

    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(calls(), 2);
    assert_eq!(
        members(&pool),
        [addr(1), addr(2)],
        "a failed look-up keeps the last"
    );

    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(calls(), 3);
    assert_eq!(members(&pool), [addr(2), addr(3)], "one removed, one added");
    assert_eq!(
        gauge("resolved", addr(1)),
        None,
        "a removed server's series goes"
    );

    // The pool's last user gone (a reload replaced it): the look-ups stop.
    drop(pool);
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert_eq!(calls(), 3);
}

#[tokio::test]
async fn max_fails_failures_within_fail_timeout_eject_a_server_for_fail_timeout() {
    let resolver = Arc::new(super::SystemResolver);
    let mut settings = health(None);
    settings.fail_timeout = Duration::from_millis(200);
    let spec = spec("ejecting", settings);
    let template = HttpPeer::new(addr(1), false, String::new());
    let pool = PoolHealth::build(&spec, vec![vec![addr(1), addr(2)]], template, resolver);
    let up = |a| {
        pool.lb
            .select_with(b"", 8, |b, up| up && b.addr.as_inet() == Some(&a))
    };
    let error = "refused";
    pool.failed(addr(1), &error);
    assert!(up(addr(1)).is_some(), "one failure of max_fails = 2");
    pool.failed(addr(1), &error);
    assert!(up(addr(1)).is_none(), "ejected");
    assert!(up(addr(2)).is_some());
    assert_eq!(gauge("ejecting", addr(1)), Some(0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(up(addr(1)).is_some(), "back after fail_timeout");
    assert_eq!(gauge("ejecting", addr(1)), Some(1));
    // Failures further apart than fail_timeout never add up.
    pool.failed(addr(2), &error);
    tokio::time::sleep(Duration::from_millis(250)).await;
    pool.failed(addr(2), &error);
    assert!(up(addr(2)).is_some());
}
