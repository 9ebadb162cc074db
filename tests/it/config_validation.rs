//! Config validation through both doors: `slidegate -t` (the real binary, as an operator runs
//! it) and `Config::from_toml` (the library). Every bad config must be refused with an error
//! naming the file, the key path and, when the parser knows it, the line.

use crate::common;

use std::path::{Path, PathBuf};

use std::time::Duration;

use common::cli::check_config;
use http::Method;
use slidegate::config::{Config, ConfigError, HostMatch};

/// A valid config; every case below breaks exactly one thing in it.
const BASE: &str = r#"[server]
listen = "127.0.0.1:18080"
admin_listen = "127.0.0.1:19090"
grace_period = "1s"

[store]
backend = "memory"

[client_ip]
trusted_proxies = ["10.0.0.0/8"]

[upstreams.app]
servers = ["127.0.0.1:3000"]

[[routes]]
name = "api"
path_prefix = "/api"
methods = ["GET", "POST"]
upstream = "app"
key = "client_ip"
limits = [ { requests = 10, window = "1m" } ]
"#;

/// `BASE` with the first occurrence of `from` replaced by `to` (which must exist).
fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE has no {from:?}");
    BASE.replacen(from, to, 1)
}

/// 1-based number of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line contains {needle:?}"))
        + 1
}

struct Case {
    what: &'static str,
    toml: String,
    /// The exact key path of the error.
    key: &'static str,
    /// A substring of the line the error must point at (`None`: the line is not known).
    line_of: Option<&'static str>,
    /// A substring of the message.
    message: &'static str,
}

/// Refused by both `from_toml` and `slidegate -t`, with file, key, line and message.
fn assert_refused(dir: &Path, case: &Case) {
    let file: PathBuf = dir.join(format!("{}.toml", case.what.replace(' ', "_")));
    std::fs::write(&file, &case.toml).unwrap();
    let line = case.line_of.map(|needle| line_of(&case.toml, needle));

    // The library.
    let err = Config::from_toml(&file, &case.toml)
        .expect_err(&format!("{}: accepted by from_toml", case.what));
    match &err {
        ConfigError::Invalid {
            file: f,
            line: l,
            key,
            message,
        } => {
            assert_eq!(f, &file, "{}: file in {err}", case.what);
            assert_eq!(key, case.key, "{}: key in {err}", case.what);
            assert_eq!(*l, line, "{}: line in {err}", case.what);
            assert!(
                message.contains(case.message),
                "{}: message {message:?} lacks {:?}",
                case.what,
                case.message
            );
        }
        other => panic!("{}: unexpected error {other}", case.what),
    }
    let text = err.to_string();
    let expected_prefix = format!(
        "{}:{}: `{}`: ",
        file.display(),
        line.map(|l| l.to_string()).unwrap_or_else(|| "?".into()),
        case.key
    );
    assert!(
        text.starts_with(&expected_prefix),
        "{}: {text:?} does not start with {expected_prefix:?}",
        case.what
    );

    // The binary, as an operator runs it.
    let common::cli::Checked { ok, stdout, stderr } = check_config(&file, &[]);
    assert!(
        !ok,
        "{}: slidegate -t accepted it; stdout: {stdout}",
        case.what
    );
    assert!(
        stderr.contains(&expected_prefix) && stderr.contains(case.message),
        "{}: slidegate -t stderr {stderr:?} lacks {expected_prefix:?} or {:?}",
        case.what,
        case.message
    );
    println!("{:<28} {}", case.what, stderr.trim());
}

#[test]
fn base_config_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("base.toml");
    std::fs::write(&file, BASE).unwrap();
    let config = Config::from_toml(&file, BASE).expect("BASE is valid");
    assert_eq!(config.routes.len(), 1);
    let common::cli::Checked { ok, stdout, stderr } = check_config(&file, &[]);
    assert!(ok, "slidegate -t refused BASE: {stderr}");
    assert!(stdout.contains("is valid"), "{stdout}");
}

/// `on_error` defaults to `local` with a shared store and to `allow` with the memory store.
#[test]
fn on_error_defaults_to_local_with_a_shared_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    let memory = Config::from_toml(&file, BASE).unwrap();
    assert_eq!(
        memory.routes[0].counting.on_error,
        slidegate::config::OnError::Allow
    );
    let redis = edit(
        "backend = \"memory\"",
        "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
    );
    let shared = Config::from_toml(&file, &redis).unwrap();
    assert_eq!(
        shared.routes[0].counting.on_error,
        slidegate::config::OnError::Local
    );
    let explicit = redis.replace(
        "key = \"client_ip\"",
        "key = \"client_ip\"\non_error = \"allow\"",
    );
    let chosen = Config::from_toml(&file, &explicit).unwrap();
    assert_eq!(
        chosen.routes[0].counting.on_error,
        slidegate::config::OnError::Allow
    );
}

#[test]
fn a_cost_limit_is_slotted_by_a_sixtieth_of_its_window_by_default() {
    let toml = edit(
        "limits = [ { requests = 10, window = \"1m\" } ]",
        "cost = \"header:X-Cost\"\nmax_cost = 500\nlimits = [ { requests = 10, window = \"1m\" }, \
         { quota = 1000, window = \"1h\", unit = \"cost\" } ]",
    );
    let config = Config::from_toml(Path::new("cost.toml"), &toml).expect("valid");
    let route = &config.routes[0];
    let cost = &route.limits[1];
    assert_eq!(cost.id().to_string(), "3600000@60000c");
    assert_eq!((cost.requests, route.limits[0].weight), (1000, 1));
    assert_eq!((route.cost.max, route.cost.fits), (Some(500), Some(1000)));
}

#[test]
fn shipped_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/slidegate.toml");
    let config = Config::load(&path).expect("config/slidegate.toml loads");
    assert!(!config.routes.is_empty(), "the example has routes");
    assert!(config
        .routes
        .iter()
        .all(|r| r.upstream < config.upstreams.len()));
    let common::cli::Checked { ok, stdout, stderr } = check_config(&path, &[]);
    assert!(ok, "slidegate -t refused config/slidegate.toml: {stderr}");
    assert!(
        stdout.contains("is valid"),
        "unexpected -t output: {stdout}"
    );
}

/// The example config as a new user tries it, on localhost: every route with a path is the one
/// a request to that path gets, none falls to the unlimited "default" (the "api" route took
/// only `*.example.com` before, so `/api` on localhost went unlimited).
#[test]
fn shipped_example_config_routes_each_path_on_localhost() {
    use slidegate::request::method_override::Methods;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/slidegate.toml");
    let config = Config::load(&path).expect("config/slidegate.toml loads");
    let rules = slidegate::routes::Rules::build(&config).expect("rules");
    let mut checked = Vec::new();
    for route in config.routes.iter().filter(|r| r.name != "default") {
        let prefix = route.matching.path_prefix.trim_end_matches('/');
        for host in [Some("localhost"), Some("127.0.0.1"), None] {
            let found = rules.find(
                host,
                &format!("{prefix}/x"),
                &Methods::sent(&http::Method::GET),
            );
            let name = found.map(|(_, r)| r.spec.name.as_str());
            assert_eq!(
                name,
                Some(route.name.as_str()),
                "GET {prefix}/x with Host {host:?}"
            );
        }
        checked.push(route.name.as_str());
    }
    assert_eq!(
        checked,
        ["login", "api", "search", "chat", "stream", "reports"]
    );
}

#[test]
fn missing_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("does-not-exist.toml");
    let common::cli::Checked { ok, stderr, .. } = check_config(&file, &[]);
    assert!(!ok);
    assert!(
        stderr.contains(&file.display().to_string()),
        "stderr {stderr:?} does not name the file"
    );
}

#[test]
fn bad_configs_are_refused_with_file_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = vec![
        Case {
            what: "unknown top-level key",
            toml: format!("bogus = 1\n{BASE}"),
            key: "bogus",
            line_of: Some("bogus = 1"),
            message: "unknown field `bogus`",
        },
        Case {
            what: "unknown top-level table",
            toml: format!("{BASE}\n[limits]\nx = 1\n"),
            key: "limits",
            line_of: Some("[limits]"),
            message: "unknown field `limits`",
        },
        Case {
            what: "unknown server key",
            toml: edit("grace_period = \"1s\"", "grace_priod = \"1s\""),
            key: "server.grace_priod",
            line_of: Some("grace_priod"),
            message: "unknown field `grace_priod`",
        },
        Case {
            what: "path prefix in another form",
            toml: edit("path_prefix = \"/api\"", "path_prefix = \"/%61pi;v=1\""),
            key: "routes[0].path_prefix",
            line_of: Some("path_prefix"),
            message: "would never match; write it as \"/api\"",
        },
        Case {
            what: "path prefix with a dot segment",
            toml: edit("path_prefix = \"/api\"", "path_prefix = \"/x/../api\""),
            key: "routes[0].path_prefix",
            line_of: Some("path_prefix"),
            message: "would never match",
        },
        Case {
            what: "admin token from a device",
            toml: edit("grace_period = \"1s\"", "grace_period = \"1s\"\nadmin_token_file = \"/dev/zero\""),
            key: "server.admin_token_file",
            line_of: Some("admin_token_file"),
            message: "not a regular file",
        },
        Case {
            what: "unknown route key",
            toml: edit("path_prefix = \"/api\"", "path = \"/api\""),
            key: "routes[0].path",
            line_of: Some("path = \"/api\""),
            message: "unknown field `path`",
        },
        Case {
            what: "unknown limit key",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", burst = 5 }",
            ),
            key: "routes[0].limits[0].burst",
            line_of: Some("burst = 5"),
            message: "unknown field `burst`",
        },
        Case {
            what: "duplicate route names",
            toml: format!(
                "{BASE}\n[[routes]]\nname = \"api\" # again\nupstream = \"app\"\nlimits = []\n"
            ),
            key: "routes[1].name",
            line_of: Some("# again"),
            message: "duplicate route name \"api\"",
        },
        Case {
            what: "missing upstream",
            toml: edit("upstream = \"app\"", "upstream = \"nope\""),
            key: "routes[0].upstream",
            line_of: Some("upstream = \"nope\""),
            message: "no [upstreams.nope]",
        },
        Case {
            what: "zero requests",
            toml: edit("requests = 10", "requests = 0"),
            key: "routes[0].limits[0].requests",
            line_of: Some("requests = 0"),
            message: "nonzero",
        },
        Case {
            what: "unparseable window",
            toml: edit("window = \"1m\"", "window = \"soon\""),
            key: "routes[0].limits[0].window",
            line_of: Some("\"soon\""),
            message: "invalid duration \"soon\"",
        },
        Case {
            what: "window under 1ms",
            toml: edit("window = \"1m\"", "window = \"500us\""),
            key: "routes[0].limits[0].window",
            line_of: Some("\"500us\""),
            message: "shorter than 1ms",
        },
        Case {
            what: "duplicate windows",
            toml: edit(
                "limits = [ { requests = 10, window = \"1m\" } ]",
                "limits = [\n  { requests = 10, window = \"1m\" },\n  { requests = 20, window = \"60s\" },\n]",
            ),
            key: "routes[0].limits[1].window",
            line_of: Some("\"60s\""),
            message: "duplicate window 1m",
        },
        Case {
            what: "a limit key of no known part",
            toml: edit(
                "limits = [ { requests = 10, window = \"1m\" } ]",
                "limits = [\n  { requests = 10, window = \"1m\" },\n  { requests = 20, window = \"1m\", key = \"heder:X\" },\n]",
            ),
            key: "routes[0].limits[1].key",
            line_of: Some("heder:X"),
            message: "unknown key \"heder:X\"",
        },
        Case {
            what: "a limit key listing global",
            toml: edit(
                "limits = [ { requests = 10, window = \"1m\" } ]",
                "limits = [\n  { requests = 10, window = \"1m\" },\n  { requests = 20, window = \"1m\", key = [\"global\", \"method\"] },\n]",
            ),
            key: "routes[0].limits[1].key[0]",
            line_of: Some("[\"global\""),
            message: "\"global\" cannot be combined with other parts",
        },
        Case {
            what: "two limits of one window under one own key",
            toml: edit(
                "limits = [ { requests = 10, window = \"1m\" } ]",
                "limits = [\n  { requests = 10, window = \"1m\", key = \"global\" },\n  { requests = 20, window = \"60s\", key = \"global\" },\n]",
            ),
            key: "routes[0].limits[1].window",
            line_of: Some("\"60s\""),
            message: "duplicate window 1m",
        },
        Case {
            what: "resolution that does not divide the window",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", resolution = \"7s\" }",
            ),
            key: "routes[0].limits[0].resolution",
            line_of: Some("\"7s\""),
            message: "resolution 7s does not divide the window 1m",
        },
        Case {
            what: "resolution cutting the window into more than 1000 slots",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", resolution = \"10ms\" }",
            ),
            key: "routes[0].limits[0].resolution",
            line_of: Some("\"10ms\""),
            message: "6000 slots; at most 1000",
        },
        Case {
            what: "resolution under 1ms",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", resolution = \"500us\" }",
            ),
            key: "routes[0].limits[0].resolution",
            line_of: Some("\"500us\""),
            message: "resolution \"500us\" is shorter than 1ms",
        },
        Case {
            what: "a limit both requests and concurrent",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", concurrent = 4 }",
            ),
            key: "routes[0].limits[0].concurrent",
            line_of: Some("concurrent = 4"),
            message: "either `requests` or `quota` (per `window`) or `concurrent`, not both",
        },
        Case {
            what: "a concurrent limit with a window",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ concurrent = 4, window = \"1m\" }",
            ),
            key: "routes[0].limits[0].window",
            line_of: Some("concurrent = 4"),
            message: "a `concurrent` limit has no `window`",
        },
        Case {
            what: "lease_ttl on a requests limit",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", lease_ttl = \"5s\" }",
            ),
            key: "routes[0].limits[0].lease_ttl",
            line_of: Some("lease_ttl"),
            message: "`lease_ttl` belongs to a `concurrent` limit",
        },
        Case {
            what: "lease_ttl under 1s",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ concurrent = 4, lease_ttl = \"100ms\" }",
            ),
            key: "routes[0].limits[0].lease_ttl",
            line_of: Some("lease_ttl"),
            message: "is shorter than 1s",
        },
        Case {
            what: "two concurrent limits under one key",
            toml: edit(
                "limits = [ { requests = 10, window = \"1m\" } ]",
                "limits = [\n  { concurrent = 4 },\n  { concurrent = 8, lease_ttl = \"1m\" },\n]",
            ),
            key: "routes[0].limits[1].key",
            line_of: Some("concurrent = 8"),
            message: "a second limit with the policy name",
        },
        Case {
            what: "bad listen address",
            toml: edit("listen = \"127.0.0.1:18080\"", "listen = \"127.0.0.1\""),
            key: "server.listen",
            line_of: Some("listen = \"127.0.0.1\""),
            message: "invalid socket address",
        },
        Case {
            what: "bad CIDR",
            toml: edit("[\"10.0.0.0/8\"]", "[\"10.0.0.0/8\", \"10.0.0.0/33\"]"),
            key: "client_ip.trusted_proxies[1]",
            line_of: Some("10.0.0.0/33"),
            message: "invalid IP address",
        },
        Case {
            what: "unknown key spec",
            toml: edit("key = \"client_ip\"", "key = \"body:session\""),
            key: "routes[0].key",
            line_of: Some("body:session"),
            message: "unknown key \"body:session\"",
        },
        Case {
            what: "bad header key spec",
            toml: edit("key = \"client_ip\"", "key = \"header:X Api Key\""),
            key: "routes[0].key",
            line_of: Some("header:X Api Key"),
            message: "invalid header name",
        },
        Case {
            what: "bad method",
            toml: edit("methods = [\"GET\", \"POST\"]", "methods = [\"GET\", \"GE T\"]"),
            key: "routes[0].methods[1]",
            line_of: Some("GE T"),
            message: "invalid method \"GE T\"",
        },
        Case {
            what: "wrong type for route name",
            toml: edit("name = \"api\"", "name = 5"),
            key: "routes[0].name",
            line_of: Some("name = 5"),
            message: "invalid type",
        },
        Case {
            what: "wrong type for threads",
            toml: edit("grace_period = \"1s\"", "threads = \"two\""),
            key: "server.threads",
            line_of: Some("threads = \"two\""),
            message: "invalid type",
        },
        Case {
            what: "redis without url",
            toml: edit("backend = \"memory\"", "backend = \"redis\""),
            key: "store.url",
            line_of: Some("backend = \"redis\""),
            message: "required with backend = \"redis\"",
        },
        Case {
            what: "local fallback without a shared store",
            toml: edit("backend = \"memory\"", "backend = \"memory\"\non_error = \"local\""),
            key: "store.on_error",
            line_of: Some("on_error = \"local\""),
            message: "needs a shared store",
        },
        Case {
            what: "a route's local fallback without a shared store",
            toml: edit("key = \"client_ip\"", "key = \"client_ip\"\non_error = \"local\""),
            key: "routes[0].on_error",
            line_of: Some("on_error = \"local\""),
            message: "needs a shared store",
        },
        // Parses, but `timeout * 4` in the Redis store would overflow and panic.
        Case {
            what: "huge store timeout",
            toml: edit(
                "backend = \"memory\"",
                "backend = \"memory\"\ntimeout = \"300000000000years\"",
            ),
            key: "store.timeout",
            line_of: Some("300000000000years"),
            message: "longer than 1m",
        },
        Case {
            what: "store timeout just over 60s",
            toml: edit(
                "backend = \"memory\"",
                "backend = \"memory\"\ntimeout = \"60001ms\"",
            ),
            key: "store.timeout",
            line_of: Some("60001ms"),
            message: "longer than 1m",
        },
        Case {
            what: "zero store timeout",
            toml: edit("backend = \"memory\"", "backend = \"memory\"\ntimeout = \"0s\""),
            key: "store.timeout",
            line_of: Some("timeout = \"0s\""),
            message: "shorter than 1ms",
        },
        Case {
            what: "unparseable store timeout",
            toml: edit("backend = \"memory\"", "backend = \"memory\"\ntimeout = \"fast\""),
            key: "store.timeout",
            line_of: Some("\"fast\""),
            message: "invalid duration \"fast\"",
        },
        Case {
            what: "window over 30 days",
            toml: edit("window = \"1m\"", "window = \"31days\""),
            key: "routes[0].limits[0].window",
            line_of: Some("\"31days\""),
            message: "longer than 30days",
        },
        Case {
            what: "huge window",
            toml: edit("window = \"1m\"", "window = \"300000000000years\""),
            key: "routes[0].limits[0].window",
            line_of: Some("300000000000years"),
            message: "longer than 30days",
        },
        Case {
            what: "grace period over 1h",
            toml: edit("grace_period = \"1s\"", "grace_period = \"61min\""),
            key: "server.grace_period",
            line_of: Some("\"61min\""),
            message: "longer than 1h",
        },
        Case {
            what: "shutdown delay over 10 min",
            toml: edit("grace_period = \"1s\"", "shutdown_delay = \"11min\""),
            key: "server.shutdown_delay",
            line_of: Some("\"11min\""),
            message: "longer than 10m",
        },
        Case {
            what: "state file with a shared store",
            toml: edit(
                "backend = \"memory\"",
                "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nstate_file = \"/tmp/w\"",
            ),
            key: "store.state_file",
            line_of: Some("state_file"),
            message: "only with backend = \"memory\"",
        },
        Case {
            what: "state file in a directory that does not exist",
            toml: edit(
                "backend = \"memory\"",
                "backend = \"memory\"\nstate_file = \"/nonexistent-dir/windows.state\"",
            ),
            key: "store.state_file",
            line_of: Some("state_file"),
            message: "directory /nonexistent-dir does not exist",
        },
        Case {
            what: "unparseable grace period",
            toml: edit("grace_period = \"1s\"", "grace_period = \"soon\""),
            key: "server.grace_period",
            line_of: Some("\"soon\""),
            message: "invalid duration \"soon\"",
        },
        Case {
            what: "admin_listen equals listen",
            toml: edit("127.0.0.1:19090", "127.0.0.1:18080"),
            key: "server.admin_listen",
            line_of: Some("admin_listen"),
            message: "must differ from server.listen",
        },
        Case {
            what: "admin_listen wildcard same port",
            toml: edit("127.0.0.1:19090", "0.0.0.0:18080"),
            key: "server.admin_listen",
            line_of: Some("admin_listen"),
            message: "overlaps server.listen",
        },
        Case {
            what: "listen IPv6 wildcard same port",
            toml: edit("\"127.0.0.1:18080\"", "\"[::]:19090\""),
            key: "server.admin_listen",
            line_of: Some("admin_listen"),
            message: "overlaps server.listen",
        },
        Case {
            what: "admin_listen IPv4-mapped same socket",
            toml: edit("127.0.0.1:19090", "[::ffff:127.0.0.1]:18080"),
            key: "server.admin_listen",
            line_of: Some("admin_listen"),
            message: "overlaps server.listen",
        },
        Case {
            what: "host with two trailing dots",
            toml: edit(
                "path_prefix = \"/api\"",
                "host = \"api.example.com..\"\npath_prefix = \"/api\"",
            ),
            key: "routes[0].host",
            line_of: Some("api.example.com.."),
            message: "must be a host name",
        },
        Case {
            what: "host that is only a dot",
            toml: edit(
                "path_prefix = \"/api\"",
                "host = \".\"\npath_prefix = \"/api\"",
            ),
            key: "routes[0].host",
            line_of: Some("host = \".\""),
            message: "must be a host name",
        },
        Case {
            what: "client_header_timeout of zero",
            toml: edit("grace_period = \"1s\"", "client_header_timeout = \"0s\""),
            key: "server.client_header_timeout",
            line_of: Some("client_header_timeout"),
            message: "is shorter than 1ms",
        },
        Case {
            what: "client_body_timeout of zero",
            toml: edit("grace_period = \"1s\"", "client_body_timeout = \"0s\""),
            key: "server.client_body_timeout",
            line_of: Some("client_body_timeout"),
            message: "is shorter than 1ms",
        },
        Case {
            what: "send_timeout over an hour",
            toml: edit("grace_period = \"1s\"", "send_timeout = \"2h\""),
            key: "server.send_timeout",
            line_of: Some("send_timeout"),
            message: "is longer than 1h",
        },
        Case {
            what: "keepalive_timeout not a duration",
            toml: edit("grace_period = \"1s\"", "keepalive_timeout = \"soon\""),
            key: "server.keepalive_timeout",
            line_of: Some("keepalive_timeout"),
            message: "invalid duration",
        },
        Case {
            what: "max_connections of zero",
            toml: edit("grace_period = \"1s\"", "max_connections = 0"),
            key: "server.max_connections",
            line_of: Some("max_connections"),
            message: "between 1 and 1000000",
        },
        Case {
            what: "max_memory with an unknown unit",
            toml: edit("backend = \"memory\"", "backend = \"memory\"\nmax_memory = \"32XB\""),
            key: "store.max_memory",
            line_of: Some("max_memory"),
            message: "unit must be B, KB, MB or GB",
        },
        Case {
            what: "max_memory below 1MB",
            toml: edit("backend = \"memory\"", "backend = \"memory\"\nmax_memory = \"64KB\""),
            key: "store.max_memory",
            line_of: Some("max_memory"),
            message: "smaller than 1MB",
        },
        Case {
            what: "deny_cache_max_age of zero",
            toml: edit(
                "backend = \"memory\"",
                "backend = \"memory\"\ndeny_cache_max_age = \"0s\"",
            ),
            key: "store.deny_cache_max_age",
            line_of: Some("deny_cache_max_age"),
            message: "is shorter than 1ms",
        },
        Case {
            what: "upstream read_timeout of zero",
            toml: edit(
                "servers = [\"127.0.0.1:3000\"]",
                "servers = [\"127.0.0.1:3000\"]\nread_timeout = \"0s\"",
            ),
            key: "upstreams.app.read_timeout",
            line_of: Some("read_timeout"),
            message: "is shorter than 1ms",
        },
        Case {
            what: "path_case_insensitive not a bool",
            toml: edit(
                "path_prefix = \"/api\"",
                "path_prefix = \"/api\"\npath_case_insensitive = \"yes\"",
            ),
            key: "routes[0].path_case_insensitive",
            line_of: Some("path_case_insensitive"),
            message: "expected a boolean",
        },
        Case {
            what: "tls listen without cert",
            toml: edit("grace_period = \"1s\"", "grace_period = \"1s\"\ntls_listen = \"127.0.0.1:18443\""),
            key: "server.tls_cert",
            line_of: Some("tls_listen"),
            message: "required with server.tls_listen",
        },
        Case {
            what: "tls key without listener",
            toml: edit("grace_period = \"1s\"", "grace_period = \"1s\"\ntls_key = \"/k.pem\""),
            key: "server.tls_key",
            line_of: Some("tls_key"),
            message: "only used with server.tls_listen",
        },
        Case {
            what: "tls listen on the admin port",
            toml: edit(
                "grace_period = \"1s\"",
                "grace_period = \"1s\"\ntls_listen = \"0.0.0.0:19090\"\ntls_cert = \"/c\"\ntls_key = \"/k\"",
            ),
            key: "server.tls_listen",
            line_of: Some("tls_listen"),
            message: "overlaps server.admin_listen",
        },
        Case {
            what: "sni without tls",
            toml: edit("servers = [\"127.0.0.1:3000\"]", "servers = [\"127.0.0.1:3000\"]\nsni = \"app\""),
            key: "upstreams.app.sni",
            line_of: Some("sni = "),
            message: "only used with tls = true",
        },
        Case {
            what: "bad sni",
            toml: edit(
                "servers = [\"127.0.0.1:3000\"]",
                "servers = [\"127.0.0.1:3000\"]\ntls = true\nsni = \"not a name\"",
            ),
            key: "upstreams.app.sni",
            line_of: Some("sni = "),
            message: "not a DNS name",
        },
        Case {
            what: "unknown forwarded header",
            toml: edit(
                "grace_period = \"1s\"",
                "grace_period = \"1s\"\nforwarded_headers = [\"X-Forwarded-For\", \"x-forwarded-host\"]",
            ),
            key: "server.forwarded_headers[1]",
            line_of: Some("forwarded_headers"),
            message: "one of x-forwarded-for, x-forwarded-proto, x-real-ip, forwarded",
        },
        Case {
            what: "forwarded header twice",
            toml: edit(
                "grace_period = \"1s\"",
                "grace_period = \"1s\"\nforwarded_headers = [\"x-real-ip\", \"X-Real-IP\"]",
            ),
            key: "server.forwarded_headers[1]",
            line_of: Some("forwarded_headers"),
            message: "x-real-ip is listed twice",
        },
        Case {
            what: "unknown request id mode",
            toml: edit("grace_period = \"1s\"", "grace_period = \"1s\"\nrequest_id = \"always\""),
            key: "server.request_id",
            line_of: Some("request_id"),
            message: "unknown variant `always`",
        },
        Case {
            what: "unknown log format",
            toml: format!("{BASE}\n[log]\naccess = \"stdout\"\nformat = \"xml\"\n"),
            key: "log.format",
            line_of: Some("format = \"xml\""),
            message: "unknown variant `xml`",
        },
        Case {
            what: "quota without unit = cost",
            toml: edit("{ requests = 10, window = \"1m\" }", "{ quota = 10, window = \"1m\" }"),
            key: "routes[0].limits[0].quota",
            line_of: Some("{ quota = 10"),
            message: "unit = \"cost\"",
        },
        Case {
            what: "a cost limit counting requests",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ requests = 10, window = \"1m\", unit = \"cost\" }",
            ),
            key: "routes[0].limits[0].requests",
            line_of: Some("unit = \"cost\""),
            message: "`quota`",
        },
        Case {
            what: "unknown unit",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ quota = 10, window = \"1m\", unit = \"tokens\" }",
            ),
            key: "routes[0].limits[0].unit",
            line_of: Some("unit = \"tokens\""),
            message: "unknown variant `tokens`",
        },
        Case {
            what: "a cost limit whose window no default slot divides",
            toml: edit(
                "{ requests = 10, window = \"1m\" }",
                "{ quota = 10, window = \"60013ms\", unit = \"cost\" }",
            ),
            key: "routes[0].limits[0].window",
            line_of: Some("60013ms"),
            message: "give this cost limit a `resolution`",
        },
        Case {
            what: "settle from something other than a response field",
            toml: edit("key = \"client_ip\"", "key = \"client_ip\"\nsettle = \"body:tokens\""),
            key: "routes[0].settle",
            line_of: Some("settle = \"body:tokens\""),
            message: "\"header:<Name>\"",
        },
        Case {
            what: "settle on a route without a cost limit",
            toml: edit("key = \"client_ip\"", "key = \"client_ip\"\nsettle = \"header:X-Used\""),
            key: "routes[0].settle",
            line_of: Some("settle = \"header:X-Used\""),
            message: "unit = \"cost\"",
        },
        Case {
            what: "cost from a query parameter",
            toml: edit("key = \"client_ip\"", "key = \"client_ip\"\ncost = \"query:n\""),
            key: "routes[0].cost",
            line_of: Some("cost = \"query:n\""),
            message: "\"header:<Name>\"",
        },
        Case {
            what: "empty access log path",
            toml: format!("{BASE}\n[log]\naccess = \"\"\n"),
            key: "log.access",
            line_of: Some("access = \"\""),
            message: "a file path",
        },
    ];
    // Check every case and report all failures at once.
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            std::panic::catch_unwind(|| assert_refused(dir.path(), case))
                .err()
                .map(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `BASE` edited, loaded through `from_toml`, expected to be accepted.
fn accepted(toml: &str) -> Config {
    Config::from_toml(Path::new("accepted.toml"), toml)
        .unwrap_or_else(|e| panic!("refused: {e}\n{toml}"))
}

#[test]
fn forwarded_headers_and_request_id_default_to_all_and_on() {
    use slidegate::config::{ForwardedHeader, ForwardedHeaders, RequestIdMode};
    let c = accepted(BASE);
    assert_eq!(c.forwarded_headers, ForwardedHeaders::all());
    assert_eq!(c.request_id, RequestIdMode::On);
    let c = accepted(&edit(
        "grace_period = \"1s\"",
        "grace_period = \"1s\"\nforwarded_headers = [\"X-Forwarded-For\"]\nrequest_id = \"upstream\"",
    ));
    assert_eq!(
        c.forwarded_headers,
        ForwardedHeaders::NONE.with(ForwardedHeader::XForwardedFor)
    );
    assert_eq!(c.request_id, RequestIdMode::Upstream);
    let c = accepted(&edit(
        "grace_period = \"1s\"",
        "grace_period = \"1s\"\nforwarded_headers = []\nrequest_id = \"off\"",
    ));
    assert_eq!(c.forwarded_headers, ForwardedHeaders::NONE);
    assert_eq!(c.request_id, RequestIdMode::Off);
}

#[test]
fn duration_bounds_are_inclusive() {
    let store = |t: &str| {
        accepted(&edit(
            "backend = \"memory\"",
            &format!("backend = \"memory\"\ntimeout = \"{t}\""),
        ))
        .store
        .timeout
    };
    assert_eq!(store("1ms"), Duration::from_millis(1));
    assert_eq!(store("60s"), Duration::from_secs(60));
    // The default when the key is absent.
    assert_eq!(accepted(BASE).store.timeout, Duration::from_millis(50));

    let window = |w: &str| {
        accepted(&edit("window = \"1m\"", &format!("window = \"{w}\""))).routes[0].limits[0].window
    };
    assert_eq!(window("1ms"), Duration::from_millis(1));
    assert_eq!(window("30days"), Duration::from_secs(30 * 86_400));

    let grace = |g: &str| {
        accepted(&edit(
            "grace_period = \"1s\"",
            &format!("grace_period = \"{g}\""),
        ))
        .server
        .grace_period
    };
    assert_eq!(grace("0s"), Duration::ZERO);
    assert_eq!(grace("1h"), Duration::from_secs(3600));
    // The default when the key is absent.
    assert_eq!(
        accepted(&edit("grace_period = \"1s\"", ""))
            .server
            .grace_period,
        Duration::from_secs(5)
    );
}

#[test]
fn distinct_listeners_are_accepted() {
    // Same IP family wildcard, different ports.
    accepted(&edit("127.0.0.1:18080", "0.0.0.0:18080"));
    // Same port, distinct specific addresses.
    accepted(&edit("127.0.0.1:19090", "127.0.0.2:18080"));
    // Ephemeral ports never collide.
    accepted(&edit("127.0.0.1:18080", "0.0.0.0:0").replacen("127.0.0.1:19090", "127.0.0.1:0", 1));
}

#[test]
fn get_routes_also_limit_head() {
    let methods = |m: &str| {
        accepted(&edit(
            "methods = [\"GET\", \"POST\"]",
            &format!("methods = {m}"),
        ))
        .routes[0]
            .matching
            .methods
            .clone()
    };
    assert_eq!(methods(r#"["GET"]"#), vec![Method::GET, Method::HEAD]);
    assert_eq!(methods(r#"["get"]"#), vec![Method::GET, Method::HEAD]);
    assert_eq!(
        accepted(BASE).routes[0].matching.methods,
        vec![Method::GET, Method::POST, Method::HEAD]
    );
    // Already listed: not duplicated.
    assert_eq!(
        methods(r#"["HEAD", "GET"]"#),
        vec![Method::HEAD, Method::GET]
    );
    // No GET: HEAD is not added.
    assert_eq!(methods(r#"["POST"]"#), vec![Method::POST]);
    // No methods still means any method.
    assert!(methods("[]").is_empty());
}

#[test]
fn host_trailing_dot_is_stripped() {
    let host = |h: &str| {
        accepted(&edit(
            "path_prefix = \"/api\"",
            &format!("host = \"{h}\"\npath_prefix = \"/api\""),
        ))
        .routes[0]
            .matching
            .host
            .clone()
    };
    assert_eq!(
        host("api.example.com."),
        Some(HostMatch::Exact("api.example.com".into()))
    );
    assert_eq!(
        host("API.Example.COM."),
        Some(HostMatch::Exact("api.example.com".into()))
    );
    assert_eq!(
        host("*.example.com."),
        Some(HostMatch::Suffix(".example.com".into()))
    );
    assert_eq!(
        host("api.example.com"),
        Some(HostMatch::Exact("api.example.com".into()))
    );
}
