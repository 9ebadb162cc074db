//! The process-wide bound on parked requests (issue 32 row 7: `[store].max_delayed`), through
//! the real binary over HTTP/1.1 and h2c: many clients each parking one request (each within
//! its own `max_queue`) never park more than `max_delayed` at once; the rest are answered at
//! once (429, counted in `slidegate_delay_refused_total`), and the parked ones are served when
//! room frees.

use crate::common;

use std::time::{Duration, Instant};

use common::arrivals::until_metric;
use common::config::assert_invalid;
use common::fetch::{fetch_with, url};
use common::proxy::{ConfigBuilder, Proxy};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

const MAX_DELAYED: usize = 12;
const CLIENTS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_requests_are_bounded_over_every_client() {
    let (up, ca) = (Upstream::start(), TestCa::new("ca"));
    let config = ConfigBuilder::new()
        .store(&format!(
            "backend = \"memory\"\nmax_delayed = {MAX_DELAYED}"
        ))
        .upstream("app", up.addr())
        .route(
            "api",
            "key = \"header:X-Client\"\nmax_delay = \"20s\"\nmax_queue = 1000\n\
             limits = [{ requests = 1, window = \"3s\" }]",
        )
        .build();
    let proxy = Proxy::start_with(&config, tls_options(&ca, "h2c = true"));
    let protocols = [Protocol::H1, Protocol::H2c];
    let clients: Vec<reqwest::Client> = protocols.iter().map(|p| p.client(&ca.ca_pem())).collect();
    let get = |i: usize| {
        let protocol = protocols[i % 2];
        let (client, url) = (clients[i % 2].clone(), url(&proxy, protocol, "/"));
        async move {
            let who = format!("client-{i}");
            let started = Instant::now();
            let seen = fetch_with(&client, &url, &[("x-client", &who)], protocol.version()).await;
            (seen.status, started.elapsed())
        }
    };
    // Every client takes its one request of the window.
    for i in 0..CLIENTS {
        assert_eq!(get(i).await.0, 200);
    }
    // Then each sends one more: room frees for it within max_delay, so each would park.
    let tasks: Vec<_> = (0..CLIENTS).map(|i| tokio::spawn(get(i))).collect();
    let waiting = "slidegate_requests_waiting";
    until_metric(&proxy, waiting, MAX_DELAYED as f64, Duration::from_secs(10)).await;
    let refused = (CLIENTS - MAX_DELAYED) as f64;
    until_metric(
        &proxy,
        "slidegate_delay_refused_total",
        refused,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(proxy.metric(waiting), Some(MAX_DELAYED as f64));
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let delayed = answers.iter().filter(|(s, _)| *s == 200).count();
    let at_once = answers
        .iter()
        .filter(|(s, took)| *s == 429 && *took < Duration::from_secs(2))
        .count();
    println!(
        "max_delayed {MAX_DELAYED}: {delayed} served after waiting, {at_once} refused at once"
    );
    assert_eq!(delayed, MAX_DELAYED, "{answers:?}");
    assert_eq!(at_once, CLIENTS - MAX_DELAYED, "{answers:?}");
    assert_eq!(proxy.decisions("api", "delayed"), MAX_DELAYED as u64);
    assert_eq!(proxy.metric(waiting), Some(0.0));
}

#[test]
fn a_bad_max_delayed_names_file_line_and_key() {
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n\
                [store]\nmax_delayed = 2000000\n";
    assert_invalid(text, "store.max_delayed", 5, "at most 1000000");
}
