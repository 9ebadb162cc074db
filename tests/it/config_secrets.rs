//! Secrets out of the config file, and out of everything the config shows: `${NAME}` from the
//! environment, `store.password_file`, `server.admin_token_file`, the `[store]` TLS files, and
//! redaction in `-t` output, the serialized settings, the reload diff and the process log; and an
//! admin token too short to be out of a guesser's reach refused.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::admin::wait_readyz;
use common::cli::check_config;
use common::proxy::{get, ConfigBuilder, Proxy, ProxyOptions};
use common::redis::RedisServer;
use common::tls::TestCa;
use common::upstream::Upstream;
use slidegate::config::{Backend, Config};

const SERVER: &str = "[server]\nlisten = \"127.0.0.1:18080\"\nadmin_listen = \"127.0.0.1:19090\"\n";

/// `slidegate -t -c <path>` with `env`: (success, stdout + stderr).
fn check(path: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let checked = check_config(path, env);
    (checked.ok, checked.output())
}

/// Write `text` as `t.toml` in `dir`.
fn write(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("t.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn env_variables_fill_urls_and_a_missing_one_names_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{SERVER}admin_token = \"${{SG_T_TOKEN}}\"\n[store]\nbackend = \"redis\"\n\
         url = \"redis://app:${{SG_T_PW}}@127.0.0.1:6379/\"\n"
    );
    let path = write(dir.path(), &text);
    let env = [
        ("SG_T_PW", "pw-from-env-1"),
        ("SG_T_TOKEN", "tok-from-env-1-of-24-bytes"),
    ];
    let (ok, out) = check(&path, &env);
    assert!(ok, "{out}");
    assert!(
        !out.contains("pw-from-env-1") && !out.contains("tok-from-env-1-of-24-bytes"),
        "{out}"
    );
    let (ok, out) = check(&path, &env[1..]);
    assert!(!ok);
    assert!(
        out.contains("t.toml:7: `store.url`: environment variable SG_T_PW is not set"),
        "{out}"
    );
    let (ok, out) = check(&path, &env[..1]);
    assert!(!ok);
    assert!(out.contains("t.toml:4: `server.admin_token`"), "{out}");
}

#[test]
fn a_double_dollar_is_a_literal_and_a_bad_name_is_an_error() {
    let text = format!("{SERVER}admin_token = \"a$${{B}}c$d-long-enough\"\n");
    let config = Config::from_toml(Path::new("t.toml"), &text).unwrap();
    let token = config.server.admin_token.as_ref().unwrap();
    assert_eq!(token.expose(), "a${B}c$d-long-enough");
    let text = format!("{SERVER}admin_token = \"${{9X}}\"\n");
    let err = Config::from_toml(Path::new("t.toml"), &text).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("t.toml:4: `server.admin_token`"),
        "{err}"
    );
}

#[test]
fn password_and_token_files_are_read_without_their_newline() {
    let dir = tempfile::tempdir().unwrap();
    let (pw, tok) = (dir.path().join("pw"), dir.path().join("tok"));
    std::fs::write(&pw, "file-pw-2\n").unwrap();
    std::fs::write(&tok, "file-tok-2-of-22-bytes\r\n").unwrap();
    let text = format!(
        "{SERVER}admin_token_file = {tok:?}\n[store]\nbackend = \"redis_cluster\"\n\
         urls = [\"redis://a:1/\", \"redis://user@b:2/\"]\npassword_file = {pw:?}\n"
    );
    let config = Config::from_toml(Path::new("t.toml"), &text).unwrap();
    assert_eq!(
        config.server.admin_token.as_ref().unwrap().expose(),
        "file-tok-2-of-22-bytes"
    );
    let Backend::RedisCluster { urls } = &config.store.backend else {
        panic!("cluster")
    };
    for url in urls {
        assert_eq!(url.info.redis_settings().password(), Some("file-pw-2"));
    }
    assert_eq!(urls[1].shown(), "redis://user:***@b:2/0");
    // Both token keys, or a missing file: refused, naming the key.
    let both = text.replace("admin_token_file", "admin_token = \"x\"\nadmin_token_file");
    let err = Config::from_toml(Path::new("t.toml"), &both).unwrap_err();
    assert!(
        err.to_string()
            .contains("t.toml:5: `server.admin_token_file`"),
        "{err}"
    );
    let gone = text.replace("/pw\"", "/missing\"");
    let err = Config::from_toml(Path::new("t.toml"), &gone).unwrap_err();
    assert!(
        err.to_string()
            .contains("t.toml:8: `store.password_file`: cannot read"),
        "{err}"
    );
}

#[test]
fn secrets_stay_out_of_the_serialized_settings_and_the_debug_form_and_the_diff() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    let config = |password: &str| {
        std::fs::write(&pw, password).unwrap();
        let text = format!(
            "{SERVER}admin_token = \"tok-secret-3-of-22-byte\"\n[store]\nbackend = \"redis\"\n\
             url = \"rediss://app:url-secret-3@h:1/\"\npassword_file = {pw:?}\n"
        );
        Config::from_toml(Path::new("t.toml"), &text).unwrap()
    };
    let (old, new) = (config("file-secret-3"), config("file-secret-4"));
    for shown in [
        serde_json::to_string(&old.store).unwrap(),
        serde_json::to_string(&old.server).unwrap(),
        format!("{old:?}"),
        old.restart_only_changes(&new).join(" "),
    ] {
        for secret in [
            "tok-secret-3-of-22-byte",
            "url-secret-3",
            "file-secret-3",
            "file-secret-4",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
    assert!(serde_json::to_string(&old.store)
        .unwrap()
        .contains("rediss://app:***@h:1/0"));
    assert_eq!(old.restart_only_changes(&new), ["store.backend"]);
    assert!(old
        .restart_only_changes(&config("file-secret-3"))
        .is_empty());
}

#[test]
fn tls_files_are_checked_at_load_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("t");
    let leaf = ca.issue("client", &["c"]);
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not pem").unwrap();
    let store = |url: &str, lines: &str| {
        format!("{SERVER}[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{lines}\n")
    };
    let good = store(
        "rediss://h:1/",
        &format!(
            "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}",
            ca.ca_file(),
            leaf.cert,
            leaf.key
        ),
    );
    let config = Config::from_toml(Path::new("t.toml"), &good).unwrap();
    let tls = config.store.tls.as_ref().unwrap();
    assert!(tls.ca_pem.is_some() && tls.client_pem.is_some());
    assert!(!format!("{tls:?}").contains("PRIVATE KEY"));
    let no_cert = format!(
        "t.toml:7: `store.ca_file`: {}: no PEM certificate",
        garbage.display()
    );
    let no_key = format!(
        "t.toml:8: `store.client_key_file`: {}: no PEM private key",
        leaf.cert.display()
    );
    let cases = [
        (
            store("rediss://h:1/", "ca_file = \"/nonexistent/ca.pem\""),
            "t.toml:7: `store.ca_file`: cannot read /nonexistent/ca.pem",
        ),
        (
            store("rediss://h:1/", &format!("ca_file = {garbage:?}")),
            no_cert.as_str(),
        ),
        (
            store(
                "rediss://h:1/",
                &format!("client_cert_file = {:?}", leaf.cert),
            ),
            "t.toml:7: `store.client_key_file`: required with store.client_cert_file",
        ),
        (
            store(
                "rediss://h:1/",
                &format!(
                    "client_cert_file = {:?}\nclient_key_file = {:?}",
                    leaf.cert, leaf.cert
                ),
            ),
            no_key.as_str(),
        ),
        (
            store(
                "redis://u:pw-5@h:1/",
                &format!("ca_file = {:?}", ca.ca_file()),
            ),
            "t.toml:7: `store.ca_file`: TLS settings need rediss:// URLs, but redis://u:***@h:1/0",
        ),
    ];
    for (text, want) in cases {
        let err = Config::from_toml(Path::new("t.toml"), &text).unwrap_err();
        assert!(
            err.to_string().starts_with(want),
            "want {want:?}, got {err}"
        );
        assert!(!err.to_string().contains("pw-5"), "{err}");
    }
}

/// SIGHUP once the handler is installed.
fn sighup(proxy: &Proxy) {
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));
    proxy.signal(libc::SIGHUP).expect("SIGHUP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_never_logs_the_password_it_connects_with() {
    const PW: &str = "redis-secret-6";
    let redis = RedisServer::start();
    let _: () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PW)
        .query(&mut redis.connection())
        .unwrap();
    let up = Upstream::start();
    let store = |url_password: &str, lines: &str| {
        format!(
            "backend = \"redis\"\nurl = \"redis://:{url_password}@127.0.0.1:{}/\"\n{lines}",
            redis.port()
        )
    };
    let config = |store: String| {
        ConfigBuilder::new()
            .store(&store)
            .upstream("app", up.addr())
            .route("api", "limits = [ { requests = 1, window = \"1m\" } ]")
            .build()
    };
    let opts = ProxyOptions {
        env: vec![
            ("SG_T_REDIS_PW".into(), PW.into()),
            ("RUST_LOG".into(), "debug".into()),
        ],
        ..ProxyOptions::default()
    };
    let proxy = Proxy::start_with(&config(store("${SG_T_REDIS_PW}", "")), opts);
    wait_readyz(&proxy, 200, Duration::from_secs(10));
    assert_eq!(get(proxy.addr(), "/").await.status, 200);
    assert_eq!(get(proxy.addr(), "/").await.status, 429);
    // A restart-only change of the password (now from a file) is reported, without it.
    let pw_file = proxy.dir().join("redis.pw");
    std::fs::write(&pw_file, "other-secret-7\n").unwrap();
    proxy.write_config(&config(store("x", &format!("password_file = {pw_file:?}"))));
    sighup(&proxy);
    let start = Instant::now();
    while !proxy
        .log()
        .contains("store.backend changed but needs a restart")
    {
        assert!(start.elapsed() < Duration::from_secs(10), "{}", proxy.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, out) = check(proxy.config_path(), &[]);
    assert!(ok, "{out}");
    let log = proxy.log();
    for secret in [PW, "other-secret-7"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
        assert!(!out.contains(secret), "{secret} in -t output: {out}");
    }
}

/// A token short enough to guess is refused by `-t` (and at start and reload, which load the
/// same way), naming file, line and key, whether written in the file, taken from `${ENV}` or
/// read from `admin_token_file`; 16 bytes pass. Before: `admin_token = "a"` passed `-t`.
#[test]
fn a_short_admin_token_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.toml");
    let file = dir.path().join("token");
    let head = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\n";
    let run = |line: &str, env: &str| {
        std::fs::write(&path, format!("{head}{line}\n")).unwrap();
        check(&path, &[("SG_ADMIN_TOKEN", env)])
    };
    let in_file = format!("admin_token_file = {:?}", file.display().to_string());
    for (line, env, token, key) in [
        ("admin_token = \"a\"", "", "", "server.admin_token"),
        (
            "admin_token = \"0123456789abcde\"",
            "",
            "",
            "server.admin_token",
        ),
        (
            "admin_token = \"${SG_ADMIN_TOKEN}\"",
            "short",
            "",
            "server.admin_token",
        ),
        (
            in_file.as_str(),
            "",
            "fifteen-bytes-x\n",
            "server.admin_token_file",
        ),
    ] {
        std::fs::write(&file, token).unwrap();
        let (ok, stderr) = run(line, env);
        assert!(!ok, "{line} passed -t");
        assert!(
            stderr.contains(&format!("short.toml:4: `{key}`"))
                && stderr.contains("at least 16 bytes"),
            "{line}: names file, line, key and the bound: {stderr}"
        );
    }
    std::fs::write(&file, "sixteen-bytes-xx\n").unwrap();
    for line in ["admin_token = \"0123456789abcdef\"", in_file.as_str()] {
        let (ok, stderr) = run(line, "");
        assert!(ok, "{line}: {stderr}");
    }
}
