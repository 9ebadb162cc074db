//! A real HTTP/1.1 upstream for tests: a hyper server on `127.0.0.1:<run-time port>`, on its own
//! thread and Tokio runtime, that answers every request `200 upstream ok` and remembers what it
//! received (a request counter and the `X-Forwarded-For` of each request). A request carrying
//! [`DELAY_HEADER`]` = <ms>` is answered that many milliseconds after it arrived (it is counted
//! on arrival), to keep a request in flight.
//!
//! More answers, asked for by request headers: [`GATED_HEADER`] sends a 2-byte `Content-Length`
//! body of which the second byte waits for [`Upstream::release`]; [`CHUNKED_HEADER`] sends a
//! body without a length (chunked on HTTP/1.1). [`Upstream::start_tls`] serves HTTPS with
//! HTTP/2 and HTTP/1.1 by ALPN. A request with `Upgrade` is answered `101` and the tunnel echoes
//! what it receives. [`FIELD_HEADER`] adds a response field of the client's choosing.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
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

/// Request header asking for `Content-Length: 2`, body `a` at once and `b` only after
/// [`Upstream::release`].
pub const GATED_HEADER: &str = "x-upstream-gated";

/// Request header asking for a body without `Content-Length` (`hello world`, in two pieces).
pub const CHUNKED_HEADER: &str = "x-upstream-chunked";

/// Request header asking for a body of this many bytes (at most 64 MiB), all `x`.
pub const SIZE_HEADER: &str = "x-upstream-size";

/// Request header asking the upstream to answer at once and then read (and discard) the
/// request body in the background, keeping the connection, as nginx's `return` does.
pub const DISCARD_HEADER: &str = "x-upstream-discard-body";

/// Request header asking the upstream to read the whole request body before it answers, as
/// most apps do (by default it answers at once).
pub const READ_BODY_HEADER: &str = "x-upstream-read-body";

/// Request header asking for this status (200..=599; default 200), e.g. `401` for a failed
/// login.
pub const STATUS_HEADER: &str = "x-upstream-status";

/// Request header asking for a response field: `Name: value` (repeatable), e.g.
/// `Server: gunicorn` for an upstream that names itself.
pub const FIELD_HEADER: &str = "x-upstream-field";

/// Request header asking for a response trailer: `Name: value` (repeatable), sent after the
/// body (`upstream ok`), e.g. a token count only known at the end of a stream. Sent over HTTP/2;
/// on HTTP/1.1 hyper sends trailers only to a client that asked for them (`TE: trailers`).
pub const TRAILER_HEADER: &str = "x-upstream-trailer";

/// Request header asking the upstream to wait this many milliseconds (at most 60 000) between
/// the body and the trailer of [`TRAILER_HEADER`]: a stream whose count comes late.
pub const TRAILER_DELAY_HEADER: &str = "x-upstream-trailer-delay-ms";

/// Request header asking the upstream to keep working on a [`DELAY_HEADER`] request to its end
/// even after the proxy closed the connection or reset the stream (counted in flight all the
/// while), as an app that never checks its connection does.
pub const DETACHED_HEADER: &str = "x-upstream-detached";

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// HTTP version it arrived in.
    pub version: http::Version,
    /// Its headers.
    pub headers: http::HeaderMap,
    /// When it arrived.
    pub arrived: std::time::Instant,
}

/// What the upstream has seen.
struct Seen {
    hits: AtomicU64,
    /// Requests being answered now (from their head until their response head, or until the
    /// proxy gave up on them), and the most there ever were at once.
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// `X-Forwarded-For` of each request in arrival order (`None` when absent).
    xff: Mutex<Vec<Option<String>>>,
    /// Each request's head as received, in arrival order.
    heads: Mutex<Vec<SeenHead>>,
    /// Version and headers of each request, in arrival order.
    requests: Mutex<Vec<SeenRequest>>,
    /// Permits for gated bodies' second byte.
    gate: tokio::sync::Semaphore,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            hits: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            xff: Mutex::default(),
            requests: Mutex::default(),
            heads: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
        }
    }
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
        Self::start_with(None)
    }

    /// An upstream on `addr` (e.g. `127.0.0.2:<port>`: every 127.0.0.0/8 address is loopback,
    /// so servers that differ only by address can share a port, as one name's addresses do).
    pub fn start_on(addr: SocketAddr) -> Upstream {
        Self::start_bound(
            TcpListener::bind(addr).expect("bind upstream listener"),
            None,
        )
    }

    /// An HTTPS upstream with `config` (HTTP/2 and HTTP/1.1 by ALPN).
    pub fn start_tls(config: rustls::ServerConfig) -> Upstream {
        Self::start_with(Some(Arc::new(config)))
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream listener");
        Self::start_bound(listener, tls)
    }

    fn start_bound(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> Upstream {
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
                rt.block_on(serve(listener, thread_seen, stopped, tls));
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

    /// Version, headers and arrival time of every request received, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.requests.lock().unwrap().clone()
    }

    /// Version and headers of the most recent request.
    pub fn last_request(&self) -> Option<SeenRequest> {
        self.seen.requests.lock().unwrap().last().cloned()
    }

    /// Requests being answered now (see [`DELAY_HEADER`] to hold them).
    pub fn in_flight(&self) -> u64 {
        self.seen.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests it was ever answering at once.
    pub fn max_in_flight(&self) -> u64 {
        self.seen.max_in_flight.load(Ordering::SeqCst)
    }

    /// Let one gated body ([`GATED_HEADER`]) send its second byte.
    pub fn release(&self) {
        self.seen.gate.add_permits(1);
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

/// One request in [`Seen::in_flight`] while it lives (dropped too when the proxy goes away
/// and its connection's task is cancelled).
struct Answering(Arc<Seen>);

impl Answering {
    fn new(seen: Arc<Seen>) -> Answering {
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Answering(seen)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(bytes: &'static [u8]) -> Body {
    Full::new(Bytes::from_static(bytes)).boxed()
}

async fn answer(mut req: Request<Incoming>, seen: Arc<Seen>) -> Result<Response<Body>, Infallible> {
    let xff: Vec<&str> = req
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let xff = (!xff.is_empty()).then(|| xff.join(", "));
    seen.xff.lock().unwrap().push(xff);
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
    seen.requests.lock().unwrap().push(SeenRequest {
        version: req.version(),
        headers: req.headers().clone(),
        arrived: std::time::Instant::now(),
    });
    seen.hits.fetch_add(1, Ordering::SeqCst);
    let answering = Answering::new(seen.clone());
    let delay = req
        .headers()
        .get(DELAY_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(|ms| std::time::Duration::from_millis(ms.min(60_000)));
    match delay {
        // A task of its own: hyper dropping this future does not end the work.
        Some(delay) if req.headers().contains_key(DETACHED_HEADER) => {
            let work = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                drop(answering);
            });
            let _ = work.await;
        }
        Some(delay) => tokio::time::sleep(delay).await,
        None => {}
    }
    if req.headers().contains_key(READ_BODY_HEADER) {
        while let Some(Ok(_)) = req.body_mut().frame().await {}
    }
    if req.headers().contains_key(DISCARD_HEADER) {
        let mut body = req.into_body();
        tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
        return Ok(Response::new(full(UPSTREAM_BODY.as_bytes())));
    }
    if req.headers().contains_key(http::header::UPGRADE) {
        // Accept any upgrade and echo what arrives on the tunnel.
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let Ok(upgraded) = upgrade.await else { return };
            let mut io = TokioIo::new(upgraded);
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = io.read(&mut buf).await {
                if io.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
        let response = Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(full(b""));
        return Ok(response.expect("static response"));
    }
    let status = req
        .headers()
        .get(STATUS_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
        .filter(|s| (200..=599).contains(s))
        .unwrap_or(200);
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "text/plain");
    for field in req.headers().get_all(FIELD_HEADER) {
        let text = String::from_utf8_lossy(field.as_bytes()).into_owned();
        if let Some((name, value)) = text.split_once(':') {
            response = response.header(name.trim(), value.trim());
        }
    }
    let trailers = req.headers().get_all(TRAILER_HEADER).iter().fold(
        http::HeaderMap::new(),
        |mut map, field| {
            let text = String::from_utf8_lossy(field.as_bytes()).into_owned();
            if let Some((name, value)) = text.split_once(':') {
                let name = http::HeaderName::try_from(name.trim()).expect("trailer name");
                map.append(name, value.trim().parse().expect("trailer value"));
            }
            map
        },
    );
    let response = if !trailers.is_empty() {
        let trailer_delay = (req.headers().get(TRAILER_DELAY_HEADER))
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map_or(0, |ms| ms.min(60_000));
        let body = Frame::data(Bytes::from_static(UPSTREAM_BODY.as_bytes()));
        let trailer = async move {
            tokio::time::sleep(std::time::Duration::from_millis(trailer_delay)).await;
            Frame::trailers(trailers)
        };
        let frames = futures::stream::once(async { body })
            .chain(futures::stream::once(trailer))
            .map(Ok::<_, Infallible>);
        response.body(BodyExt::boxed(StreamBody::new(frames)))
    } else if req.headers().contains_key(GATED_HEADER) {
        let pieces = futures::stream::unfold(0u8, move |step| {
            let seen = seen.clone();
            async move {
                let piece: &'static [u8] = match step {
                    0 => b"a",
                    1 => {
                        // Bounded: a proxy that never shows the client the first byte fails
                        // the test long before this.
                        let permit = tokio::time::timeout(
                            std::time::Duration::from_secs(30),
                            seen.gate.acquire(),
                        )
                        .await;
                        if let Ok(Ok(p)) = permit {
                            p.forget();
                        }
                        b"b"
                    }
                    _ => return None,
                };
                Some((
                    Ok::<_, Infallible>(Frame::data(Bytes::from_static(piece))),
                    step + 1,
                ))
            }
        });
        response
            .header("content-length", "2")
            .body(BodyExt::boxed(StreamBody::new(pieces)))
    } else if let Some(size) = req
        .headers()
        .get(SIZE_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
    {
        let body = Bytes::from(vec![b'x'; size.min(64 << 20)]);
        response.body(Full::new(body).boxed())
    } else if req.headers().contains_key(CHUNKED_HEADER) {
        let pieces = futures::stream::iter([&b"hello "[..], &b"world"[..]])
            .map(|p| Ok::<_, Infallible>(Frame::data(Bytes::from_static(p))));
        response.body(BodyExt::boxed(StreamBody::new(pieces)))
    } else {
        response.body(full(UPSTREAM_BODY.as_bytes()))
    };
    Ok(response.expect("static response"))
}

async fn serve(
    listener: TcpListener,
    seen: Arc<Seen>,
    mut stopped: oneshot::Receiver<()>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
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
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| answer(req, seen.clone()));
            match acceptor {
                None => {
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                }
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    // HTTP/2 or HTTP/1.1, whichever the client speaks (ALPN told it which).
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
                }
            }
        });
    }
}
