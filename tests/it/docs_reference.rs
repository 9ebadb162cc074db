//! The operator documentation agrees with the binary: every key `slidegate -T` prints has a row in
//! `docs/configuration.md` under its section, every `slidegate_*` metric the proxy exports has a
//! row in `docs/metrics.md`, every relative link of the README and `docs/` resolves (file and
//! heading), and `.ci/run` runs the test command the README gives. The example config shows
//! every key of the schema with its default, and `-T` prints the defaults the reference gives.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::cli::{check_config, effective_config};
use common::proxy::Proxy;
use common::upstream::Upstream;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn effective(path: &Path) -> toml::Table {
    effective_config(path, &[])
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
admin_token = "t0ken-of-16-bytes"

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

/// The README's one test command is `scripts/test`: the first command of the README that
/// looks like a test command is it, `.ci/run` runs exactly it, and it runs every check CI runs.
#[test]
fn ci_runs_the_test_command_the_readme_gives() {
    let readme = read("README.md");
    let tests = &readme[readme.find("## Running the tests").expect("a test section")..];
    let block = tests.split("```sh\n").nth(1).expect("a sh block");
    let command = block.split("\n```").next().unwrap().trim();
    assert_eq!(command, "scripts/test");
    // What a reader (or a tool) scanning the README for the test command finds first, as
    // `grep -Eo '(cargo (nextest run|test)[^`]*|scripts/[A-Za-z0-9_./-]+|make [a-z-]+)'` would.
    let first = readme
        .match_indices("cargo test")
        .chain(readme.match_indices("cargo nextest run"))
        .chain(readme.match_indices("scripts/"))
        .chain(readme.match_indices("make "))
        .min_by_key(|(at, _)| *at)
        .map(|(at, _)| &readme[at..])
        .unwrap();
    assert!(
        first.starts_with("scripts/test")
            && !first["scripts/test".len()..]
                .starts_with(|c: char| c.is_alphanumeric() || "_./-".contains(c)),
        "the README's first test-like command is not scripts/test: {}",
        first.lines().next().unwrap()
    );
    let ci = read(".ci/run");
    let last = ci
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .unwrap();
    assert_eq!(
        last.trim(),
        format!("exec {command}"),
        ".ci/run must end by running the README's test command"
    );
    let script = read(command);
    // Run as a line of its own, with its status kept for later (`check || rc=$?`), or in the
    // background (`(check 2>&1 | tee log) &`, `check >"$logs/name" 2>&1 &`), its status waited
    // for and failing the run.
    let runs = |check: &str| {
        script.lines().map(str::trim).any(|l| {
            l == check
                || l.starts_with(&format!("{check} || "))
                || l.starts_with(&format!("({check} 2>&1 | tee "))
                || l.starts_with(&format!("{check} >\"$logs/"))
        })
    };
    for job in ["tests", "chaos", "gate"] {
        assert!(
            script.contains(&format!("wait \"${job}_pid\" || {job}_rc=$?"))
                && script.contains(&format!("[ \"${job}_rc\" -ne 0 ]")),
            "{command} does not fail on its background job {job}"
        );
    }
    for check in [
        "cargo fmt --all -- --check",
        "cargo test --no-run",
        "cargo test",
        "scripts/instruction-gate",
    ] {
        assert!(runs(check), "{command} does not run `{check}`");
    }
    // Clippy's check of every target (`cargo clippy --all-targets -- -D warnings`), rustdoc's
    // of the library and clippy's of the bench-switches build are made by the test build
    // itself, through the workspace wrapper the script exports before building (what the
    // wrapper checks: the two tests below).
    assert!(
        script
            .lines()
            .any(|l| l.trim()
                == "export RUSTC_WORKSPACE_WRAPPER=\"$PWD/scripts/lib/rustc-with-clippy\""),
        "{command} does not build with clippy's lints"
    );
    let wrapper = read("scripts/lib/rustc-with-clippy");
    assert!(
        wrapper
            .lines()
            .any(|l| l.trim() == "clippy-driver \"$@\" -D warnings || exit"),
        "scripts/lib/rustc-with-clippy does not run clippy-driver with warnings denied"
    );
}

/// Runs scripts/test's workspace wrapper as cargo does (`<wrapper> <rustc> <rustc's arguments>`)
/// on `src`, written into `dir`; `args` are the unit's own (crate name and type, externs).
fn through_the_wrapper(dir: &Path, file: &str, src: &str, args: &[&str]) -> std::process::Output {
    let path = dir.join(file);
    std::fs::write(&path, src).unwrap();
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lib/rustc-with-clippy"))
        .arg("rustc")
        .args(["--edition", "2021"])
        .args(args)
        .arg("--out-dir")
        .arg(dir)
        .arg(&path)
        .output()
        .unwrap()
}

/// The wrapper scripts/test builds with is clippy with warnings denied: a crate with a clippy
/// warning (a needless `return`) fails to compile through it, naming the lint, and the same
/// crate without it compiles.
#[test]
fn the_test_build_fails_on_a_clippy_warning() {
    let dir = tempfile::tempdir().unwrap();
    let compile =
        |body: &str| through_the_wrapper(dir.path(), "lib.rs", body, &["--crate-type", "lib"]);
    let warned = compile("pub fn one() -> u32 {\n    return 1;\n}\n");
    let said = String::from_utf8_lossy(&warned.stderr);
    assert!(
        !warned.status.success() && said.contains("clippy::needless_return"),
        "a clippy warning did not fail the build: {:?}\n{said}",
        warned.status
    );
    let clean = compile("pub fn one() -> u32 {\n    1\n}\n");
    assert!(
        clean.status.success(),
        "a clean crate failed: {}",
        String::from_utf8_lossy(&clean.stderr)
    );
}

/// The same build checks what `RUSTDOCFLAGS="-D warnings" cargo doc --no-deps` and `cargo clippy
/// --lib --features bench-switches -- -D warnings` would, without their second check of the
/// dependency tree: a library named slidegate with a broken doc link, or with a clippy warning
/// only its bench-switches build compiles, fails when its binary is built, naming the lint; the
/// clean library passes both.
#[test]
fn the_test_build_checks_the_library_s_docs_and_its_bench_switches_build() {
    let build = |lib: &str| {
        let dir = tempfile::tempdir().unwrap();
        let features = ["--check-cfg", "cfg(feature, values(\"bench-switches\"))"];
        let lib_args = [
            &["--crate-name", "slidegate", "--crate-type", "lib"][..],
            &features,
        ]
        .concat();
        let compiled = through_the_wrapper(dir.path(), "lib.rs", lib, &lib_args);
        assert!(
            compiled.status.success(),
            "the library did not compile: {}",
            String::from_utf8_lossy(&compiled.stderr)
        );
        let rlib = format!(
            "slidegate={}",
            dir.path().join("libslidegate.rlib").display()
        );
        let bin_args = [
            &[
                "--crate-name",
                "slidegate",
                "--crate-type",
                "bin",
                "--extern",
                &rlib,
            ][..],
            &features,
        ]
        .concat();
        let bin = through_the_wrapper(
            dir.path(),
            "main.rs",
            "fn main() {\n    slidegate::one();\n}\n",
            &bin_args,
        );
        (
            bin.status.success(),
            String::from_utf8_lossy(&bin.stderr).into_owned(),
        )
    };
    let (ok, said) = build("/// One, as [`Nowhere`] says.\npub fn one() -> u32 {\n    1\n}\n");
    assert!(
        !ok && said.contains("rustdoc::broken_intra_doc_links"),
        "a broken doc link did not fail the build: {said}"
    );
    let switched = "pub fn one() -> u32 {\n    two()\n}\n\
                    #[cfg(feature = \"bench-switches\")]\nfn two() -> u32 {\n    return 2;\n}\n\
                    #[cfg(not(feature = \"bench-switches\"))]\nfn two() -> u32 {\n    2\n}\n";
    let (ok, said) = build(switched);
    assert!(
        !ok && said.contains("clippy::needless_return") && said.contains("bench-switches"),
        "a warning in the bench-switches build did not fail the build: {said}"
    );
    let (ok, said) = build("/// One, as [`two`] is two.\npub fn one() -> u32 {\n    two()\n}\n\n/// Two.\npub fn two() -> u32 {\n    2\n}\n");
    assert!(ok, "a clean library failed: {said}");
}

/// On a machine without the tools the tests need and no way to install them (here: a PATH
/// with only a shell and the few utilities the script itself uses, so no `apt-get`), the test
/// command stops before building, naming each missing tool and its package.
#[test]
fn the_test_command_names_missing_tools_and_stops() {
    let bin = tempfile::tempdir().unwrap();
    for tool in ["bash", "dirname", "sort", "id"] {
        let path = String::from_utf8(
            Command::new("bash")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        std::os::unix::fs::symlink(path.trim(), bin.path().join(tool)).unwrap();
    }
    let out = Command::new(repo("scripts/test"))
        .env_clear()
        .env("PATH", bin.path())
        .output()
        .expect("run scripts/test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no apt-get here"), "{stderr}");
    for (tool, package) in [
        ("redis-server", "redis-server"),
        ("python3", "python3"),
        ("systemd-analyze", "systemd"),
        ("chromedriver", "chromium-driver"),
    ] {
        assert!(
            stderr.contains(&format!("missing `{tool}`"))
                && stderr.contains(&format!("apt-get install {package}`")),
            "no message for {tool}: {stderr}"
        );
    }
    assert!(stderr.contains("missing `cargo`"), "{stderr}");
}

/// The smallest valid configuration: only the keys that have no default. `slidegate -T` of it
/// is the code's default for every other key (the `$TMPDIR` of the derived pid file and
/// upgrade socket set to `/tmp`, and the listen port 8080, as the example shows them).
const MINIMAL: &str = r#"[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"

[upstreams.app]
servers = ["127.0.0.1:3000"]

[[routes]]
name = "r"
upstream = "app"
"#;

/// The keys MINIMAL sets: required, so they have no default to compare.
const REQUIRED: [(&str, &str); 5] = [
    ("server", "listen"),
    ("server", "admin_listen"),
    ("upstreams.*", "servers"),
    ("routes", "name"),
    ("routes", "upstream"),
];

/// `-T` of [`MINIMAL`]: `(section, key) -> default`, sections named as in
/// [`schema_fields`] (`upstreams.*`, `routes`).
fn code_defaults() -> std::collections::BTreeMap<(String, String), toml::Value> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), MINIMAL).unwrap();
    let doc = effective_config(file.path(), &[("TMPDIR", "/tmp")]);
    let mut defaults = std::collections::BTreeMap::new();
    let mut add = |section: &str, table: &toml::Table| {
        for (key, value) in table {
            if !REQUIRED.contains(&(section, key.as_str())) {
                defaults.insert((section.to_string(), key.clone()), value.clone());
            }
        }
    };
    for (name, value) in &doc {
        match (name.as_str(), value) {
            ("upstreams", toml::Value::Table(pools)) => {
                add("upstreams.*", pools["app"].as_table().unwrap())
            }
            ("routes", toml::Value::Array(routes)) => add("routes", routes[0].as_table().unwrap()),
            (section, toml::Value::Table(table)) => add(section, table),
            (other, _) => panic!("-T printed a top-level value `{other}`"),
        }
    }
    defaults
}

/// Whether an example's or a document's value is the code's: equal TOML values, where two
/// durations are equal when humantime reads them as the same length (`"60s"` and `"1m"`).
fn same_value(shown: &toml::Value, code: &toml::Value) -> bool {
    if shown == code {
        return true;
    }
    match (shown.as_str(), code.as_str()) {
        (Some(a), Some(b)) => matches!(
            (humantime::parse_duration(a), humantime::parse_duration(b)),
            (Ok(x), Ok(y)) if x == y
        ),
        _ => false,
    }
}

/// A TOML value written on its own (`"5s"`, `[]`, `{ requests = 1 }`), if it is one.
fn toml_value(text: &str) -> Option<toml::Value> {
    let mut table: toml::Table = format!("v = {text}").parse().ok()?;
    table.remove("v")
}

/// Every key the schema (the config's serde types) accepts, as `(section, key)`: sections ""
/// (top level), `server`, `tls`, `tls.certs`, `store`, `client_ip`, `log`, `upstreams.*`,
/// `routes` and `routes.limits`. Each table rejects unknown keys, and serde's error lists the
/// fields it expects, so a probe key in each table makes `slidegate -t` name them all: the
/// list follows the code, with no copy of it kept here.
fn schema_fields() -> BTreeSet<(String, String)> {
    const PROBE: &str = "zz_probe = 1\n";
    let probes = [
        ("", format!("{PROBE}{MINIMAL}")),
        (
            "server",
            MINIMAL.replace("[server]\n", &format!("[server]\n{PROBE}")),
        ),
        ("tls", format!("{MINIMAL}[tls]\n{PROBE}")),
        (
            "tls.certs",
            format!("{MINIMAL}[[tls.certs]]\ncert = \"c\"\nkey = \"k\"\n{PROBE}"),
        ),
        ("store", format!("{MINIMAL}[store]\n{PROBE}")),
        ("client_ip", format!("{MINIMAL}[client_ip]\n{PROBE}")),
        ("log", format!("{MINIMAL}[log]\n{PROBE}")),
        (
            "upstreams.*",
            MINIMAL.replace("servers =", &format!("{PROBE}servers =")),
        ),
        ("routes", format!("{MINIMAL}{PROBE}")),
        ("plans.*", format!("{MINIMAL}[plans.x]\n{PROBE}")),
        (
            "routes.limits",
            format!("{MINIMAL}limits = [{{ requests = 1, window = \"1s\", zz_probe = 1 }}]\n"),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut fields = BTreeSet::new();
    for (section, text) in probes {
        let path = dir.path().join("probe.toml");
        std::fs::write(&path, &text).unwrap();
        let out = check_config(&path, &[]);
        assert!(!out.ok, "the probe key was accepted in [{section}]");
        let expected = out
            .stderr
            .split("unknown field `zz_probe`, expected")
            .nth(1)
            .unwrap_or_else(|| panic!("no list of fields for [{section}]: {}", out.stderr));
        let expected = expected.lines().next().unwrap();
        let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(!names.is_empty(), "[{section}]: {expected}");
        for name in names {
            fields.insert((section.to_string(), name.to_string()));
        }
    }
    fields
}

/// One `key = value` line of the example, set or commented out.
struct ExampleLine {
    section: String,
    key: String,
    value: toml::Value,
    /// The whole line, for the `(example)` mark and messages.
    text: String,
}

/// The keys `config/slidegate.toml` shows, commented out or not, and the tables it names
/// (headers, commented out or not, as `tls.certs`, `upstreams.*`, `routes`). A limit's keys
/// are read from the tables of each `limits = [...]` value, as section `routes.limits`.
fn example_keys(text: &str) -> (BTreeSet<String>, Vec<ExampleLine>) {
    let mut tables = BTreeSet::new();
    let mut lines = Vec::new();
    let mut section = String::new();
    for raw in text.lines() {
        let line = raw.trim_start_matches('#').trim();
        if let Some(header) = line.strip_prefix('[').filter(|_| !line.contains('=')) {
            let name = header.trim_start_matches('[');
            let name = &name[..name.find(']').expect("a closed header")];
            section = match name.split_once('.') {
                Some(("upstreams", _)) => "upstreams.*".to_string(),
                Some(("plans", _)) => "plans.*".to_string(),
                _ => name.to_string(),
            };
            tables.insert(section.clone());
            continue;
        }
        let Some((key, rest)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        {
            continue;
        }
        let value = toml_value(rest.trim())
            .unwrap_or_else(|| panic!("config/slidegate.toml: not a TOML value: {raw}"));
        if key == "limits" {
            for limit in value.as_array().into_iter().flatten() {
                for (k, v) in limit.as_table().expect("a limit is a table") {
                    lines.push(ExampleLine {
                        section: "routes.limits".into(),
                        key: k.clone(),
                        value: v.clone(),
                        text: raw.to_string(),
                    });
                }
            }
        }
        lines.push(ExampleLine {
            section: section.clone(),
            key: key.to_string(),
            value,
            text: raw.to_string(),
        });
    }
    (tables, lines)
}

/// `config/slidegate.toml` says it shows every key with its default: every key of the schema
/// is in it (set or commented out), no key it shows is unknown to the schema, and a value it
/// shows for a key with a default is that default unless its line says `(example)`.
#[test]
fn the_example_config_shows_every_key_of_the_schema_with_its_default() {
    let schema = schema_fields();
    assert!(schema.len() > 70, "only {} keys: {schema:?}", schema.len());
    let (tables, lines) = example_keys(&read("config/slidegate.toml"));
    let shown: BTreeSet<(String, String)> = lines
        .iter()
        .map(|l| (l.section.clone(), l.key.clone()))
        .collect();

    let mut problems = Vec::new();
    for (section, key) in &schema {
        let documented = match section.as_str() {
            // A top-level key is a table: shown by its header (`[[tls.certs]]` shows `tls`).
            "" => tables.iter().any(|t| t.split('.').next() == Some(key)),
            "tls" => tables.contains(&format!("tls.{key}")),
            _ => shown.contains(&(section.clone(), key.clone())),
        };
        if !documented {
            problems.push(format!("[{section}] {key}: missing from the example"));
        }
    }
    for line in &lines {
        if !schema.contains(&(line.section.clone(), line.key.clone())) {
            problems.push(format!(
                "[{}] {}: not a key of the schema: {}",
                line.section, line.key, line.text
            ));
        }
    }
    let defaults = code_defaults();
    for line in &lines {
        let Some(default) = defaults.get(&(line.section.clone(), line.key.clone())) else {
            continue;
        };
        if !same_value(&line.value, default) && !line.text.contains("(example)") {
            problems.push(format!(
                "[{}] {} = {} is shown as the default, but the code's is {default}: {}",
                line.section, line.key, line.value, line.text
            ));
        }
    }
    // Every default -T fills in is shown somewhere, so none is left to guess.
    for (section, key) in defaults.keys() {
        if !shown.contains(&(section.clone(), key.clone())) {
            problems.push(format!("[{section}] {key}: its default is not shown"));
        }
    }
    assert!(
        problems.is_empty(),
        "config/slidegate.toml and the schema disagree:\n{}",
        problems.join("\n")
    );
}

/// Keys whose documented default applies only with another setting, which MINIMAL leaves
/// off, so `-T` of it rightly prints nothing for them.
const CONDITIONAL: [(&str, &str, &str); 9] = [
    ("routes", "plan.refresh", "with from = \"redis\""),
    ("server", "tls_min_version", "with tls_listen"),
    ("routes", "limits[].lease_ttl", "with concurrent"),
    ("routes", "limits[].time_zone", "with per"),
    ("store", "db", "with backend = \"redis_sentinel\""),
    ("upstreams.*", "verify", "with tls = true"),
    ("routes", "deny_content_type", "with deny_body_file"),
    ("routes", "max_queue", "with a max_delay"),
    ("routes", "settle_scan_bytes", "with settle = \"json:…\""),
];

/// `slidegate -T` of a minimal config against the defaults column of docs/configuration.md:
/// every key `-T` prints has the value its row names (a literal such as `"5s"`; a path with
/// `$TMPDIR` and `<listen port>`; or `[store].<key>`, the store's value), and every row whose
/// default is a literal is printed by `-T` (unless it only applies with another setting).
#[test]
fn minus_t_prints_every_default_the_configuration_reference_gives() {
    let doc = read("docs/configuration.md");
    let defaults = code_defaults();
    let headings = [
        ("server", "[server]"),
        ("store", "[store]"),
        ("client_ip", "[client_ip]"),
        ("log", "[log]"),
        ("upstreams.*", "[upstreams.<name>]"),
        ("routes", "[[routes]]"),
    ];
    let mut problems = Vec::new();
    let mut compared = 0;
    for (name, heading) in headings {
        for row in section(&doc, heading).lines() {
            let cells: Vec<&str> = row.split(" | ").collect();
            if !row.starts_with("| `") || cells.len() < 3 {
                continue;
            }
            let cell = cells[1].trim();
            let spans: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
            for key in cells[0].trim_start_matches("| ").split(", ") {
                let key = key.trim_matches('`');
                let printed = defaults.get(&(name.to_string(), key.to_string()));
                let literals: Vec<toml::Value> = spans
                    .iter()
                    .filter_map(|s| {
                        if let Some(store_key) = s.strip_prefix("[store].") {
                            return defaults
                                .get(&("store".to_string(), store_key.to_string()))
                                .cloned();
                        }
                        let s = s
                            .replace("$TMPDIR", "/tmp")
                            .replace("<listen port>", "8080");
                        toml_value(&s)
                            .or_else(|| s.starts_with('/').then(|| toml::Value::String(s)))
                    })
                    .collect();
                match printed {
                    Some(value) => {
                        compared += 1;
                        if !literals.iter().any(|l| same_value(l, value)) {
                            problems.push(format!(
                                "{heading} {key}: -T prints {value}, the table says {cell}"
                            ));
                        }
                    }
                    None if !literals.is_empty()
                        && !CONDITIONAL.iter().any(|(s, k, _)| *s == name && *k == key) =>
                    {
                        problems.push(format!(
                            "{heading} {key}: default {cell}, which -T does not print"
                        ));
                    }
                    None => {}
                }
            }
        }
    }
    assert!(compared > 40, "only {compared} keys compared");
    for (name, key) in defaults.keys() {
        let heading = headings.iter().find(|(s, _)| s == name).map(|(_, h)| *h);
        let row = heading.map(|h| section(&doc, h).contains(&format!("`{key}`")));
        if row != Some(true) {
            problems.push(format!(
                "[{name}] {key}: printed by -T, no row in the table"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "slidegate -T and docs/configuration.md disagree:\n{}",
        problems.join("\n")
    );
}
