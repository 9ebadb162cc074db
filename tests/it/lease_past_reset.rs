//! A concurrency lease outlives a client's reset (issue 52 row 14), through the real binary.
//! The upstream keeps working on a request after the proxy closed its connection or reset its
//! stream ([`DETACHED_HEADER`], as an app that never checks its connection). A client sends N
//! requests of one key, gives up on each after 100 ms (HTTP/1.1: its socket closed; HTTP/2:
//! `RST_STREAM`) and sends again, for 3 s: the upstream never works on more than N of the key
//! at once, over HTTP/1.1, h2c and HTTP/2 over TLS, behind an HTTP/1.1 or an HTTP/2 upstream. A
//! lease is still given back within the upstream's `read_timeout` when the upstream takes longer
//! than that.

use crate::common;

use std::time::{Duration, Instant};

use common::config::h2_tls_upstream;
use common::fetch::{fetch_with, url};
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{ready_on_every_protocol, server_config, Protocol, TestCa};
use common::upstream::{Upstream, DELAY_HEADER, DETACHED_HEADER};

/// Requests in flight at once per key.
const N: u64 = 3;

/// A proxy (HTTP/1.1, h2c, TLS) in front of `up`, whose `read_timeout` is `read_timeout`;
/// `up` reached with HTTP/2 over TLS when `h2`.
fn proxy(up: &Upstream, ca: &TestCa, read_timeout: &str, h2: bool) -> Proxy {
    let mut lines = format!("read_timeout = \"{read_timeout}\"");
    if h2 {
        lines = format!("{lines}\n{}", h2_tls_upstream(&ca.ca_file()));
    }
    let config = ConfigBuilder::new()
        .store("backend = \"memory\"")
        .upstream_with("app", up.addr(), &lines)
        .route(
            "chat",
            &format!(
                "key = \"header:X-Client\"\n\
                 limits = [ {{ concurrent = {N}, lease_ttl = \"30s\" }} ]"
            ),
        )
        .build();
    ready_on_every_protocol(&config, ca, 1).remove(0)
}

/// N requests of `who` at once, each worked on `work_ms` upstream and given up on after 100 ms;
/// how many of them the proxy sent on (given up on, not denied).
async fn give_up_on_n(client: &reqwest::Client, target: &str, who: &str, work_ms: u64) -> u64 {
    let work = work_ms.to_string();
    let sent = (0..N).map(|_| {
        let request = (client.get(target).header("x-client", who))
            .header(DELAY_HEADER, work.as_str())
            .header(DETACHED_HEADER, "1")
            .timeout(Duration::from_millis(100));
        async move {
            match request.send().await {
                Err(e) if e.is_timeout() => 1,
                Ok(r) if r.status() == 429 => 0,
                other => panic!("{who}: {other:?}"),
            }
        }
    });
    futures::future::join_all(sent).await.into_iter().sum()
}

/// Poll until `who` is admitted (its leases given back), within `within`; how long it took.
async fn admitted_within(
    proxy: &Proxy,
    ca: &TestCa,
    p: Protocol,
    who: &str,
    within: Duration,
) -> Duration {
    let (client, start) = (p.client(&ca.ca_pem()), Instant::now());
    loop {
        let seen = fetch_with(
            &client,
            &url(proxy, p, "/"),
            &[("x-client", who)],
            p.version(),
        )
        .await;
        if seen.status == 200 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{who}: not admitted within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rounds of N given up on and sent again for 3 s, the upstream working 800 ms on each (inside
/// its 2 s `read_timeout`): how many were at the upstream at once, and how many were sent on.
async fn resets_and_sends_again(ca: &TestCa, p: Protocol, h2_upstream: bool) -> (u64, u64) {
    let up = match h2_upstream {
        true => Upstream::start_tls(server_config(&ca.issue("up", &["localhost"]))),
        false => Upstream::start(),
    };
    let proxy = proxy(&up, ca, "2s", h2_upstream);
    let (client, target, who) = (
        p.client(&ca.ca_pem()),
        url(&proxy, p, "/"),
        format!("{p:?}"),
    );
    let (start, mut sent) = (Instant::now(), 0);
    while start.elapsed() < Duration::from_secs(3) {
        sent += give_up_on_n(&client, &target, &who, 800).await;
        // Paces the rounds (a denial comes back at once); not a wait for readiness.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The leases come back once the upstream is done.
    admitted_within(&proxy, ca, p, &who, Duration::from_secs(3)).await;
    (up.max_in_flight(), sent)
}

/// Never more than N of the key at an HTTP/1.1 upstream, over every client protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_resets_and_sends_again_never_has_more_than_n_at_the_upstream() {
    let ca = TestCa::new("ca");
    let mut seen = Vec::new();
    for p in [Protocol::H1, Protocol::H2c, Protocol::H2Tls] {
        let (max, sent) = resets_and_sends_again(&ca, p, false).await;
        seen.push((p, max, sent));
    }
    eprintln!("most at the upstream at once, requests sent on (protocol, max, sent): {seen:?}");
    for (p, max, sent) in seen {
        assert!(
            max <= N,
            "{p:?}: {max} at the upstream at once (N = {N}), {sent} sent on"
        );
        assert!(sent >= N, "{p:?}: {sent} sent on");
    }
}

/// The same behind an HTTP/2 upstream (`h2 = true`), whose stream the proxy resets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_behind_an_h2_upstream() {
    let ca = TestCa::new("ca");
    let mut seen = Vec::new();
    for p in [Protocol::H1, Protocol::H2Tls] {
        let (max, sent) = resets_and_sends_again(&ca, p, true).await;
        seen.push((p, max, sent));
    }
    eprintln!("h2 upstream: (protocol, max, sent): {seen:?}");
    for (p, max, sent) in seen {
        assert!(
            max <= N,
            "{p:?}: {max} at the upstream at once (N = {N}), {sent} sent on"
        );
        assert!(sent >= N, "{p:?}: {sent} sent on");
    }
}

/// An upstream that works 10 s on a request the client gave up on: its lease is held no longer
/// than the upstream's `read_timeout` (1 s), over every protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_past_a_reset_ends_within_read_timeout() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let proxy = proxy(&up, &ca, "1s", false);
    for p in [Protocol::H1, Protocol::H2c, Protocol::H2Tls] {
        let (client, who) = (p.client(&ca.ca_pem()), format!("{p:?}"));
        let start = Instant::now();
        assert_eq!(
            give_up_on_n(&client, &url(&proxy, p, "/"), &who, 10_000).await,
            N
        );
        admitted_within(&proxy, &ca, p, &who, Duration::from_secs(3)).await;
        let freed = start.elapsed();
        eprintln!("{p:?}: admitted again {freed:?} after the requests given up on");
        assert!(
            freed < Duration::from_millis(1000 + 1000),
            "{p:?}: {freed:?}"
        );
    }
}
