//! A latency-injecting TCP proxy on loopback: every chunk read from one side is written to the
//! other a fixed one-way delay after it was read, in order, in both directions. A Redis behind
//! it is "one network hop away": a round trip costs at least twice the delay, and calls may
//! overlap in flight (a chunk's delay does not hold back the chunks after it).
//!
//! Threads, not tokio tasks: tokio's timer has a resolution of 1 ms, which would turn a 0.5 ms
//! one-way delay (a 1 ms round trip) into anything from 0.5 to 1.5 ms. A thread waiting in `ppoll` until a
//! chunk is due wakes within tens of µs. Each connection has one thread per direction; the proxy
//! serves a handful of connections (a store's one, a PING client's).
//!
//! Dropping the proxy stops it: it shuts every socket down and joins its threads.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// See the module documentation.
pub struct DelayProxy {
    addr: SocketAddr,
    delay: Duration,
    stop: Arc<AtomicBool>,
    /// Every socket the proxy opened or accepted, to shut down on drop.
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<Vec<JoinHandle<()>>>>,
}

impl DelayProxy {
    /// Listen on a free loopback port and forward every connection to `upstream`, delaying each
    /// chunk by `one_way` in each direction.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> DelayProxy {
        assert!(
            upstream.ip().is_loopback(),
            "the delay proxy forwards to loopback only"
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let (stop, sockets) = (stop.clone(), sockets.clone());
            thread::Builder::new()
                .name("delay-proxy".into())
                .spawn(move || accept(listener, upstream, one_way, &stop, &sockets))
                .expect("spawn the delay proxy")
        };
        DelayProxy {
            addr,
            delay: one_way,
            stop,
            sockets,
            acceptor: Some(acceptor),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The one-way delay.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor out of `accept`; it sees `stop` and returns.
        let _ = TcpStream::connect(self.addr);
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        let pumps = acceptor.join().unwrap_or_default();
        // A thread waiting for its socket sees the shutdown as the end of the stream.
        for socket in self.sockets.lock().unwrap().iter() {
            let _ = socket.shutdown(Shutdown::Both);
        }
        for pump in pumps {
            let _ = pump.join();
        }
    }
}

/// Accept until stopped; returns the threads it started.
fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    delay: Duration,
    stop: &AtomicBool,
    sockets: &Mutex<Vec<TcpStream>>,
) -> Vec<JoinHandle<()>> {
    let mut pumps = Vec::new();
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(upstream) else {
            // Upstream down: the client sees its connection closed, as with a dead server.
            continue;
        };
        for s in [&client, &server] {
            let _ = s.set_nodelay(true);
            sockets
                .lock()
                .unwrap()
                .push(s.try_clone().expect("clone socket"));
        }
        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        pumps.push(pump(client, s2, delay));
        pumps.push(pump(server, c2, delay));
        // A stop that came while connecting.
        if stop.load(Ordering::SeqCst) {
            break;
        }
    }
    pumps
}

/// Copy `from` to `to`, each chunk `delay` after it was read, in order (the delay is the same
/// for all), on one thread: it waits (`ppoll`, a timer of µs resolution) for the next chunk to
/// read or the oldest to fall due, whichever comes first. One thread and no channel per
/// direction keep the proxy's own CPU small: on a 2-core machine it shares the cores with the
/// proxy whose Redis it delays (a real network hop costs that machine nothing).
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = vec![0; CHUNK];
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut open = true;
        loop {
            let now = Instant::now();
            while queue.front().is_some_and(|(due, _)| *due <= now) {
                let (_, chunk) = queue.pop_front().expect("a chunk due");
                if to.write_all(&chunk).is_err() {
                    return;
                }
            }
            let next = queue.front().map(|(due, _)| *due - now);
            if !open {
                match next {
                    Some(wait) => thread::sleep(wait),
                    None => break,
                }
                continue;
            }
            if readable(&from, next) {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => open = false,
                    Ok(n) => queue.push_back((Instant::now() + delay, buf[..n].to_vec())),
                }
            }
        }
        // Pass the end of the stream on, after the last chunk.
        let _ = to.shutdown(Shutdown::Write);
    })
}

/// Wait until `socket` has something to read (data, its end, or an error) or `timeout` has
/// passed (`None`: no limit); whether it has.
fn readable(socket: &TcpStream, timeout: Option<Duration>) -> bool {
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one valid pollfd, a valid or null timespec, no signal mask change.
    let n = unsafe { libc::ppoll(&mut fd, 1, ts_ptr, std::ptr::null()) };
    // An interrupted wait (EINTR) reads as "not yet": the caller loops.
    n > 0
}
