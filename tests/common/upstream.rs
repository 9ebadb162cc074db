//! A real HTTP/1.1 upstream for tests: a hyper server on `127.0.0.1:<run-time port>`, on its own
//! thread and Tokio runtime, that answers every request `200 upstream ok` and remembers what it
//! received (a request counter and the `X-Forwarded-For` of each request). A request carrying
//! [`DELAY_HEADER`]` = <ms>` is answered that many milliseconds after it arrived (it is counted
//! on arrival), to keep a request in flight.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// The body of every upstream response.
pub const UPSTREAM_BODY: &str = "upstream ok\n";

/// Request header asking the upstream to wait this many milliseconds (at most 60 000) before it
/// answers.
pub const DELAY_HEADER: &str = "x-upstream-delay-ms";

/// What the upstream has seen.
#[derive(Default)]
struct Seen {
    hits: AtomicU64,
    /// `X-Forwarded-For` of each request in arrival order (`None` when absent).
    xff: Mutex<Vec<Option<String>>>,
    /// Each request's head as received, in arrival order.
    heads: Mutex<Vec<SeenHead>>,
}

/// What an upstream saw of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenHead {
    /// The method.
    pub method: String,
    /// The request-target as hyper parsed it (origin-form `/x?y`, or the whole absolute URI).
    pub target: String,
    /// Every `Host` value.
    pub host: Vec<String>,
    /// Every `Content-Length` value.
    pub content_length: Vec<String>,
}

/// A running upstream server; stopped (its runtime and open connections dropped) on drop.
pub struct Upstream {
    addr: SocketAddr,
    seen: Arc<Seen>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    /// Start an upstream on a run-time loopback port. It is accepting connections when this
    /// returns (the socket is bound and listening before the server thread starts).
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream listener");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("upstream local addr");
        let seen = Arc::new(Seen::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let thread_seen = seen.clone();
        let thread = std::thread::Builder::new()
            .name(format!("upstream-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("upstream runtime");
                rt.block_on(serve(listener, thread_seen, stopped));
                // Dropping the runtime here cancels every connection task still open.
            })
            .expect("spawn upstream thread");
        Upstream {
            addr,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests received so far.
    pub fn hits(&self) -> u64 {
        self.seen.hits.load(Ordering::SeqCst)
    }

    /// The `X-Forwarded-For` value of every request received, in arrival order (`None` when the
    /// request carried none; several header lines are joined with `", "`).
    pub fn xff(&self) -> Vec<Option<String>> {
        self.seen.xff.lock().unwrap().clone()
    }

    /// The head of every request received, in arrival order.
    pub fn heads(&self) -> Vec<SeenHead> {
        self.seen.heads.lock().unwrap().clone()
    }

    /// The `X-Forwarded-For` of the most recent request (`None` when there was no request or
    /// it carried none).
    pub fn last_xff(&self) -> Option<String> {
        self.seen.xff.lock().unwrap().last().cloned().flatten()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: TcpListener, seen: Arc<Seen>, mut stopped: oneshot::Receiver<()>) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // EMFILE and the like: keep serving the connections already open.
                Err(_) => {
                    tokio::task::yield_now().await;
                    continue;
                }
            },
        };
        let seen = seen.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    let xff: Vec<&str> = req
                        .headers()
                        .get_all("x-forwarded-for")
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .collect();
                    let xff = (!xff.is_empty()).then(|| xff.join(", "));
                    let values = |name: &str| -> Vec<String> {
                        req.headers()
                            .get_all(name)
                            .iter()
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .collect()
                    };
                    seen.heads.lock().unwrap().push(SeenHead {
                        method: req.method().to_string(),
                        target: req.uri().to_string(),
                        host: values("host"),
                        content_length: values("content-length"),
                    });
                    seen.xff.lock().unwrap().push(xff);
                    seen.hits.fetch_add(1, Ordering::SeqCst);
                    let delay = req
                        .headers()
                        .get(DELAY_HEADER)
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                        .map(|ms| std::time::Duration::from_millis(ms.min(60_000)));
                    if let Some(delay) = delay {
                        tokio::time::sleep(delay).await;
                    }
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(200)
                            .header("content-type", "text/plain")
                            .body(Full::new(Bytes::from_static(UPSTREAM_BODY.as_bytes())))
                            .expect("static response"),
                    )
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
