//! A stand-in model server: an OpenAI-compatible chat completions endpoint on a run-time
//! loopback port (HTTP/1.1, or HTTPS with HTTP/2 and HTTP/1.1 by ALPN), for the tests of
//! `settle = "json:…"`. Every request is answered as its headers ask ([`Answer::of`]): a JSON
//! completion, or a `text/event-stream` of content chunks, a final usage chunk (`choices` empty,
//! `usage` set, as OpenAI's `stream_options.include_usage`) and `data: [DONE]`. A test builds
//! the same [`Answer`] to know the bytes sent.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// The total tokens to report (`prompt_tokens` a quarter of them); absent: no `usage`.
pub const USAGE_HEADER: &str = "x-model-usage";
/// Answer as an event stream of this many content chunks (before the usage chunk).
pub const STREAM_HEADER: &str = "x-model-stream";
/// End the stream (HTTP/1.1: close the connection; HTTP/2: reset the stream) after its
/// content chunks, before the usage chunk.
pub const CUT_HEADER: &str = "x-model-cut";
/// The content of the answer (or of the first chunk): this many `x`, for an oversized body.
pub const PAD_HEADER: &str = "x-model-pad";
/// The chunks after the first wait for [`ModelServer::release`].
pub const GATED_HEADER: &str = "x-model-gated";
/// Answer this many milliseconds (at most 60 000) after the request came: to keep many
/// requests in flight at once.
pub const DELAY_HEADER: &str = "x-model-delay-ms";
/// Label the answer `Content-Encoding: gzip`, as an upstream that ignores `Accept-Encoding`
/// would (the bytes are what the test chose: the proxy must not read them either way).
pub const ENCODED_HEADER: &str = "x-model-gzip";

/// What the model answers one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub usage: Option<u64>,
    pub stream: Option<usize>,
    pub cut: bool,
    pub pad: Option<usize>,
    pub gated: bool,
    pub encoded: bool,
    pub delay_ms: Option<u64>,
}

impl Answer {
    /// What request `headers` ask for.
    pub fn of(headers: &http::HeaderMap) -> Answer {
        let number = |name: &str| {
            let v = headers.get(name)?.to_str().ok()?;
            v.parse::<u64>().ok()
        };
        Answer {
            usage: number(USAGE_HEADER),
            stream: number(STREAM_HEADER).map(|n| n.min(10_000) as usize),
            cut: headers.contains_key(CUT_HEADER),
            pad: number(PAD_HEADER).map(|n| n.min(64 << 20) as usize),
            gated: headers.contains_key(GATED_HEADER),
            encoded: headers.contains_key(ENCODED_HEADER),
            delay_ms: number(DELAY_HEADER).map(|ms| ms.min(60_000)),
        }
    }

    /// The request headers that ask for this answer.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        if let Some(n) = self.usage {
            h.push((USAGE_HEADER, n.to_string()));
        }
        if let Some(n) = self.stream {
            h.push((STREAM_HEADER, n.to_string()));
        }
        if let Some(n) = self.pad {
            h.push((PAD_HEADER, n.to_string()));
        }
        if let Some(ms) = self.delay_ms {
            h.push((DELAY_HEADER, ms.to_string()));
        }
        for (on, name) in [
            (self.cut, CUT_HEADER),
            (self.gated, GATED_HEADER),
            (self.encoded, ENCODED_HEADER),
        ] {
            if on {
                h.push((name, "1".to_owned()));
            }
        }
        h
    }

    fn usage_json(&self) -> Option<String> {
        let total = self.usage?;
        let prompt = total / 4;
        Some(format!(
            "{{\"prompt_tokens\":{prompt},\"completion_tokens\":{},\"total_tokens\":{total}}}",
            total - prompt
        ))
    }

    fn content(&self, i: usize) -> String {
        match (i, self.pad) {
            (0, Some(n)) => "x".repeat(n),
            _ => format!("part {i} "),
        }
    }

    /// The parts the model writes, in order (each flushed on its own); a cut stream's are
    /// its content chunks only.
    pub fn parts(&self) -> Vec<Vec<u8>> {
        let Some(chunks) = self.stream else {
            let usage = (self.usage_json()).map_or(String::new(), |u| format!(",\"usage\":{u}"));
            let body = format!(
                "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"model\":\"stand-in\",\
                 \"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\
                 \"{}\"}},\"finish_reason\":\"stop\"}}]{usage}}}",
                self.content(0)
            );
            return vec![body.into_bytes()];
        };
        let mut parts: Vec<Vec<u8>> = (0..chunks)
            .map(|i| {
                format!(
                    "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\
                     \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}],\
                     \"usage\":null}}\n\n",
                    self.content(i)
                )
                .into_bytes()
            })
            .collect();
        if self.cut {
            return parts;
        }
        if let Some(usage) = self.usage_json() {
            let last = format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\
                 \"choices\":[],\"usage\":{usage}}}\n\n"
            );
            parts.push(last.into_bytes());
        }
        parts.push(b"data: [DONE]\n\n".to_vec());
        parts
    }

    /// The whole body the model sends.
    pub fn body(&self) -> Vec<u8> {
        self.parts().concat()
    }
}

struct Seen {
    /// Each request's `Accept-Encoding`, in arrival order.
    accept_encoding: Mutex<Vec<Option<String>>>,
    /// Permits for gated chunks.
    gate: tokio::sync::Semaphore,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            accept_encoding: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
        }
    }
}

/// A running model server; stopped on drop.
pub struct ModelServer {
    addr: SocketAddr,
    seen: Arc<Seen>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ModelServer {
    /// Over HTTP/1.1.
    pub fn start() -> ModelServer {
        Self::start_with(None)
    }

    /// Over HTTPS with `config` (HTTP/2 and HTTP/1.1 by ALPN).
    pub fn start_tls(config: rustls::ServerConfig) -> ModelServer {
        Self::start_with(Some(Arc::new(config)))
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind model listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let (stop, stopped) = oneshot::channel();
        let thread_seen = seen.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("model runtime");
            rt.block_on(serve(listener, thread_seen, stopped, tls));
        });
        ModelServer {
            addr,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Let one gated stream go on.
    pub fn release(&self) {
        self.seen.gate.add_permits(1);
    }

    /// The `Accept-Encoding` of each request so far.
    pub fn accept_encodings(&self) -> Vec<Option<String>> {
        self.seen.accept_encoding.lock().unwrap().clone()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

async fn answer(req: Request<Incoming>, seen: Arc<Seen>) -> Result<Response<Body>, Infallible> {
    let ae = req.headers().get(http::header::ACCEPT_ENCODING);
    let ae = ae.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    seen.accept_encoding.lock().unwrap().push(ae);
    let a = Answer::of(req.headers());
    if let Some(ms) = a.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut response = Response::builder().status(200);
    if a.encoded {
        response = response.header("content-encoding", "gzip");
    }
    let parts = a.parts();
    let body = match a.stream {
        None => {
            let full = Full::new(Bytes::from(parts.concat()));
            response = response.header("content-type", "application/json");
            full.map_err(|never: Infallible| match never {}).boxed()
        }
        Some(_) => {
            response = response.header("content-type", "text/event-stream; charset=utf-8");
            let (gated, cut) = (a.gated, a.cut);
            let parts = futures::stream::iter(parts.into_iter().enumerate()).then(move |(i, p)| {
                let seen = seen.clone();
                async move {
                    if gated && i == 1 {
                        // Bounded: a proxy that holds the first chunk fails the test long
                        // before this.
                        let permit = seen.gate.acquire();
                        if let Ok(Ok(p)) =
                            tokio::time::timeout(Duration::from_secs(30), permit).await
                        {
                            p.forget();
                        }
                    }
                    Ok(Frame::data(Bytes::from(p)))
                }
            });
            // A cut stream ends in an error: hyper closes the connection (HTTP/1.1, no last
            // chunk) or resets the stream (HTTP/2). Once what came before has gone out: hyper
            // drops what it has not written yet.
            let end = futures::stream::iter(cut.then_some(())).then(|()| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err(std::io::Error::other("cut"))
            });
            BodyExt::boxed(StreamBody::new(parts.chain(end)))
        }
    };
    Ok(response.body(body).expect("model response"))
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
                Err(_) => {
                    tokio::task::yield_now().await;
                    continue;
                }
            },
        };
        let (seen, acceptor) = (seen.clone(), acceptor.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, seen.clone()));
            let auto =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let _ = match acceptor {
                None => auto.serve_connection(TokioIo::new(stream), service).await,
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    auto.serve_connection(TokioIo::new(tls), service).await
                }
            };
        });
    }
}
