//! A real gRPC upstream and a real gRPC client, both Python `grpcio` (the scripts under
//! `tests/grpc/`): the upstream on `127.0.0.1:<port chosen by the OS>`, killed on drop; the
//! client run once per batch of calls, its results parsed from the JSON it prints.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::process_group::{own_group, stop_group};

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/grpc")
        .join(name)
}

/// Panic with an install hint unless `python3` runs and imports `grpc` (the `grpcio` package).
/// Never skip: a missing tool is a failed test that says what to install.
pub fn require_grpcio() {
    super::require_tool("python3", "python3");
    let out = Command::new("python3")
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the gRPC tests need Python's grpcio, which `python3` cannot import ({}). \
         Install it with `python3 -m pip install grpcio` (scripts/test does).",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
}

/// `tests/grpc/upstream.py`: service `slidegate.test.Echo` over h2c, `Echo` answering the
/// request's bytes, `Count` the number of `Echo` calls it received.
pub struct GrpcUpstream {
    child: Child,
    // Held open: the server stops when it closes.
    _stdin: ChildStdin,
    addr: SocketAddr,
}

impl GrpcUpstream {
    /// Start it and wait until it serves (it prints its port once listening).
    pub fn start() -> GrpcUpstream {
        require_grpcio();
        let mut child = own_group(&mut Command::new("python3"))
            .arg(script("upstream.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tests/grpc/upstream.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the gRPC upstream did not print its port within 30 s");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the gRPC upstream printed {line:?}, not its port"));
        GrpcUpstream {
            child,
            _stdin: stdin,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for GrpcUpstream {
    fn drop(&mut self) {
        stop_group(&mut self.child);
    }
}

/// What the client saw of one call.
#[derive(Debug, Clone)]
pub struct GrpcCall {
    /// The status code's name: `OK`, `RESOURCE_EXHAUSTED`, `UNAVAILABLE`, ...
    pub code: String,
    /// The status message (`grpc-message`, percent-decoded).
    pub details: String,
    /// The reply message, for an `OK` call.
    pub reply: Option<String>,
    /// Initial and trailing metadata together (a trailers-only answer has only trailing).
    pub metadata: BTreeMap<String, String>,
}

impl GrpcCall {
    /// A metadata value (lowercase key).
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }
}

/// How the client reaches the proxy.
#[derive(Debug, Clone)]
pub enum GrpcTransport {
    /// h2c by prior knowledge.
    H2c,
    /// h2 over TLS, trusting this CA file, the certificate checked for `localhost`.
    Tls(PathBuf),
}

/// Make `calls` calls of `method` (e.g. `/slidegate.test.Echo/Echo`) to `target`, one after
/// the other on one channel, each with metadata `x-client: <client>` for each of `clients` (one
/// line each: two make the key's header ambiguous).
pub fn grpc_calls(
    target: SocketAddr,
    transport: &GrpcTransport,
    method: &str,
    clients: &[&str],
    calls: usize,
) -> Vec<GrpcCall> {
    grpc_calls_saying(target, transport, (method, None), clients, calls)
}

/// [`grpc_calls`], each call's request being `message` (`None`: `hello <i>`).
pub fn grpc_calls_saying(
    target: SocketAddr,
    transport: &GrpcTransport,
    (method, message): (&str, Option<&str>),
    clients: &[&str],
    calls: usize,
) -> Vec<GrpcCall> {
    require_grpcio();
    let mut cmd = Command::new("python3");
    cmd.arg(script("client.py"))
        .arg(target.to_string())
        .args(["--calls", &calls.to_string()])
        .args(["--method", method]);
    if let Some(message) = message {
        cmd.args(["--message", message]);
    }
    for client in clients {
        cmd.args(["--client", client]);
    }
    if let GrpcTransport::Tls(ca) = transport {
        cmd.arg("--ca").arg(ca);
    }
    let out = cmd.output().expect("run tests/grpc/client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/grpc/client.py failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("client.py printed {stdout:?}: {e}"));
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    parsed
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|c| {
            let mut metadata = BTreeMap::new();
            for part in ["initial", "trailing"] {
                for (k, v) in c[part].as_object().into_iter().flatten() {
                    metadata.insert(k.clone(), text(v).unwrap_or_default());
                }
            }
            GrpcCall {
                code: text(&c["code"]).unwrap_or_default(),
                details: text(&c["details"]).unwrap_or_default(),
                reply: text(&c["reply"]),
                metadata,
            }
        })
        .collect()
}
