//! Upstream health keys (`[upstreams.*]` `health_check`, `max_fails`, `fail_timeout`,
//! `resolve_interval`): their defaults, and bad values refused naming file, line and key.

use crate::common::cli::check_config;
use crate::common::config::assert_invalid;

#[test]
fn bad_health_keys_are_refused_naming_file_line_and_key() {
    let base = "[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"\n\n\
                [upstreams.app]\nservers = [\"127.0.0.1:1\"]\n";
    let route = "\n[[routes]]\nname = \"r\"\nupstream = \"app\"\n";
    let cases = [
        (
            "health_check = { interval = \"0s\" }",
            "upstreams.app.health_check.interval",
            "shorter than 100ms",
        ),
        (
            "health_check = { interval = \"often\" }",
            "upstreams.app.health_check.interval",
            "invalid duration",
        ),
        (
            "health_check = { healthy = 0 }",
            "upstreams.app.health_check.healthy",
            "must be 1 to 100",
        ),
        (
            "health_check = { unhealthy = 101 }",
            "upstreams.app.health_check.unhealthy",
            "must be 1 to 100",
        ),
        (
            "health_check = { path = \"healthz\" }",
            "upstreams.app.health_check.path",
            "not an origin-form path",
        ),
        (
            "health_check = { port = 8081 }",
            "upstreams.app.health_check.port",
            "unknown field `port`",
        ),
        (
            "fail_timeout = \"0s\"",
            "upstreams.app.fail_timeout",
            "shorter than 1ms",
        ),
        ("max_fails = -1", "upstreams.app.max_fails", "invalid value"),
        (
            "resolve_interval = \"10ms\"",
            "upstreams.app.resolve_interval",
            "shorter than 1s",
        ),
        (
            "tls = true\nresolve_interval = \"30s\"",
            "upstreams.app.resolve_interval",
            "needs sni",
        ),
    ];
    for (lines, key, message) in cases {
        let text = format!("{base}{lines}\n{route}");
        let line = base.lines().count() + lines.lines().count();
        assert_invalid(&text, key, line, message);
    }
    // Through the binary, as an operator sees it: the file, its line, the key.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("health.toml");
    std::fs::write(
        &path,
        format!("{base}health_check = {{ healthy = 0 }}\n{route}"),
    )
    .unwrap();
    let out = check_config(&path, &[]);
    assert!(!out.ok);
    let said = out.output();
    let at = format!("{}:7", path.display());
    assert!(said.contains(&at), "{said}");
    assert!(
        said.contains("upstreams.app.health_check.healthy"),
        "{said}"
    );
}

#[test]
fn the_defaults_are_nginx_s_and_the_health_keys_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    let text = "[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"\n\n\
                [upstreams.app]\nservers = [\"localhost:1\"]\nresolve_interval = \"30s\"\n\
                health_check = { path = \"/healthz\" }\n\n\
                [[routes]]\nname = \"r\"\nupstream = \"app\"\n";
    std::fs::write(&path, text).unwrap();
    let t = crate::common::cli::effective_config(&path, &[("TMPDIR", "/tmp")]);
    let app = &t["upstreams"]["app"];
    assert_eq!(app["max_fails"].as_integer(), Some(1));
    assert_eq!(app["fail_timeout"].as_str(), Some("10s"));
    assert_eq!(app["resolve_interval"].as_str(), Some("30s"));
    let check = &app["health_check"];
    assert_eq!(check["interval"].as_str(), Some("5s"));
    assert_eq!(check["timeout"].as_str(), Some("1s"));
    assert_eq!(check["healthy"].as_integer(), Some(2));
    assert_eq!(check["unhealthy"].as_integer(), Some(3));
}
