//! Per-connection bounds on HTTP/2 that Pingora 0.9's h2 server does not have (issue 52 row 8):
//!
//! - **Requests per connection**: HTTP/1.1 connections end after `[server] keepalive_requests`
//!   (1000) requests (Pingora's `keepalive_request_limit`, like nginx's `keepalive_requests`),
//!   but Pingora's h2 accept loop has no such count. Here the stream that
//!   reaches the cap starts a graceful shutdown (GOAWAY, the connection closes once its streams
//!   have ended); a stream opened past the cap is refused with `RST_STREAM(REFUSED_STREAM)`
//!   (not processed: the client may retry it elsewhere), and a client that keeps opening streams
//!   [`MAX_STREAMS_IN_FLIGHT`] past the cap (it ignores GOAWAY, or never answers the PING h2
//!   waits for before its final GOAWAY) has its connection closed at once.
//! - **Upstream work in flight**: h2's `max_concurrent_streams` counts open streams, and a
//!   stream the client resets is closed at once, while the request it started may still be
//!   running towards the upstream. Here each stream's task holds one of
//!   [`MAX_STREAMS_IN_FLIGHT`] permits of its connection until it has ended (its upstream
//!   request finished or its upstream connection closed); a stream that finds none waits for one
//!   (a connection's streams ending and new ones starting overlap a little), at most
//!   [`MAX_STREAMS_IN_FLIGHT`] of them; past that a stream is refused.
//! - **Descriptors**: a stream in flight uses the upstream descriptor its connection took, or,
//!   while another stream uses that, one of the process's descriptor budget (its own upstream
//!   connection), and is refused when only the room left to new client connections remains
//!   ([`super::descriptors`]).
//!
//! The graceful shutdown is Pingora's own (the one a server shutdown starts): each connection
//! is given its own shutdown watch, which the server's watch also sets.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream, ServerApp};
use pingora::protocols::http::v2::server::H2Options;
use pingora::protocols::http::ServerSession;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use prometheus::{register_int_counter_vec, IntCounterVec};
use tokio::sync::{watch, Notify, Semaphore};

/// Streams of one HTTP/2 connection whose requests may be in flight at once: Pingora's h2
/// `max_concurrent_streams` (100), which a reset stream no longer counts against.
pub const MAX_STREAMS_IN_FLIGHT: u32 = 100;

/// `slidegate_h2_streams_refused_total{reason}`.
static REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "slidegate_h2_streams_refused_total",
        "HTTP/2 streams refused with RST_STREAM(REFUSED_STREAM) before any processing",
        &["reason"]
    )
    .expect("register slidegate_h2_streams_refused_total")
});

/// Register this module's metric at startup, so it is exported before the first refusal.
pub fn register_metrics() {
    LazyLock::force(&REFUSED);
}

/// What to do with a newly accepted stream: a pure function of the connection's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Serve,
    /// Serve it, and start the connection's graceful shutdown: it is the last one.
    ServeLast,
    /// Refuse it: the connection's cap has been reached.
    RefuseCapped,
    /// Refuse it and close the connection now: the client ignores GOAWAY.
    Close,
}

/// The verdict for the `n`th stream (1-based) of a connection capped at `cap`.
pub fn verdict(n: u32, cap: u32) -> Verdict {
    match n {
        n if n < cap => Verdict::Serve,
        n if n == cap => Verdict::ServeLast,
        n if n <= cap.saturating_add(MAX_STREAMS_IN_FLIGHT) => Verdict::RefuseCapped,
        _ => Verdict::Close,
    }
}

/// The state one client connection's streams share.
struct Conn {
    /// Streams accepted so far.
    streams: AtomicU32,
    /// Requests this connection may make (`keepalive_requests`).
    cap: u32,
    /// Streams waiting for a permit.
    waiting: AtomicU32,
    /// Streams whose requests are in flight.
    in_flight: Arc<Semaphore>,
    /// The upstream descriptor the connection took with its own (`descriptors::connection`) is
    /// free: the next stream uses it rather than one of the budget's.
    own_upstream: AtomicBool,
    /// This connection's shutdown watch: set when the server shuts down or the cap is reached.
    goaway: watch::Sender<bool>,
    /// Close the connection now.
    close: Notify,
}

/// The application one connection is served by: `inner` (the proxy), with this connection's
/// counts. Built per connection, so the counts need no table.
pub struct PerConn<A> {
    inner: Arc<A>,
    conn: Conn,
}

impl<A: HttpServerApp + Send + Sync + 'static> PerConn<A> {
    /// Serve one accepted connection's `stream` with `inner`, until it ends, at most `cap`
    /// HTTP/2 requests: `shutdown` (the server's) starts its graceful shutdown as it would
    /// Pingora's own.
    pub async fn serve(
        inner: Arc<A>,
        stream: Stream,
        shutdown: &ShutdownWatch,
        cap: u32,
    ) -> Option<Stream> {
        let (goaway, watch) = watch::channel(*shutdown.borrow());
        let app = Arc::new(PerConn {
            inner,
            conn: Conn {
                streams: AtomicU32::new(0),
                cap,
                waiting: AtomicU32::new(0),
                in_flight: Arc::new(Semaphore::new(MAX_STREAMS_IN_FLIGHT as usize)),
                own_upstream: AtomicBool::new(true),
                goaway,
                close: Notify::new(),
            },
        });
        // The server's shutdown is passed on by a task of its own, not a third branch below:
        // every wakeup of the connection would poll it (and the connection wakes several times
        // a request).
        let mut server = shutdown.clone();
        let conn = Arc::downgrade(&app);
        let forward = tokio::spawn(async move {
            // Until the server's watch says shut down, then pass it on.
            while !*server.borrow_and_update() {
                if server.changed().await.is_err() {
                    return;
                }
            }
            if let Some(app) = conn.upgrade() {
                app.conn.goaway.send_replace(true);
            }
        });
        // Biased: the connection's own future first, with no random pick on each wakeup.
        let next = tokio::select! {
            biased;
            next = ServerApp::process_new(&app, stream, &watch) => next,
            // Dropping the connection's future closes its socket; its streams' tasks see errors.
            () = app.conn.close.notified() => None,
        };
        forward.abort();
        next
    }

    /// Serve one HTTP/2 stream within the connection's bounds.
    async fn stream(self: &Arc<Self>, mut session: ServerSession, shutdown: &ShutdownWatch) {
        let n = self.conn.streams.fetch_add(1, Ordering::Relaxed) + 1;
        match verdict(n, self.conn.cap) {
            Verdict::Serve => {}
            Verdict::ServeLast => {
                self.conn.goaway.send_replace(true);
            }
            Verdict::RefuseCapped => return refuse(&mut session, "requests_per_connection"),
            Verdict::Close => {
                refuse(&mut session, "requests_per_connection");
                self.conn.close.notify_one();
                return;
            }
        }
        let permit = match self.conn.in_flight.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Streams end and start again a little out of step: wait, but only so many.
                let waiting = self.conn.waiting.fetch_add(1, Ordering::Relaxed);
                let _waiting = Decrement(&self.conn.waiting);
                if waiting >= MAX_STREAMS_IN_FLIGHT {
                    return refuse(&mut session, "in_flight");
                }
                match self.conn.in_flight.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return refuse(&mut session, "in_flight"),
                }
            }
        };
        // A descriptor for the upstream connection it may hold: the connection's own if
        // free, else one of the budget's, never one of those left to new clients.
        let upstream = if self.conn.own_upstream.swap(false, Ordering::AcqRel) {
            Upstream::Own(&self.conn.own_upstream)
        } else {
            match super::descriptors::stream() {
                Ok(permit) => Upstream::Budget(permit),
                Err(super::descriptors::NoRoom) => return refuse(&mut session, "descriptors"),
            }
        };
        self.inner.process_new_http(session, shutdown).await;
        drop((permit, upstream));
    }
}

/// `RST_STREAM(REFUSED_STREAM)`: the stream was not processed (RFC 9113 §8.7).
fn refuse(session: &mut ServerSession, reason: &str) {
    REFUSED.with_label_values(&[reason]).inc();
    if let ServerSession::H2(s) = session {
        s.shutdown_with_reason(h2::Reason::REFUSED_STREAM);
    }
}

/// A stream's upstream descriptor, given back when dropped.
enum Upstream<'a> {
    /// The connection's own (its flag set again).
    Own(&'a AtomicBool),
    /// One of the budget's (`None`: no budget).
    Budget(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>),
}

impl Drop for Upstream<'_> {
    fn drop(&mut self) {
        if let Upstream::Own(free) = self {
            free.store(true, Ordering::Release);
        }
    }
}

/// Decrements its counter when dropped.
struct Decrement<'a>(&'a AtomicU32);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> HttpServerApp for PerConn<A> {
    // Written out (not `async fn`) so an HTTP/1 request goes straight to the proxy's own future,
    // with no second allocation (see the Pingora patch in vendor/pingora-proxy).
    fn process_new_http<'life0, 'life1, 'async_trait>(
        self: &'life0 Arc<Self>,
        session: ServerSession,
        shutdown: &'life1 ShutdownWatch,
    ) -> Pin<Box<dyn Future<Output = Option<ReusedHttpStream>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        if !session.is_http2() {
            return self.inner.process_new_http(session, shutdown);
        }
        Box::pin(async move {
            self.stream(session, shutdown).await;
            None
        })
    }

    fn h2_options(&self) -> Option<H2Options> {
        self.inner.h2_options()
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.inner.server_options()
    }

    async fn process_custom_session(
        self: Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        self.inner
            .clone()
            .process_custom_session(stream, shutdown)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_serves_n_then_refuses_then_closes() {
        let cap = 1000;
        let verdicts: Vec<Verdict> = (1..=cap + MAX_STREAMS_IN_FLIGHT + 2)
            .map(|n| verdict(n, cap))
            .collect();
        let count = |v: Verdict| verdicts.iter().filter(|&&x| x == v).count() as u32;
        assert_eq!(count(Verdict::Serve), cap - 1);
        assert_eq!(verdicts[cap as usize - 1], Verdict::ServeLast);
        assert_eq!(count(Verdict::ServeLast), 1);
        assert_eq!(count(Verdict::RefuseCapped), MAX_STREAMS_IN_FLIGHT);
        assert_eq!(count(Verdict::Close), 2);
        assert_eq!(verdict(u32::MAX, u32::MAX), Verdict::ServeLast);
    }
}
