//! The files an operator deploys with, checked without a container engine or systemd running
//! it: the Dockerfile and compose file refer to files that exist, the image's default config
//! passes `slidegate -t` with compose's variables, `slidegate healthcheck` (the HEALTHCHECK)
//! tells a serving proxy from nothing, the systemd unit passes `systemd-analyze verify`, and the
//! logrotate snippet's SIGUSR1 really reopens the access log.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cli::check_config;
use common::compose::service_env;
use common::control::{poll_until, slidegate};
use common::proxy::{closed_addr, free_port, get, ConfigBuilder, Proxy, ProxyOptions};
use common::require_tool;
use common::upstream::Upstream;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every local `COPY` source of the Dockerfile exists and is not excluded by .dockerignore;
/// the image has a HEALTHCHECK through `slidegate healthcheck`; compose gives every service a
/// restart policy and the replicas a healthcheck that Prometheus waits for.
#[test]
fn dockerfile_and_compose_refer_to_what_exists() {
    let dockerfile = read("Dockerfile");
    let ignore = read(".dockerignore");
    for excluded in ["target/", ".git/"] {
        assert!(
            ignore.lines().any(|l| l == excluded),
            ".dockerignore lacks {excluded}"
        );
    }
    let sources: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            parts[..parts.len() - 1].to_vec()
        })
        .collect();
    assert!(
        sources.contains(&"deploy/image/slidegate.toml"),
        "{sources:?}"
    );
    for src in &sources {
        assert!(
            repo(src).exists(),
            "Dockerfile copies {src}, which does not exist"
        );
        let top = src.split('/').next().unwrap();
        assert!(
            !ignore.lines().any(|l| l.trim_end_matches('/') == top),
            ".dockerignore excludes {src}, which the Dockerfile copies"
        );
    }
    assert!(dockerfile.contains("strip = true") || read("Cargo.toml").contains("strip = true"));
    let health = dockerfile
        .lines()
        .skip_while(|l| !l.starts_with("HEALTHCHECK"))
        .take(2)
        .collect::<String>();
    assert!(health.contains("\"healthcheck\""), "HEALTHCHECK: {health}");
    assert!(dockerfile.contains("/usr/local/bin/slidegate"));

    let compose = read("deploy/docker-compose.yml");
    let services = [
        "redis",
        "demo",
        "slidegate-a",
        "slidegate-b",
        "prometheus",
        "grafana",
    ];
    for s in services {
        let block: String = compose
            .lines()
            .skip_while(|l| l.trim_end() != format!("  {s}:"))
            .skip(1)
            .take_while(|l| l.starts_with("   ") || l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            block.contains("restart: unless-stopped"),
            "{s} has no restart policy"
        );
        if s.starts_with("slidegate-") {
            assert!(
                block.contains("healthcheck:") && block.contains("\"healthcheck\""),
                "{s}"
            );
            assert!(
                block.contains("condition: service_healthy"),
                "{s} waits for Redis"
            );
        }
    }
    assert_eq!(compose.matches("condition: service_healthy").count(), 4);
}

/// Compose publishes every port on loopback only, and Grafana has no anonymous access and no
/// way to start without an admin password of the operator's own (so never admin/admin).
#[test]
fn compose_binds_loopback_and_grafana_needs_a_password() {
    let compose = read("deploy/docker-compose.yml");
    // The entries of every `ports:` list.
    let mut mappings = Vec::new();
    let mut in_ports = false;
    for line in compose.lines() {
        if line.trim() == "ports:" {
            in_ports = true;
        } else if let Some(entry) = line.trim().strip_prefix("- ").filter(|_| in_ports) {
            mappings.push(entry.trim_matches('"'));
        } else {
            in_ports = false;
        }
    }
    assert!(mappings.len() >= 6, "port mappings found: {mappings:?}");
    for m in &mappings {
        assert!(
            m.starts_with("127.0.0.1:"),
            "compose publishes {m} beyond loopback"
        );
    }
    let grafana = service_env(&compose, "grafana");
    let get = |key: &str| {
        grafana
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("grafana environment lacks {key}: {grafana:?}"))
    };
    assert_eq!(get("GF_AUTH_ANONYMOUS_ENABLED"), "false");
    let password = get("GF_SECURITY_ADMIN_PASSWORD");
    assert!(
        password.starts_with("${") && password.contains(":?"),
        "Grafana's admin password must be a required variable, not {password}"
    );
}

/// Both base images are pinned to an exact release, not a floating tag.
#[test]
fn dockerfile_pins_its_base_images() {
    let dockerfile = read("Dockerfile");
    let images: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(images.len(), 2, "{images:?}");
    for image in images {
        let tag = image.split_once(':').map(|(_, t)| t).unwrap_or("");
        // An exact release is at least major.minor (Debian's point release `12.11`, Rust's
        // `1.95.0`): `1-bookworm`, `bookworm-slim` or `latest` float.
        let version: Vec<&str> = tag.split('-').next().unwrap().split('.').collect();
        assert!(
            version.len() >= 2 && version.iter().all(|p| p.parse::<u32>().is_ok()),
            "FROM {image} is not pinned to an exact release"
        );
    }
}

/// The image's default config needs its variables (an unset one names itself) and passes
/// `-t` with compose's. `-t` then resolves upstream hosts, and compose's `demo` resolves only
/// inside the compose network: that one failure, naming it, is accepted and reported.
#[test]
fn image_config_passes_t_with_compose_variables() {
    let config = repo("deploy/image/slidegate.toml");
    let bare = check_config(&config, &[]);
    assert!(!bare.ok);
    assert!(bare.stderr.contains("SLIDEGATE_"), "{}", bare.output());
    assert!(bare.stderr.contains("is not set"), "{}", bare.output());

    let env = service_env(&read("deploy/docker-compose.yml"), "slidegate-a");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(env.len(), 3, "{env:?}");
    let out = check_config(&config, &env);
    if !out.ok {
        assert!(
            out.stderr.contains("upstreams.app.servers: demo:80") && out.stderr.contains("resolve"),
            "{}",
            out.output()
        );
        eprintln!(
            "NOTE: valid; only `demo` does not resolve outside compose: {}",
            out.stderr.trim()
        );
    }
    // With an upstream that resolves here, nothing else stands in the way.
    let mut local = env.clone();
    local.retain(|(k, _)| *k != "SLIDEGATE_UPSTREAM");
    local.push(("SLIDEGATE_UPSTREAM", "127.0.0.1:3000"));
    let out = check_config(&config, &local);
    assert!(out.ok, "{}", out.output());
}

/// `slidegate healthcheck` exits 0 against a serving proxy (its admin listener on 0.0.0.0,
/// probed over loopback) and 1, saying why, when nothing listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_against_a_running_proxy_and_1_against_nothing() {
    let up = Upstream::start();
    let proxy = Proxy::start(&ConfigBuilder::unlimited(up.addr()));
    let started = Instant::now();
    let out = slidegate(&["healthcheck"], proxy.config_path(), &[]);
    let took = started.elapsed();
    assert!(out.ok, "{}", out.output());

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nothing.toml");
    let nothing = closed_addr();
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"0.0.0.0:{}\"\n\n{}",
            free_port(),
            nothing.port(),
            ConfigBuilder::unlimited(up.addr())
        ),
    )
    .unwrap();
    let started = Instant::now();
    let down = slidegate(&["healthcheck", "--timeout", "1s"], &config, &[]);
    let took_down = started.elapsed();
    assert!(!down.ok);
    assert!(
        down.stderr.contains("cannot connect to 127.0.0.1:"),
        "{}",
        down.output()
    );
    println!("healthcheck: 0 in {took:?} against a proxy, 1 in {took_down:?} against nothing");
}

/// The unit passes `systemd-analyze verify` (with ExecStart pointed at the built binary, since
/// the check needs the file to exist), and names the path the Dockerfile installs to.
#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    require_tool("systemd-analyze", "systemd");
    let unit = read("deploy/systemd/slidegate.service");
    for key in [
        "ExecReload=/bin/kill -HUP $MAINPID",
        "LimitNOFILE=",
        "NoNewPrivileges=true",
    ] {
        assert!(unit.contains(key), "unit lacks {key}");
    }
    assert!(unit.contains("ProtectSystem=strict"));
    assert!(read("Dockerfile").contains("/usr/local/bin/slidegate"));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("slidegate.service");
    let bin = env!("CARGO_BIN_EXE_slidegate");
    std::fs::write(&copy, unit.replace("/usr/local/bin/slidegate", bin)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("systemd-analyze verify: {} {}", out.status, stderr.trim());
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("slidegate.service"),
        "complaints: {stderr}"
    );
}

/// The unit's comment tells how to signal the service from a shell (`sudo env TMPDIR=/run/slidegate
/// slidegate -s reload -c …`): that command, run with the unit's TMPDIR against a proxy started
/// with it and default paths, reloads it; the same command without that TMPDIR (a shell's own)
/// does not find the pid file, which is why the comment gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_units_shell_signal_command_finds_the_pid_file() {
    let unit = read("deploy/systemd/slidegate.service");
    let runtime = "/run/slidegate";
    assert!(unit.contains("RuntimeDirectory=slidegate"));
    assert!(unit.contains(&format!("Environment=TMPDIR={runtime}")));
    let line = unit
        .lines()
        .find(|l| l.contains("-s reload"))
        .expect("the unit says how to reload from a shell");
    let command = line
        .trim_start_matches('#')
        .trim()
        .strip_prefix(&format!(
            "sudo env TMPDIR={runtime} /usr/local/bin/slidegate "
        ))
        .unwrap_or_else(|| panic!("not the expected command: {line}"));
    let args: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(
        args,
        ["-s", "reload", "-c", "/etc/slidegate/slidegate.toml"]
    );

    let up = Upstream::start();
    let run = tempfile::tempdir().unwrap();
    let tmpdir = run.path().display().to_string();
    let proxy = Proxy::start_with(
        &ConfigBuilder::unlimited(up.addr()),
        ProxyOptions {
            default_paths: true,
            env: vec![("TMPDIR".into(), tmpdir.clone())],
            ..ProxyOptions::default()
        },
    );
    proxy.wait_signal_handler(libc::SIGHUP, Duration::from_secs(10));
    let reloads = || common::admin::reloads(&proxy, "ok");
    // A shell's TMPDIR (not the unit's): the pid file is not found.
    let other = tempfile::tempdir().unwrap();
    let shell = slidegate(
        &args[..2],
        proxy.config_path(),
        &[("TMPDIR", &other.path().display().to_string())],
    );
    assert!(!shell.ok, "{shell:?}");
    assert!(
        shell.stderr.contains("cannot read pid file"),
        "{}",
        shell.stderr
    );
    // The comment's command, with the unit's TMPDIR.
    let given = slidegate(&args[..2], proxy.config_path(), &[("TMPDIR", &tmpdir)]);
    assert!(given.ok, "{given:?}");
    let took = poll_until(Duration::from_secs(10), || reloads() == 1);
    println!(
        "-s reload with the unit's TMPDIR: reloaded after {took:?}; without: {}",
        shell.stderr.trim()
    );
    assert!(took.is_some(), "no reload; log:\n{}", proxy.log());
}

/// What the logrotate snippet does, done by hand: move the access log, send SIGUSR1 (here via
/// `slidegate -s reopen`), and the next request's line lands in a new file at the old path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logrotate_snippet_signal_reopens_the_access_log() {
    let rotate = read("deploy/logrotate/slidegate");
    let directives: Vec<&str> = rotate
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert!(
        directives.iter().any(|l| l.contains("--signal=USR1")),
        "{rotate}"
    );
    assert!(!directives.contains(&"copytruncate"), "{rotate}");
    assert!(rotate.contains("/var/log/slidegate/"));
    assert!(read("deploy/systemd/slidegate.service").contains("LogsDirectory=slidegate"));

    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let toml = ConfigBuilder::new()
        .upstream("app", up.addr())
        .route("all", "")
        .raw(&format!("[log]\naccess = {log:?}\n"))
        .build();
    let proxy = Proxy::start_with(&toml, ProxyOptions::default());
    assert_eq!(get(proxy.addr(), "/before").await.status, 200);
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    poll_until(Duration::from_secs(10), || lines(&log).contains("/before")).expect("first line");
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    proxy.wait_signal_handler(libc::SIGUSR1, Duration::from_secs(10));
    let out = slidegate(&["-s", "reopen"], proxy.config_path(), &[]);
    assert!(out.ok, "{}", out.output());
    poll_until(Duration::from_secs(10), || {
        proxy.log().contains("access log reopened")
    })
    .unwrap_or_else(|| panic!("no reopen; log:\n{}", proxy.log()));
    assert_eq!(get(proxy.addr(), "/after").await.status, 200);
    poll_until(Duration::from_secs(10), || lines(&log).contains("/after"))
        .unwrap_or_else(|| panic!("no line in the new file; log:\n{}", proxy.log()));
    assert!(!lines(&rotated).contains("/after"));
}

/// The image builds with the committed profile-guided optimisation profile (scripts/pgo),
/// which fits only the rustc that trained it and a build with an explicit `--target`: the
/// Dockerfile's Rust image is that rustc, its builds pass `--target` and the profile, and the
/// file is an indexed LLVM profile (not an empty file or a Git LFS pointer).
#[test]
fn the_image_builds_with_a_profile_of_its_own_rustc() {
    let info = read("pgo/profile.txt");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
            .unwrap_or_else(|| panic!("pgo/profile.txt has no `{name}:` line:\n{info}"))
            .to_string()
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let trained_with = field("rustc");
    let trained_with = trained_with.split_whitespace().nth(1).unwrap_or("");
    let dockerfile = read("Dockerfile");
    let builder = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM rust:"))
        .expect("a rust: build stage");
    let image_rustc = builder.split(['-', ' ']).next().unwrap();
    assert_eq!(
        image_rustc, trained_with,
        "the image builds with rustc {image_rustc}, the profile was trained with {trained_with}: \
         run scripts/pgo with that rustc"
    );
    assert!(field("commit").len() >= 40, "{info}");
    assert!(
        dockerfile.contains("ENV RUSTFLAGS=\"-Cprofile-use=/src/pgo/slidegate.profdata\""),
        "the image's build does not use the profile"
    );
    let builds: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.contains("cargo build"))
        .collect();
    assert_eq!(builds.len(), 2, "{builds:?}");
    for build in builds {
        assert!(build.contains("--target"), "{build}");
    }
    let profile = std::fs::read(repo("pgo/slidegate.profdata")).expect("pgo/slidegate.profdata");
    // llvm::IndexedInstrProf::Magic, "\xfflprofi\x81" little-endian.
    assert_eq!(
        &profile[..8],
        b"\xfflprofi\x81",
        "not an indexed LLVM profile"
    );
    assert!(profile.len() > 100_000, "{} bytes", profile.len());
}

/// Every script of `scripts/` parses (`bash -n`, or Python's compiler without running it), and
/// the Python ones take what they share from `scripts/lib/common.py`, which must offer it: a
/// script that defines its own `die` or `free_port` again, or imports a name the library lacks,
/// fails here instead of in the middle of a benchmark.
#[test]
fn every_script_parses_and_shares_its_helpers() {
    require_tool("python3", "python3");
    let lib = read("scripts/lib/common.py");
    let mut checked = 0;
    let mut entries: Vec<_> = std::fs::read_dir(repo("scripts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let first = text.lines().next().unwrap_or_default();
        let out = if first.contains("python3") {
            for shared in ["die", "free_port", "free_ports", "wait"] {
                assert!(
                    !text.contains(&format!("\ndef {shared}(")),
                    "scripts/{name} defines `{shared}` again: import it from scripts/lib/common.py"
                );
            }
            if let Some(line) = text.lines().find(|l| l.starts_with("from common import")) {
                let names = line["from common import".len()..]
                    .split('#')
                    .next()
                    .unwrap();
                for used in names.split(',').map(str::trim) {
                    assert!(
                        lib.contains(&format!("\ndef {used}(")),
                        "scripts/{name} imports `{used}`, which scripts/lib/common.py lacks"
                    );
                }
            }
            Command::new("python3")
                .args([
                    "-c",
                    "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])",
                ])
                .arg(&path)
                .output()
        } else if first.contains("bash") {
            Command::new("bash").arg("-n").arg(&path).output()
        } else {
            continue;
        }
        .expect("run the parser");
        assert!(
            out.status.success(),
            "scripts/{name} does not parse: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} scripts found");
}
