//! The unread body of a request slidegate answers itself (429, 404, 503): read and dropped
//! after the answer when it is small, so the client's HTTP/1 connection is kept, as nginx
//! discards the body of a request it answers itself.
//!
//! Pingora closes a connection whose request body was not read when the response went out
//! (the next request's bytes would sit behind it). A client posting a form to a denied route
//! then pays a new connection (and on TLS a handshake) per denial. Here a body of at most
//! [`DISCARD_MAX`] bytes (by `Content-Length`, or a chunked body that ends within it) is read
//! after the answer went out, within [`DISCARD_TIME`] (and `client_body_timeout`, which the
//! connection's body deadline applies anyway); a larger, slower or broken one closes the
//! connection as before. A request with `Expect: 100-continue` is not waited for: its client
//! holds the body back until it hears `100`, which a denial never sends.
//!
//! HTTP/2 needs nothing: the answer ends the stream, the h2 codec resets the stream's
//! receiving half with `RST_STREAM(NO_ERROR)` (RFC 9113 §8.1), and the connection and its
//! other streams go on.

use std::time::Duration;

use pingora::proxy::Session;

/// Largest request body read and dropped to keep a connection.
pub(super) const DISCARD_MAX: u64 = 64 * 1024;

/// Longest the proxy reads a discarded body (nginx's `lingering_timeout` default).
pub(super) const DISCARD_TIME: Duration = Duration::from_secs(5);

/// How a request's body is framed, as far as its answer cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Framing {
    /// HTTP/2: the stream ends by itself.
    pub h2: bool,
    /// No body, or all of it read already.
    pub body_done: bool,
    /// The connection would be kept after this response.
    pub keepalive: bool,
    /// `Content-Length`, when the body is framed by length.
    pub content_length: Option<u64>,
    /// `Transfer-Encoding: chunked`: the length is known only at its end.
    pub chunked: bool,
    /// `Expect: 100-continue`: the client waits before sending the body.
    pub expect_continue: bool,
}

/// What to do with the body after the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leftover {
    /// Nothing to read (no body left, or HTTP/2).
    Nothing,
    /// Read and drop the body, at most `max` bytes, then keep the connection.
    Discard {
        /// The most bytes read before giving up and closing.
        max: u64,
    },
    /// Close the connection after the answer (Pingora's default for an unread body).
    Close,
}

/// The pure decision: discard a small body the client is sending, close on anything else.
pub(super) fn leftover(f: Framing, max: u64) -> Leftover {
    if f.h2 || f.body_done {
        return Leftover::Nothing;
    }
    if !f.keepalive || f.expect_continue {
        return Leftover::Close;
    }
    match (f.chunked, f.content_length) {
        (true, _) => Leftover::Discard { max },
        (false, Some(n)) if n <= max => Leftover::Discard { max },
        _ => Leftover::Close,
    }
}

/// The framing of the request `session` is answering.
pub(super) fn framing(session: &mut Session) -> Framing {
    let downstream = session.as_downstream_mut();
    let body_done = downstream.is_body_done();
    let keepalive = downstream.get_keepalive().is_some();
    let h2 = downstream.is_http2();
    let headers = &session.req_header().headers;
    let content_length = (headers.get(http::header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    let expect_continue = (headers.get(http::header::EXPECT))
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Framing {
        h2,
        body_done,
        keepalive,
        content_length,
        chunked: headers.contains_key(http::header::TRANSFER_ENCODING),
        expect_continue,
    }
}

/// Before the answer is written: a body to be discarded must not make Pingora announce
/// `Connection: close`.
pub(super) fn prepare(session: &mut Session, leftover: Leftover) {
    if let Leftover::Discard { .. } = leftover {
        (session.as_downstream_mut()).set_close_on_response_before_downstream_finish(false);
    }
}

/// After the answer went out: read and drop the body, or close the connection when it is too
/// large, too slow or broken.
pub(super) async fn finish(session: &mut Session, leftover: Leftover) {
    let Leftover::Discard { max } = leftover else {
        return;
    };
    let downstream = session.as_downstream_mut();
    let read = async {
        let mut seen = 0u64;
        loop {
            match downstream.read_request_body().await {
                Ok(Some(bytes)) => {
                    seen += bytes.len() as u64;
                    if seen > max {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    };
    let whole = tokio::time::timeout(DISCARD_TIME, read)
        .await
        .unwrap_or(false);
    if !whole {
        session.set_keepalive(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POST: Framing = Framing {
        h2: false,
        body_done: false,
        keepalive: true,
        content_length: Some(1024),
        chunked: false,
        expect_continue: false,
    };

    #[test]
    fn a_small_body_is_discarded_and_a_large_one_closes() {
        let max = 64 * 1024;
        assert_eq!(leftover(POST, max), Leftover::Discard { max });
        let at_bound = Framing {
            content_length: Some(max),
            ..POST
        };
        assert_eq!(leftover(at_bound, max), Leftover::Discard { max });
        let over = Framing {
            content_length: Some(max + 1),
            ..POST
        };
        assert_eq!(leftover(over, max), Leftover::Close);
        let mib = Framing {
            content_length: Some(1 << 20),
            ..POST
        };
        assert_eq!(leftover(mib, max), Leftover::Close);
    }

    #[test]
    fn a_chunked_body_is_read_up_to_the_bound() {
        let chunked = Framing {
            content_length: None,
            chunked: true,
            ..POST
        };
        assert_eq!(leftover(chunked, 10), Leftover::Discard { max: 10 });
    }

    #[test]
    fn nothing_is_read_without_a_body_or_on_h2() {
        for f in [
            Framing {
                body_done: true,
                content_length: None,
                ..POST
            },
            Framing { h2: true, ..POST },
            Framing {
                h2: true,
                content_length: Some(1 << 30),
                ..POST
            },
        ] {
            assert_eq!(leftover(f, 64), Leftover::Nothing, "{f:?}");
        }
    }

    #[test]
    fn a_withheld_or_unkept_body_closes() {
        let expect = Framing {
            expect_continue: true,
            ..POST
        };
        assert_eq!(leftover(expect, 1 << 20), Leftover::Close);
        let closing = Framing {
            keepalive: false,
            ..POST
        };
        assert_eq!(leftover(closing, 1 << 20), Leftover::Close);
        // Neither length nor chunked, yet unread: nothing safe to wait for.
        let unframed = Framing {
            content_length: None,
            ..POST
        };
        assert_eq!(leftover(unframed, 1 << 20), Leftover::Close);
    }
}
