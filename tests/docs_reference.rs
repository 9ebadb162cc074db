//! The operator documentation agrees with the binary: every key `slidegate -T` prints has a row in
//! `docs/configuration.md` under its section, every `slidegate_*` metric the proxy exports has a
//! row in `docs/metrics.md`, every relative link of the README and `docs/` resolves (file and
//! heading), and `.ci/run` runs the test command the README gives.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::proxy::Proxy;
use common::upstream::Upstream;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// `slidegate -T -c <path>`: the effective configuration as TOML.
fn effective(path: &Path) -> toml::Table {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("-T")
        .arg("-c")
        .arg(path)
        .env_remove("RUST_LOG")
        .output()
        .expect("run slidegate -T");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "-T failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.parse().expect("-T prints TOML")
}

/// `(doc section heading, key)` for every key of an effective configuration: the section is the
/// heading of `docs/configuration.md` that documents that table; a limit's keys are rows
/// `limits[].<key>` of the routes table.
fn documented_keys(config: &toml::Table) -> BTreeSet<(String, String)> {
    let mut keys = BTreeSet::new();
    let mut add = |section: &str, table: &toml::Table, prefix: &str| {
        for key in table.keys() {
            keys.insert((section.to_string(), format!("{prefix}{key}")));
        }
    };
    for (name, value) in config {
        match (name.as_str(), value) {
            ("upstreams", toml::Value::Table(pools)) => {
                for pool in pools.values() {
                    add("[upstreams.<name>]", pool.as_table().unwrap(), "");
                }
            }
            ("routes", toml::Value::Array(routes)) => {
                for route in routes {
                    let route = route.as_table().unwrap();
                    add("[[routes]]", route, "");
                    for limit in route
                        .get("limits")
                        .and_then(|l| l.as_array())
                        .into_iter()
                        .flatten()
                    {
                        add("[[routes]]", limit.as_table().unwrap(), "limits[].");
                    }
                }
            }
            (section, toml::Value::Table(table)) => add(&format!("[{section}]"), table, ""),
            (other, _) => panic!("-T printed a top-level value `{other}`"),
        }
    }
    keys
}

/// The text of `docs/configuration.md` under ``### `<section>` `` up to the next heading.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let marker = format!("### `{heading}`");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/configuration.md has no heading {marker}"));
    let rest = &doc[start + marker.len()..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    &rest[..end]
}

/// A config that sets what the example leaves at its default or out: a Redis store, TLS
/// upstreams, every per-route policy.
const RICH: &str = r#"
[server]
listen = "127.0.0.1:1"
admin_listen = "127.0.0.1:2"
admin_token = "t0ken"

[store]
backend = "redis"
url = "redis://127.0.0.1:1/0"
max_delay = "100ms"

[client_ip]
trusted_proxies = ["10.0.0.0/8"]

[upstreams.app]
servers = ["127.0.0.1:3"]
tls = true
sni = "app.internal"

[log]
access = "stdout"
format = "combined"

[[routes]]
name = "api"
path_prefix = "/"
upstream = "app"
key = ["header:X-Api-Key", "client_ip"]
count_status = [401]
max_queue = 4
limits = [{ requests = 10, window = "1s", resolution = "100ms" }]
"#;

#[test]
fn every_key_minus_t_prints_is_in_the_configuration_reference() {
    let doc = read("docs/configuration.md");
    let rich = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(rich.path(), RICH).unwrap();
    let mut keys = documented_keys(&effective(&repo("config/slidegate.toml")));
    keys.extend(documented_keys(&effective(rich.path())));
    assert!(keys.len() > 50, "only {} keys: is -T complete?", keys.len());
    let missing: Vec<String> = keys
        .iter()
        .filter(|(heading, key)| !section(&doc, heading).contains(&format!("| `{key}` |")))
        .map(|(heading, key)| format!("{heading} {key}"))
        .collect();
    assert!(
        missing.is_empty(),
        "keys -T prints without a row in docs/configuration.md: {missing:?}"
    );
}

/// The metric family of an exposition line (`_bucket`, `_sum`, `_count` folded into theirs).
fn family(line: &str) -> Option<&str> {
    let name = line.split(['{', ' ']).next()?;
    if !name.starts_with("slidegate_") {
        return None;
    }
    Some(
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn every_exported_metric_is_in_the_metrics_reference() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&format!(
        r#"
[store]
backend = "memory"
[upstreams.app]
servers = ["{}"]
[log]
access = "stdout"
[[routes]]
name = "r"
path_prefix = "/"
upstream = "app"
limits = [{{ requests = 1, window = "1m" }}]
"#,
        upstream.addr()
    ));
    let client = reqwest::Client::new();
    for _ in 0..2 {
        client
            .get(format!("http://{}/x", proxy.addr()))
            .send()
            .await
            .unwrap();
    }
    let metrics = client
        .get(format!("http://{}/metrics", proxy.admin_addr()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let doc = read("docs/metrics.md");
    let families: BTreeSet<&str> = metrics.lines().filter_map(family).collect();
    assert!(families.len() > 10, "only {families:?}");
    let missing: Vec<&str> = families
        .into_iter()
        .filter(|f| !doc.contains(&format!("`{f}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics exported without a row in docs/metrics.md: {missing:?}"
    );
}

/// GitHub's heading anchor: lower case, punctuation other than `-` and `_` dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_readme_and_docs_resolves() {
    let mut pages = vec![PathBuf::from("README.md")];
    for entry in std::fs::read_dir(repo("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path.strip_prefix(repo("")).unwrap().to_path_buf());
        }
    }
    assert!(pages.len() >= 7, "README and the docs: {pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let text = read(page.to_str().unwrap());
        let dir = page.parent().unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let file_path = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if !repo(file_path.to_str().unwrap()).exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if !frag.is_empty() && file_path.extension().is_some_and(|e| e == "md") {
                let linked = read(file_path.to_str().unwrap());
                if !anchors(&linked).contains(frag) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn ci_runs_the_test_command_the_readme_gives() {
    let readme = read("README.md");
    let tests = &readme[readme.find("## Running the tests").expect("a test section")..];
    let block = tests.split("```sh\n").nth(1).expect("a sh block");
    let command = block.split("\n```").next().unwrap().trim();
    let ci = read(".ci/run");
    let last = ci
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .unwrap();
    assert_eq!(
        last.trim(),
        command,
        ".ci/run must end with the README's test command"
    );
}
