//! `[store] state_file` (issue 55 item 3): the memory store's windows survive a restart
//! (SIGTERM, then a new process) and a zero-downtime upgrade (`-u`, SIGQUIT): a login bucket at
//! 5 of 5 is still refused by the next process, over HTTP/1.1, h2c and HTTP/2 over TLS, and
//! frees when its window would have; a file that is not one is refused with a log line naming
//! it and the reason, and the process starts empty.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use common::config::ConfigBuilder;
use common::kept::Kept;
use common::proxy::{Proxy, ProxyOptions};
use common::tls::{tls_options, Protocol, TestCa};
use common::upstream::Upstream;

const PROTOCOLS: [Protocol; 3] = [Protocol::H1, Protocol::H2c, Protocol::H2Tls];

/// A login route of 5 requests per `window`, one bucket per `X-User`, its windows in `state`.
fn config(up: &Upstream, state: &Path, window: &str) -> String {
    ConfigBuilder::new()
        .store(&format!(
            "backend = \"memory\"\nstate_file = {:?}",
            state.display().to_string()
        ))
        .upstream("app", up.addr())
        .route(
            "login",
            &format!(
                "path_prefix = \"/login\"\nkey = \"header:X-User\"\n\
                 limits = [{{ requests = 5, window = \"{window}\" }}]"
            ),
        )
        .build()
}

/// The status of `GET /login` for `user` on a new connection of `protocol`.
async fn login(proxy: &Proxy, ca: &TestCa, protocol: Protocol, user: &str) -> u16 {
    let mut conn = Kept::open(proxy, protocol, &ca.ca_pem()).await;
    let reply = conn
        .send("GET", "/login", &[("x-user", user)], bytes::Bytes::new())
        .await;
    reply.unwrap_or_else(|e| panic!("{protocol:?}: {e}")).status
}

/// Each protocol's user to 5 of 5 (and refused once more); when each one's first request
/// was sent.
async fn fill(proxy: &Proxy, ca: &TestCa) -> Vec<Instant> {
    let mut firsts = Vec::new();
    for p in PROTOCOLS {
        firsts.push(Instant::now());
        let user = format!("user-{p:?}");
        for i in 0..5 {
            assert_eq!(login(proxy, ca, p, &user).await, 200, "{p:?} request {i}");
        }
        assert_eq!(login(proxy, ca, p, &user).await, 429, "{p:?} 6th");
    }
    firsts
}

/// Every user is refused by `proxy` (on its own protocol and on another), until each gets
/// 200 again; how long after its first request each one was freed. Panics after `bound`.
async fn refused_until_freed(
    proxy: &Proxy,
    ca: &TestCa,
    firsts: &[Instant],
    bound: Duration,
) -> Vec<Duration> {
    for (i, p) in PROTOCOLS.iter().enumerate() {
        let user = format!("user-{p:?}");
        assert_eq!(
            login(proxy, ca, *p, &user).await,
            429,
            "{p:?}: {}",
            proxy.log()
        );
        let other = PROTOCOLS[(i + 1) % 3];
        assert_eq!(
            login(proxy, ca, other, &user).await,
            429,
            "{p:?} via {other:?}"
        );
    }
    let mut freed = Vec::new();
    for (p, first) in PROTOCOLS.iter().zip(firsts) {
        let user = format!("user-{p:?}");
        while login(proxy, ca, *p, &user).await != 200 {
            assert!(
                first.elapsed() < bound,
                "{p:?} still refused {:?} on",
                first.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        freed.push(first.elapsed());
    }
    freed
}

fn state_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("windows.state")
}

fn options(ca: &TestCa) -> ProxyOptions {
    tls_options(ca, "h2c = true")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_bucket_at_its_limit_stays_refused_across_a_restart_and_frees_with_its_window() {
    let (up, ca, dir) = (
        Upstream::start(),
        TestCa::new("ca"),
        tempfile::tempdir().unwrap(),
    );
    let state = state_path(&dir);
    let config = config(&up, &state, "8s");
    let mut a = Proxy::start_with(&config, options(&ca));
    assert!(
        a.log().contains("none yet, starting with empty windows"),
        "{}",
        a.log()
    );
    let firsts = fill(&a, &ca).await;
    a.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    a.signal(libc::SIGTERM).unwrap();
    assert!(a
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    assert!(a.log().contains("3 buckets (15 entries"), "{}", a.log());

    let b = Proxy::start_with(&config, options(&ca));
    let read = format!(
        "state file {}: 3 buckets read (15 counted)",
        state.display()
    );
    assert!(b.log().contains(&read), "{}", b.log());
    let restarted = firsts[0].elapsed();
    assert_eq!(login(&b, &ca, Protocol::H2Tls, "someone-else").await, 200);
    let freed = refused_until_freed(&b, &ca, &firsts, Duration::from_secs(20)).await;
    println!("restarted {restarted:?} after the first admission; freed {freed:?} (8 s window)");
    for f in freed {
        assert!(
            f >= Duration::from_secs(8),
            "freed {f:?}: before its window"
        );
        assert!(f < Duration::from_secs(10), "freed {f:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_downtime_upgrade_hands_the_windows_to_the_new_process() {
    let (up, ca, dir) = (
        Upstream::start(),
        TestCa::new("ca"),
        tempfile::tempdir().unwrap(),
    );
    let state = state_path(&dir);
    // Pingora keeps the old process accepting 5 s after SIGQUIT, then its grace period (1 s):
    // the window outlasts that, so the new process is asked alone while the bucket is full.
    // A shutdown_delay is SIGTERM's alone: the upgrade must not wait it.
    let config = config(&up, &state, "12s");
    let mut opts = options(&ca);
    opts.server_extra.push_str("\nshutdown_delay = \"30s\"");
    let mut a = Proxy::start_with(&config, opts.clone());
    let firsts = fill(&a, &ca).await;
    a.wait_signal_handler(libc::SIGQUIT, Duration::from_secs(10));
    let mut b = a.spawn_upgrade(&opts);
    a.signal(libc::SIGQUIT).unwrap();
    b.wait_upgraded(Duration::from_secs(30));
    assert!(
        a.wait_exit(Duration::from_secs(15)).is_some(),
        "{}",
        a.log()
    );
    let old = a.log();
    assert!(
        old.contains("written before handing the sockets over (SIGQUIT)"),
        "{old}"
    );
    assert!(
        !old.contains("written at exit"),
        "the old process wrote again: {old}"
    );
    let read = format!(
        "state file {}: 3 buckets read (15 counted)",
        state.display()
    );
    assert!(b.log().contains(&read), "{}", b.log());
    let old_gone = firsts[2].elapsed();
    let freed = refused_until_freed(&b, &ca, &firsts, Duration::from_secs(25)).await;
    println!("old process gone {old_gone:?} after the last user's first request; freed {freed:?} (12 s window)");
    assert!(
        old_gone < Duration::from_secs(11),
        "the test asked the new process too late"
    );
    for f in freed {
        assert!(
            f >= Duration::from_secs(12),
            "freed {f:?}: before its window"
        );
        assert!(f < Duration::from_secs(14), "freed {f:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_one_is_refused_and_the_process_starts_empty() {
    let (up, ca, dir) = (
        Upstream::start(),
        TestCa::new("ca"),
        tempfile::tempdir().unwrap(),
    );
    let state = state_path(&dir);
    let config = config(&up, &state, "1m");
    let mut future = b"SLGWSTAT".to_vec();
    future.extend_from_slice(&9u32.to_le_bytes());
    future.extend_from_slice(&[0; 40]);
    let cases: [(&[u8], &str); 3] = [
        (b"[server]\nlisten = 1\n", "not a slidegate state file"),
        (
            &future,
            "format version 9, but this slidegate reads version 1 only",
        ),
        (b"SLGWSTAT\x01\x00", "cut short"),
    ];
    for (bytes, why) in cases {
        std::fs::write(&state, bytes).unwrap();
        let proxy = Proxy::start_with(&config, options(&ca));
        let line = format!("state file {} refused: {why}", state.display());
        assert!(proxy.log().contains(&line), "{line:?} in\n{}", proxy.log());
        assert!(proxy.log().contains("starting with empty windows"));
        for p in PROTOCOLS {
            assert_eq!(login(&proxy, &ca, p, "u").await, 200, "{p:?}: {why}");
        }
    }
}
