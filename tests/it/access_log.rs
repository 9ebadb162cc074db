//! The access log and logging hygiene through the real binary: JSON keys and values, nginx's
//! combined format, SIGUSR1 reopen after rotation, a stalled writer that drops and counts
//! instead of blocking requests, client aborts counted instead of logged as errors, and no
//! query string or header value in default-level lines. `combined` is compared with a real
//! nginx's line.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::log_file::wait_lines;
use common::proxy::{closed_addr, send, ConfigBuilder, Proxy, ProxyOptions};
use common::upstream::{Upstream, DELAY_HEADER};
use tokio::io::AsyncWriteExt;

const SECRET: &str = "s3cr3t-token";

fn with_log(config: ConfigBuilder, access: &Path, format: &str) -> String {
    config
        .raw(&format!(
            "[log]\naccess = {access:?}\nformat = \"{format}\""
        ))
        .build()
}

fn log_path(proxy_dir: &Path) -> PathBuf {
    proxy_dir.join("access.log")
}

/// An upstream, and a proxy with one unlimited route whose access log (in `format`) goes to a
/// file in the returned temp dir.
fn unlimited_proxy_with_log(format: &str) -> (Upstream, tempfile::TempDir, PathBuf, Proxy) {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let access = log_path(dir.path());
    let proxy = Proxy::start(&with_log(
        ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("all", ""),
        &access,
        format,
    ));
    (up, dir, access, proxy)
}

/// One JSON object per request with exactly the documented keys; an allowed request, a 429
/// and a 404 each say what happened, and neither the query string nor any header value (an
/// `Authorization`, a cookie) appears anywhere in the file.
#[tokio::test]
async fn json_lines_have_the_documented_keys_and_no_secrets() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let access = log_path(dir.path());
    let proxy = Proxy::start(&with_log(
        ConfigBuilder::new().upstream("app", up.addr()).route(
            "login",
            "path_prefix = \"/login\"\nlimits = [ { requests = 1, window = \"1m\" } ]",
        ),
        &access,
        "json",
    ));
    let secrets = [
        ("Authorization", "Bearer s3cr3t-token"),
        ("Cookie", "session=s3cr3t-token"),
        ("Host", "App.Example:8080"),
    ];
    let path = format!("/login?token={SECRET}");
    assert_eq!(
        send(proxy.addr(), "POST", &path, &secrets).await.status,
        200
    );
    let refused = send(proxy.addr(), "POST", &path, &secrets).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        send(proxy.addr(), "GET", "/nowhere?x=1", &[]).await.status,
        404
    );

    let lines = wait_lines(&access, 3);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let text = std::fs::read_to_string(&access).unwrap();
    assert!(!text.contains(SECRET), "{text}");
    let parsed: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &parsed {
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut want = [
            "time",
            "client",
            "method",
            "host",
            "path",
            "status",
            "route",
            "decision",
            "limits",
            "pk",
            "cost",
            "settled_cost",
            "upstream",
            "upstream_ms",
            "duration_ms",
            "bytes_sent",
            "bytes_received",
            "protocol",
            "tls_version",
            "request_id",
            "user_agent",
            "referer",
            "error",
        ];
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want, "{line}");
        let time = line["time"].as_str().unwrap();
        humantime::parse_rfc3339(time).unwrap_or_else(|e| panic!("time {time}: {e}"));
        assert_eq!(line["client"], "127.0.0.1");
        assert!(line["duration_ms"].as_f64().unwrap() >= 0.0);
        assert!(line["error"].is_null(), "{line}");
    }
    let (ok, denied, none) = (&parsed[0], &parsed[1], &parsed[2]);
    assert_eq!(ok["method"], "POST");
    // As nginx's $host: the host routes matched on, lower-cased, without port.
    assert_eq!(ok["host"], "app.example");
    assert_eq!(ok["path"], "/login");
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["route"], "login");
    assert_eq!(ok["decision"], "allowed");
    assert_eq!(ok["upstream"], up.addr().to_string());
    assert!(ok["upstream_ms"].as_f64().unwrap() >= 0.0, "{ok}");
    assert_eq!(ok["bytes_sent"], common::upstream::UPSTREAM_BODY.len());
    assert_eq!(ok["protocol"], "HTTP/1.1");
    assert!(ok["tls_version"].is_null(), "{ok}");
    assert_eq!(ok["request_id"].as_str().unwrap().len(), 32, "{ok}");

    assert_eq!(denied["status"], 429);
    assert_eq!(denied["decision"], "denied");
    // Issue 54: the line names the limit that refused and the bucket's pk (the RateLimit
    // field's, never the key); an admission names no limit; no cost limit, no cost.
    assert_eq!(denied["limits"], "login-60s", "{denied}");
    assert!(ok["limits"].is_null(), "{ok}");
    let field = refused.header("ratelimit").unwrap_or_default();
    let pk = &common::ratelimit::parse_ratelimit(field)[0].pk;
    use base64::Engine as _;
    let logged = denied["pk"].as_str().unwrap_or_else(|| panic!("{denied}"));
    let logged = base64::engine::general_purpose::STANDARD
        .decode(logged)
        .unwrap();
    assert_eq!(&logged, pk, "{denied} / {field}");
    assert_eq!(ok["pk"], denied["pk"], "one client, one bucket");
    assert!(
        denied["cost"].is_null() && denied["settled_cost"].is_null(),
        "{denied}"
    );
    assert!(none["pk"].is_null() && none["limits"].is_null(), "{none}");
    assert!(denied["upstream"].is_null() && denied["upstream_ms"].is_null());
    assert!(denied["bytes_sent"].as_u64().unwrap() > 0);

    assert_eq!(none["status"], 404);
    assert_eq!(none["path"], "/nowhere");
    assert!(
        none["route"].is_null() && none["decision"].is_null(),
        "{none}"
    );
    assert!(none["host"] == "localhost", "{none}");

    // Startup names every listener and the access log.
    let log = proxy.log();
    for want in [
        format!("listening on http://{}", proxy.addr()),
        format!("admin on http://{}", proxy.admin_addr()),
        format!("access log to {}", access.display()),
    ] {
        assert!(log.contains(&want), "no {want:?} in:\n{log}");
    }
    assert_eq!(proxy.counter("slidegate_access_log_dropped_total"), 0);
}

/// `format = "combined"` is nginx's `combined` byte for byte: the same request (a query, a
/// referer, a user agent with quotes, a backslash and non-ASCII bytes; control bytes are
/// refused with 400 before any log) through slidegate and through a
/// real nginx proxying to the same upstream gives the same line, but for the time of day.
#[tokio::test]
async fn combined_format_matches_nginx_byte_for_byte() {
    let (up, _dir, access, proxy) = unlimited_proxy_with_log("combined");
    let nginx = common::nginx::Nginx::start(
        "    access_log @DIR@/access.log combined;",
        &format!("        location / {{ proxy_pass http://{}; }}", up.addr()),
    );
    let request: &[u8] = b"GET /a/b?x=1&y=%20z&q=%22t%22 HTTP/1.1\r\nHost: localhost\r\n\
        Referer: https://ref.example/p?q=1\r\n\
        User-Agent: Mozilla/5.0 \"quoted\" \\ \xe9t\xe9\r\nConnection: close\r\n\r\n";
    let theirs = nginx.dir().join("access.log");
    for addr in [proxy.addr(), nginx.addr()] {
        let (status, text) = common::http::exchange(addr, request);
        assert_eq!(status, 200, "{addr}: {text}");
    }
    let ours = wait_lines(&access, 1).remove(0);
    let theirs = wait_lines(&theirs, 1).remove(0);
    println!("slidegate: {ours}\nnginx:     {theirs}");
    // 127.0.0.1 - - [01/Dec/2026:08:26:38 +0000] "GET ..." 200 12 "..." "..."
    let untimed = |line: &str| {
        let (head, rest) = line.split_once(" [").unwrap();
        let (time, tail) = rest.split_once("] ").unwrap();
        assert!(
            time.len() == 26 && time.ends_with(" +0000") && time.as_bytes()[2] == b'/',
            "{time}"
        );
        format!("{head} [-] {tail}")
    };
    assert_eq!(
        untimed(&ours),
        untimed(&theirs),
        "ours:   {ours}\nnginx:  {theirs}"
    );
    assert!(
        ours.contains("\\x22quoted\\x22 \\x5C \\xE9t\\xE9\""),
        "{ours}"
    );
}

/// logrotate moves the file away and sends SIGUSR1: the proxy reopens the configured path and
/// writes there; the moved file keeps what was written before.
#[tokio::test]
async fn sigusr1_reopens_the_file_after_rotation() {
    let (_up, dir, access, proxy) = unlimited_proxy_with_log("json");
    assert_eq!(send(proxy.addr(), "GET", "/before", &[]).await.status, 200);
    wait_lines(&access, 1);
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&access, &rotated).unwrap();
    proxy.wait_signal_handler(libc::SIGUSR1, Duration::from_secs(10));
    proxy.signal(libc::SIGUSR1).unwrap();
    // The reopen is done when the writer has created the file again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !access.exists() {
        assert!(
            Instant::now() < deadline,
            "not reopened; log:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(send(proxy.addr(), "GET", "/after", &[]).await.status, 200);
    let new = wait_lines(&access, 1);
    assert!(new[0].contains("\"/after\""), "{new:?}");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(
        old.contains("\"/before\"") && !old.contains("/after"),
        "{old}"
    );
    // SIGUSR1's default action would have killed it.
    assert_eq!(proxy.admin_get("/healthz").0, 200);
}

/// The log goes to a pipe nobody reads: once the pipe and the queue are full, every further
/// line is dropped and counted, and requests go on being answered (none waits for the log).
/// When the pipe is read again, lines flow again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_writer_drops_and_counts_and_never_blocks_requests() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("access.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Hold the read end open (without reading) so the proxy's open for writing succeeds.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(&fifo)
        .unwrap();
    let proxy = Proxy::start(&with_log(
        ConfigBuilder::new()
            .upstream("app", up.addr())
            .route("all", ""),
        &fifo,
        "json",
    ));
    // 64 KiB of pipe (about 300 lines) plus the 4096-record queue, then drops.
    const REQUESTS: usize = 6000;
    let client = reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("http://{}/", proxy.addr());
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let (client, url, sem) = (client.clone(), url.clone(), sem.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.unwrap();
            client.get(url).send().await.map(|r| r.status().as_u16())
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().expect("request answered"), 200);
    }
    let dropped = proxy.counter("slidegate_access_log_dropped_total");
    assert!(
        dropped > 0 && dropped < REQUESTS as u64,
        "dropped {dropped} of {REQUESTS}"
    );
    // Drain the pipe: the writer gets going again and new lines arrive.
    let drained = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut reader = reader;
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = vec![0u8; 1 << 16];
        while Instant::now() < deadline {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    seen.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&seen).contains("\"/after-drain\"") {
                        return true;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("read fifo: {e}"),
            }
        }
        false
    });
    // Once the queue has room again, this line goes through.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !drained.is_finished() {
        assert!(Instant::now() < deadline, "log did not recover");
        client
            .get(format!("http://{}/after-drain", proxy.addr()))
            .send()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(drained.await.unwrap(), "no line after the pipe was drained");
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

/// A client that hangs up while its request waits for the upstream is counted in
/// `slidegate_client_aborts_total` and is not an ERROR line; a refused upstream is one WARN
/// line (and a counter), without the query string.
#[tokio::test]
async fn client_aborts_are_counted_and_errors_carry_no_query_string() {
    let up = Upstream::start();
    let proxy = Proxy::start_with(
        &ConfigBuilder::new()
            .upstream("app", up.addr())
            .upstream("dead", closed_addr())
            .route("dead", "path_prefix = \"/dead\"\nupstream = \"dead\"")
            .route("all", "")
            .build(),
        ProxyOptions::default(),
    );
    // Send a request the upstream answers after 2 s, then hang up once it has arrived there.
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(
            format!("GET /slow?token={SECRET} HTTP/1.1\r\nHost: x\r\n{DELAY_HEADER}: 2000\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.hits() == 0 {
        assert!(
            Instant::now() < deadline,
            "request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.counter("slidegate_client_aborts_total") == 0 {
        assert!(
            Instant::now() < deadline,
            "abort not counted; log:\n{}",
            proxy.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let r = send(
        proxy.addr(),
        "GET",
        &format!("/dead/x?token={SECRET}"),
        &[("Authorization", SECRET)],
    )
    .await;
    assert_eq!(r.status, 502);
    // One WARN line for the refused upstream (not Pingora's ERROR per request), written
    // before the 502 went out.
    let log = proxy.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "no ERROR line: {errors:#?}");
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("upstream dead: 1 failed connect"))
        .collect();
    assert_eq!(
        warns.len(),
        1,
        "one WARN line for the dead upstream's failed connects:\n{log}"
    );
    // And one for its server taken out (passive ejection, `max_fails = 1` by default).
    let down = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("is down: out for"));
    assert_eq!(down.count(), 1, "one line for the server taken out:\n{log}");
    assert!(warns[0].contains("1 failed connect"), "{warns:?}");
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    assert_eq!(
        proxy.counter("slidegate_upstream_connect_failures_total{upstream=\"dead\"}"),
        1
    );
}
