//! `deploy/kubernetes/`, checked without a cluster:
//!
//! - every manifest validates against the Kubernetes API object schemas of the official Python
//!   client (PyPI `kubernetes`, through `scripts/validate-kubernetes`: unknown fields, wrong
//!   types and missing required fields fail), and the documents agree with each other and with
//!   the config: selectors, named ports, probes on `/readyz` and `/healthz` at `admin_listen`'s
//!   port, the ConfigMap mounted as a directory at `--config`'s path with `--watch`, every
//!   `${NAME}` of the config set in the container's env, `terminationGracePeriodSeconds` covering
//!   `shutdown_delay` and the drain, a non-root read-only container with a writable `/tmp`;
//! - the ConfigMap's TOML passes `slidegate -t`;
//! - the binary runs that TOML as the pod would (real Redis, env as the Deployment sets it, the
//!   config under the kubelet's ConfigMap layout with `--watch`), and a ConfigMap update, swapped
//!   in as the kubelet does (a new `..data` symlink renamed over the old), is applied without a
//!   restart.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use common::cli::check_config;
use common::control::poll_until;
use common::proxy::{free_port, http_get_blocking, request};
use common::redis::RedisServer;
use common::upstream::Upstream;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Panic with an install hint unless `python3` imports `kubernetes` and `yaml`.
fn require_kubernetes_client() {
    common::require_tool("python3", "python3");
    let out = Command::new("python3")
        .args([
            "-c",
            "import kubernetes, yaml; print(kubernetes.__version__)",
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the manifest test needs Python's kubernetes client, which `python3` cannot import ({}). \
         Install it with `python3 -m pip install kubernetes` (scripts/test does).",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
}

/// The manifests directly in `deploy/kubernetes/` (what `kubectl apply -f` of it takes).
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("deploy/kubernetes"))
        .expect("deploy/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// `scripts/validate-kubernetes` on `files`: the documents by kind, or its error.
fn validate(files: &[PathBuf]) -> Result<BTreeMap<String, Value>, String> {
    let out = Command::new(repo("scripts/validate-kubernetes"))
        .args(files)
        .output()
        .expect("run scripts/validate-kubernetes");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(stderr);
    }
    println!("{}", stderr.trim());
    let docs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("validator JSON");
    let mut by_kind = BTreeMap::new();
    for d in docs {
        let kind = d["doc"]["kind"].as_str().unwrap().to_string();
        assert!(
            by_kind.insert(kind.clone(), d["doc"].clone()).is_none(),
            "two {kind}s"
        );
    }
    Ok(by_kind)
}

/// The manifests validated, once per test run (the Python client's import takes seconds; the
/// files do not change while the tests run).
fn docs() -> BTreeMap<String, Value> {
    static DOCS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    DOCS.get_or_init(|| {
        require_kubernetes_client();
        validate(&manifest_files()).unwrap_or_else(|e| panic!("{e}"))
    })
    .clone()
}

fn configmap_toml(docs: &BTreeMap<String, Value>) -> String {
    docs["ConfigMap"]["data"]["slidegate.toml"]
        .as_str()
        .expect("ConfigMap data slidegate.toml")
        .to_string()
}

/// The `${NAME}`s a config text reads.
fn env_names(toml: &str) -> Vec<String> {
    let mut names: Vec<String> = toml
        .split("${")
        .skip(1)
        .map(|rest| rest.split('}').next().unwrap().to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// The one `key = "value"` line of `toml` (first match).
fn toml_value<'a>(toml: &'a str, key: &str) -> &'a str {
    toml.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in the ConfigMap's TOML"))
        .trim()
        .trim_matches('"')
}

#[test]
fn the_validator_refuses_what_the_api_server_would() {
    require_kubernetes_client();
    let good = std::fs::read_to_string(repo("deploy/kubernetes/deployment.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (what, from, to) in [
        ("a misspelt field", "path: /readyz", "paht: /readyz"),
        ("a string for an integer", "replicas: 3", "replicas: three"),
        (
            "a missing required field",
            "- name: slidegate\n",
            "- imagePullPolicy: Always\n",
        ),
    ] {
        assert!(good.contains(from), "{from}");
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, good.replacen(from, to, 1)).unwrap();
        let err = validate(&[bad]).expect_err(what);
        println!("{what}: {}", err.trim().lines().next().unwrap_or(""));
    }
}

#[test]
fn manifests_validate_and_agree_with_each_other_and_the_config() {
    let docs = docs();
    let kinds: Vec<&str> = docs.keys().map(String::as_str).collect();
    assert_eq!(
        kinds,
        ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    );
    let toml = configmap_toml(&docs);
    let deploy = &docs["Deployment"];
    let pod = &deploy["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    let selects = |selector: &Value| {
        let s = selector.as_object().expect("selector");
        assert!(!s.is_empty());
        s.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(selects(&deploy["spec"]["selector"]["matchLabels"]));
    assert!(selects(&docs["Service"]["spec"]["selector"]));
    assert!(selects(
        &docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    ));
    assert!(
        docs["PodDisruptionBudget"]["spec"]["maxUnavailable"].as_u64()
            < deploy["spec"]["replicas"].as_u64()
    );

    let spec = &pod["spec"];
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let ports: BTreeMap<&str, u64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports["http"], port_of(toml_value(&toml, "listen")));
    assert_eq!(ports["admin"], port_of(toml_value(&toml, "admin_listen")));
    assert!(
        toml_value(&toml, "admin_listen").starts_with("0.0.0.0:"),
        "probes come from the node"
    );
    for p in docs["Service"]["spec"]["ports"].as_array().unwrap() {
        let target = p["targetPort"].as_str().expect("named targetPort");
        assert!(ports.contains_key(target), "Service targets {target}");
    }
    let probe = |name: &str| {
        let g = &c[name]["httpGet"];
        (g["path"].as_str().unwrap(), g["port"].as_str().unwrap())
    };
    assert_eq!(probe("readinessProbe"), ("/readyz", "admin"));
    assert_eq!(probe("livenessProbe"), ("/healthz", "admin"));

    // The config: the ConfigMap mounted as a directory (a subPath mount never sees an
    // update) at the path --config names, with --watch.
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--watch"), "{args:?}");
    let config = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    let volumes = spec["volumes"].as_array().unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap();
    let mounts = c["volumeMounts"].as_array().unwrap();
    let config_mount = mounts
        .iter()
        .find(|m| {
            volume(m["name"].as_str().unwrap())["configMap"]["name"]
                == docs["ConfigMap"]["metadata"]["name"]
        })
        .expect("the ConfigMap is mounted");
    assert!(config_mount.get("subPath").is_none());
    assert_eq!(
        format!(
            "{}/slidegate.toml",
            config_mount["mountPath"].as_str().unwrap()
        ),
        config
    );
    // Every ${NAME} of the config is set.
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let names = env_names(&toml);
    assert!(!names.is_empty());
    for name in &names {
        assert!(
            env.contains(&name.as_str()),
            "{name} is not in the container's env {env:?}"
        );
    }
    // The Redis URL and the admin token come from a Secret.
    for secret in ["SLIDEGATE_REDIS_URL", "SLIDEGATE_ADMIN_TOKEN"] {
        let e = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == secret)
            .unwrap();
        assert!(
            e["valueFrom"]["secretKeyRef"]["name"].is_string(),
            "{secret}"
        );
    }

    // Draining: SIGTERM, then shutdown_delay of serving with /readyz at 503 (no preStop: the
    // process does it), then at most grace_period of drain, then (if connections are still
    // open) Pingora's runtime shutdown, as long again.
    assert!(
        c["lifecycle"]["preStop"].is_null(),
        "a preStop delay would add to shutdown_delay"
    );
    let secs = |key| {
        humantime::parse_duration(toml_value(&toml, key))
            .unwrap()
            .as_secs()
    };
    let (delay, grace) = (secs("shutdown_delay"), secs("grace_period"));
    let termination = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    let probe = &c["readinessProbe"];
    let noticed =
        probe["periodSeconds"].as_u64().unwrap() * probe["failureThreshold"].as_u64().unwrap();
    println!(
        "shutdown_delay {delay} s, readiness noticed within {noticed} s, grace_period {grace} s, \
         terminationGracePeriodSeconds {termination}"
    );
    assert!(delay >= 5, "endpoint removal takes seconds to propagate");
    assert!(
        delay >= noticed,
        "a balancer probing /readyz notices within the delay"
    );
    assert!(
        termination > delay + 2 * grace,
        "{termination} <= {delay} + 2 x {grace}"
    );

    // Non-root, read-only root filesystem, a writable /tmp for the pid file and upgrade socket.
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(spec["securityContext"]["runAsUser"], 10001);
    assert!(std::fs::read_to_string(repo("Dockerfile"))
        .unwrap()
        .contains("--uid 10001"));
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    let tmp = mounts
        .iter()
        .find(|m| m["mountPath"] == "/tmp")
        .expect("/tmp mounted");
    assert!(volume(tmp["name"].as_str().unwrap())["emptyDir"].is_object());
    let resources = &c["resources"];
    for side in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(resources[side][r].is_string(), "resources.{side}.{r}");
        }
    }
    // The memory limit holds the process at rest (45 MB measured), max_connections open
    // connections (~110 KB each, measured) and the local fallback's max_memory.
    let limit_mib: u64 = resources["limits"]["memory"]
        .as_str()
        .unwrap()
        .trim_end_matches("Mi")
        .parse()
        .unwrap();
    let max_memory_mb: u64 = toml_value(&toml, "max_memory")
        .trim_end_matches("MB")
        .parse()
        .unwrap();
    let connections: u64 = toml_value(&toml, "max_connections").parse().unwrap();
    let worst_mb = 45 + connections * 110 / 1000 + max_memory_mb;
    println!("memory limit {limit_mib} Mi, worst case {worst_mb} MB ({connections} connections)");
    assert!(
        limit_mib * 1_048_576 > worst_mb * 1_000_000 * 5 / 4,
        "{limit_mib} Mi < 1.25 x {worst_mb} MB"
    );

    // The optional ServiceMonitor, uncommented, selects the Service and scrapes its admin port.
    let monitor =
        std::fs::read_to_string(repo("deploy/kubernetes/optional/servicemonitor.yaml")).unwrap();
    let yaml: String = monitor
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .skip_while(|l| !l.starts_with("apiVersion"))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(yaml.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let monitor: Value = serde_json::from_slice(&out.stdout).expect("the ServiceMonitor parses");
    assert_eq!(monitor["kind"], "ServiceMonitor");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        docs["Service"]["metadata"]["labels"]
    );
    let scraped = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert!(docs["Service"]["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == scraped));
}

/// The ConfigMap's TOML passes `slidegate -t` with the env the Deployment gives it (the
/// Secret's values stand-ins); the Deployment's upstream `app:80` resolves only in the
/// cluster: that one failure is accepted, and with an upstream that resolves here it passes.
#[test]
fn the_configmaps_toml_passes_t() {
    let docs = docs();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("slidegate.toml");
    std::fs::write(&file, configmap_toml(&docs)).unwrap();
    let secrets = [
        ("SLIDEGATE_REDIS_URL", "redis://redis:6379/0"),
        ("SLIDEGATE_ADMIN_TOKEN", "a-token-from-the-secret"),
    ];
    let bare = check_config(&file, &[]);
    assert!(
        !bare.ok && bare.stderr.contains("is not set"),
        "{}",
        bare.output()
    );
    let container = &docs["Deployment"]["spec"]["template"]["spec"]["containers"][0];
    let upstream = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SLIDEGATE_UPSTREAM")
        .and_then(|e| e["value"].as_str())
        .unwrap();
    let mut env = secrets.to_vec();
    env.push(("SLIDEGATE_UPSTREAM", upstream));
    let out = check_config(&file, &env);
    if !out.ok {
        assert!(
            out.stderr
                .contains(&format!("upstreams.app.servers: {upstream}"))
                && out.stderr.contains("resolve"),
            "{}",
            out.output()
        );
        eprintln!("NOTE: only `{upstream}` does not resolve outside the cluster");
    }
    env.pop();
    env.push(("SLIDEGATE_UPSTREAM", "127.0.0.1:3000"));
    let out = check_config(&file, &env);
    assert!(out.ok, "{}", out.output());
    println!("slidegate -t: {}", out.stdout.trim());
}

/// The binary, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Write `text` as the kubelet's atomic writer publishes a ConfigMap key: into a fresh
/// timestamped directory, then a new `..data` symlink to it renamed over the old one;
/// `slidegate.toml` is a symlink to `..data/slidegate.toml`.
fn publish(dir: &Path, generation: u32, text: &str) {
    let version = format!("..2026_12_06_00_00_0{generation}.{generation}");
    std::fs::create_dir(dir.join(&version)).unwrap();
    std::fs::write(dir.join(&version).join("slidegate.toml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("slidegate.toml");
    if link.symlink_metadata().is_err() {
        std::os::unix::fs::symlink("..data/slidegate.toml", &link).unwrap();
    }
}

fn statuses_of_posts(addr: std::net::SocketAddr, n: usize) -> Vec<u16> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (0..n)
        .map(|_| {
            rt.block_on(request(addr, "POST", "/login", &[]))
                .expect("POST /login")
                .status
        })
        .collect()
}

#[test]
fn the_pod_runs_the_configmap_and_follows_its_update() {
    let docs = docs();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let (listen, admin) = (free_port(), free_port());
    let toml = configmap_toml(&docs)
        .replace("\"0.0.0.0:8080\"", &format!("\"127.0.0.1:{listen}\""))
        .replace("\"0.0.0.0:9090\"", &format!("\"127.0.0.1:{admin}\""));
    let config_dir = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    publish(config_dir.path(), 1, &toml);
    let config = config_dir.path().join("slidegate.toml");
    let log = tmp.path().join("slidegate.log");
    let child = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["--config", config.to_str().unwrap(), "--watch"])
        .env("TMPDIR", tmp.path())
        .env("SLIDEGATE_UPSTREAM", up.addr().to_string())
        .env("SLIDEGATE_REDIS_URL", redis.url())
        .env("SLIDEGATE_ADMIN_TOKEN", "a-token-from-the-secret")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start slidegate");
    let _running = Running(child);
    let log = || std::fs::read_to_string(&log).unwrap_or_default();
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], listen));
    let get = |path: &str| http_get_blocking(admin, path).map(|(s, _)| s).unwrap_or(0);
    let ready = poll_until(Duration::from_secs(20), || get("/readyz?store") == 200);
    assert!(ready.is_some(), "store never ready; log:\n{}", log());
    assert_eq!((get("/healthz"), get("/readyz")), (200, 200));
    assert!(
        tmp.path().join(format!("slidegate-{listen}.pid")).exists(),
        "pid file in $TMPDIR"
    );
    // login: 5 per second.
    assert_eq!(statuses_of_posts(addr, 6), [200, 200, 200, 200, 200, 429]);

    // The ConfigMap changes: login 2 per second. The kubelet swaps it in; --watch applies it.
    let reloads = || {
        http_get_blocking(admin, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("slidegate_config_reloads_total{result=\"ok\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = reloads();
    let updated = toml.replace(
        "{ requests = 5, window = \"1s\" }",
        "{ requests = 2, window = \"1s\" }",
    );
    assert_ne!(updated, toml);
    publish(config_dir.path(), 2, &updated);
    let took = poll_until(Duration::from_secs(10), || reloads() > before);
    println!("ConfigMap swapped as the kubelet does: applied by --watch after {took:?}");
    assert!(
        took.is_some(),
        "the update was not applied; log:\n{}",
        log()
    );
    // A fresh second for the login bucket (the old window's 6 requests slide out).
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        statuses_of_posts(addr, 3),
        [200, 200, 429],
        "log:\n{}",
        log()
    );
}
