//! Running it like nginx, through the real binary: the pid file (written once the listeners are
//! bound, removed at exit), `-s reload|stop` through it, `-T` (the effective configuration,
//! secrets redacted, accepted again by `-t`), SIGTERM that exits once the last connection
//! closes, and a `listen` edit on reload counted as `needs_restart`.

use crate::common;

use std::time::{Duration, Instant};

use common::cli::check_config;
use common::control::{poll_until, slidegate};
use common::proxy::{free_port, get, request, ConfigBuilder, Proxy, ProxyOptions};
use common::upstream::{Upstream, DELAY_HEADER, UPSTREAM_BODY};

/// `slidegate_config_reloads_total{result}` (0 while the series does not exist yet).
fn reloads(proxy: &Proxy, result: &str) -> u64 {
    let sample = format!(r#"slidegate_config_reloads_total{{result="{result}"}}"#);
    proxy.metric(&sample).unwrap_or(0.0) as u64
}

/// The pid file holds the process's pid while it runs; `-s stop` (SIGTERM through it) stops
/// it and the file is gone after the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_file_is_written_at_start_and_s_stop_removes_it() {
    let up = Upstream::start();
    let mut proxy = Proxy::start(&ConfigBuilder::unlimited(up.addr()));
    let pid_file = proxy.dir().join("slidegate.pid");
    let appeared = poll_until(Duration::from_secs(10), || pid_file.exists())
        .unwrap_or_else(|| panic!("no pid file; log:\n{}", proxy.log()));
    let text = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(text.trim(), proxy.pid().to_string());
    assert!(proxy.log().contains("written to"), "{}", proxy.log());

    proxy.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    let sent = Instant::now();
    let out = slidegate(&["-s", "stop"], proxy.config_path(), &[]);
    assert!(out.ok, "{}", out.output());
    let status = proxy
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running after -s stop; log:\n{}", proxy.log()));
    let took = sent.elapsed();
    println!("pid file present {appeared:?} after ready; -s stop: exit {status} after {took:?}");
    assert_eq!(status.code(), Some(0));
    assert!(!pid_file.exists(), "the pid file outlived the process");
}

/// `-s reload` sends SIGHUP through the pid file; a missing or stale pid file is an error that
/// says which, with exit code 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_reload_signals_through_the_pid_file_and_missing_or_stale_files_are_errors() {
    let up = Upstream::start();
    let proxy = Proxy::start(&ConfigBuilder::unlimited(up.addr()));
    let pid_file = proxy.dir().join("slidegate.pid");
    poll_until(Duration::from_secs(10), || pid_file.exists()).expect("pid file");
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));
    let out = slidegate(&["-s", "reload"], proxy.config_path(), &[]);
    assert!(out.ok, "{}", out.output());
    poll_until(Duration::from_secs(10), || reloads(&proxy, "ok") == 1)
        .unwrap_or_else(|| panic!("no reload; log:\n{}", proxy.log()));

    // The same config with another pid file: missing, then stale.
    let other = proxy.dir().join("other.toml");
    let elsewhere = proxy.dir().join("elsewhere.pid");
    let text = std::fs::read_to_string(proxy.config_path()).unwrap();
    let text = text.replace(&format!("{pid_file:?}"), &format!("{elsewhere:?}"));
    std::fs::write(&other, text).unwrap();
    let out = slidegate(&["-s", "reload"], &other, &[]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("cannot read pid file"),
        "{}",
        out.output()
    );
    // Above any kernel's pid_max (at most 2^22): a process that is gone.
    std::fs::write(&elsewhere, "2147483647\n").unwrap();
    let out = slidegate(&["-s", "stop"], &other, &[]);
    assert!(!out.ok);
    assert!(out.stderr.contains("is stale"), "{}", out.output());
    assert_eq!(reloads(&proxy, "ok"), 1, "no other reload happened");
}

/// `-T` prints every default, never a secret (from the file, from `${ENV}`, from a
/// `password_file`), and what it prints passes `-t` and prints the same again.
#[test]
fn dash_t_upper_prints_defaults_without_secrets_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("redis.pass");
    std::fs::write(&password_file, "file-pass-77\n").unwrap();
    let config = dir.path().join("slidegate.toml");
    let store = format!(
        "backend = \"redis\"\nurl = \"redis://app:${{PW}}@127.0.0.1:6379/0\"\n\
         password_file = {password_file:?}"
    );
    let rest = ConfigBuilder::new()
        .store(&store)
        .upstream("app", "127.0.0.1:3000")
        .route("all", "")
        .build();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\n\
         admin_token = \"${{TOKEN}}\"\n\n{rest}",
        free_port(),
        free_port(),
    );
    std::fs::write(&config, toml).unwrap();
    let env = [("TOKEN", "token-from-env-42-long"), ("PW", "env-pass-99")];
    let out = slidegate(&["-T"], &config, &env);
    assert!(out.ok, "{}", out.output());
    let printed = &out.stdout;
    for secret in ["token-from-env-42-long", "env-pass-99", "file-pass-77"] {
        assert!(!printed.contains(secret), "-T printed {secret}:\n{printed}");
    }
    let cores = std::thread::available_parallelism().unwrap().get();
    for want in [
        "admin_token = \"REDACTED-admin-token\"".to_string(),
        "url = \"redis://app:REDACTED@127.0.0.1:6379/0\"".into(),
        "threads = \"auto\"".into(),
        format!("runs {cores} proxy thread(s)"),
        "grace_period = \"5s\"".into(),
        "client_header_timeout = \"10s\"".into(),
        "max_memory = \"256MB\"".into(),
        "timeout = \"50ms\"".into(),
        "on_error = \"local\"".into(),
        "deny_status = 429".into(),
        "pid_file = ".into(),
        "connect_timeout = \"5s\"".into(),
    ] {
        assert!(printed.contains(&want), "want {want:?} in:\n{printed}");
    }
    let again = dir.path().join("printed.toml");
    std::fs::write(&again, printed).unwrap();
    let checked = check_config(&again, &[]);
    assert!(
        checked.ok,
        "-t refuses -T's output: {}\n{printed}",
        checked.output()
    );
    let second = slidegate(&["-T"], &again, &[]);
    assert!(second.ok, "{}", second.output());
    // The same settings (keys derived the first time are written the second: order differs).
    let parsed = |t: &str| t.parse::<toml::Table>().expect("-T prints TOML");
    assert_eq!(
        parsed(&second.stdout),
        parsed(printed),
        "-T of -T's output differs"
    );
    println!(
        "-T: {} lines, round trip: the same settings",
        printed.lines().count()
    );
}

/// SIGTERM on an idle proxy with a 30 s grace period exits within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_an_idle_proxy_exits_at_once_despite_a_long_grace_period() {
    let up = Upstream::start();
    let opts = ProxyOptions {
        grace_period: "30s",
        ..ProxyOptions::default()
    };
    let mut proxy = Proxy::start_with(&ConfigBuilder::unlimited(up.addr()), opts);
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
    let pid_file = proxy.dir().join("slidegate.pid");
    poll_until(Duration::from_secs(10), || pid_file.exists()).expect("pid file");
    proxy.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    let sent = Instant::now();
    proxy.signal(libc::SIGTERM).expect("SIGTERM");
    let status = proxy
        .wait_exit(Duration::from_secs(35))
        .unwrap_or_else(|| panic!("still running; log:\n{}", proxy.log()));
    let took = sent.elapsed();
    println!("idle SIGTERM, grace_period 30 s: exit {status} after {took:?}");
    assert_eq!(status.code(), Some(0), "log:\n{}", proxy.log());
    assert!(
        took < Duration::from_secs(1),
        "{took:?}; log:\n{}",
        proxy.log()
    );
    assert!(!pid_file.exists());
}

/// With a 30 s grace period, a 1.5 s request in flight at SIGTERM completes with 200 and the
/// process exits within a second of its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_once_the_request_in_flight_is_answered() {
    let up = Upstream::start();
    let opts = ProxyOptions {
        grace_period: "30s",
        ..ProxyOptions::default()
    };
    let mut proxy = Proxy::start_with(&ConfigBuilder::unlimited(up.addr()), opts);
    proxy.wait_signal_handler(libc::SIGTERM, Duration::from_secs(10));
    let addr = proxy.addr();
    let slow = tokio::spawn(async move {
        let r = request(addr, "GET", "/slow", &[(DELAY_HEADER, "1500")]).await;
        (r, Instant::now())
    });
    poll_until(Duration::from_secs(10), || up.hits() == 1).expect("request reaches upstream");
    let sent = Instant::now();
    proxy.signal(libc::SIGTERM).expect("SIGTERM");
    let (reply, answered_at) = slow.await.unwrap();
    let reply = reply.unwrap_or_else(|e| panic!("in-flight request failed: {e}"));
    assert_eq!((reply.status, reply.body.as_str()), (200, UPSTREAM_BODY));
    let status = proxy
        .wait_exit(Duration::from_secs(35))
        .unwrap_or_else(|| panic!("still running; log:\n{}", proxy.log()));
    let exited = sent.elapsed();
    let after_answer = Instant::now().duration_since(answered_at);
    println!(
        "SIGTERM with a 1.5 s request, grace 30 s: answered {:?} after the signal, exit \
         {status} {exited:?} after it ({after_answer:?} after the answer)",
        answered_at.duration_since(sent)
    );
    assert_eq!(status.code(), Some(0));
    assert!(after_answer < Duration::from_secs(1), "{after_answer:?}");
}

/// A `listen` edit cannot apply without a restart: the reload counts as `needs_restart`,
/// logs a WARN naming the key, and the old port keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_change_on_reload_counts_as_needs_restart() {
    let up = Upstream::start();
    let toml = ConfigBuilder::unlimited(up.addr());
    let proxy = Proxy::start(&toml);
    let old = proxy.addr().to_string();
    let new = format!("127.0.0.1:{}", free_port());
    let server = proxy.server_section().replace(&old, &new);
    proxy.write_config_text(&format!("{server}{toml}"));
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));
    proxy.signal(libc::SIGHUP).expect("SIGHUP");
    poll_until(Duration::from_secs(10), || {
        reloads(&proxy, "needs_restart") == 1
    })
    .unwrap_or_else(|| panic!("no needs_restart reload; log:\n{}", proxy.log()));
    assert_eq!(reloads(&proxy, "ok"), 0);
    let log = proxy.log();
    assert!(
        log.contains("WARN")
            && log.contains("config reload: server.listen changed but needs a restart"),
        "{log}"
    );
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
}

/// A request to an upstream that refuses connections gets a 502 problem document (like the
/// 429), `Server: slidegate` instead of Pingora's empty body and `Server: Pingora`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_is_a_problem_document() {
    let proxy = Proxy::start(&ConfigBuilder::unlimited(common::proxy::closed_addr()));
    let reply = get(proxy.addr(), "/").await;
    assert_eq!(reply.status, 502, "{reply:?}");
    let header = |name: &str| {
        reply
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(header("content-type"), "application/problem+json");
    assert_eq!(header("server"), "slidegate");
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON body");
    assert_eq!(body["status"], 502);
    assert_eq!(body["title"], "Bad Gateway");
    println!("502 body: {}", reply.body);
}
