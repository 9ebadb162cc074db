//! The h2c preface peek (`h2c = true`), under the head deadline.
//!
//! Pingora decides between HTTP/1 and h2c by peeking [`H2_PREFACE`]'s 24 bytes, and its own peek
//! waits for all 24 whatever arrives and under no deadline: silent sockets held all of
//! `max_connections`, and a complete 18-byte `GET / HTTP/1.0` was never answered. Here the
//! peek reads through the head phase (so `client_header_timeout` covers it) and stops at the
//! first byte that rules the preface out; what it read is handed out again by the next reads.

use std::future::poll_fn;
use std::io;
use std::sync::atomic::Ordering;

use tokio::io::ReadBuf;

use super::deadline::H2_PREFACE;
use super::phase::PHASE_H2;
use super::EdgeStream;

/// How far `got` goes toward the preface.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PrefaceSoFar {
    /// Every byte so far is the preface's, and more are needed.
    Partial,
    /// The whole preface.
    Complete,
    /// Not the preface (HTTP/1).
    Ruled,
}

/// Pure: classify the bytes read so far.
pub(super) fn preface_so_far(got: &[u8]) -> PrefaceSoFar {
    let n = got.len().min(H2_PREFACE.len());
    if got[..n] != H2_PREFACE[..n] {
        PrefaceSoFar::Ruled
    } else if n == H2_PREFACE.len() {
        PrefaceSoFar::Complete
    } else {
        PrefaceSoFar::Partial
    }
}

impl EdgeStream {
    /// Read until the preface is complete or ruled out; `buf` (24 bytes, as Pingora asks) gets
    /// what was read. A timeout or an end of stream first is an error: Pingora then closes the
    /// connection without trying a handshake.
    pub(super) async fn peek_preface(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let mut got = std::mem::take(&mut self.peeked);
        loop {
            match preface_so_far(&got) {
                PrefaceSoFar::Partial => {}
                verdict => {
                    if verdict == PrefaceSoFar::Complete {
                        self.h2 = true;
                        self.phase.store(PHASE_H2, Ordering::Release);
                    }
                    let n = got.len().min(buf.len());
                    buf[..n].copy_from_slice(&got[..n]);
                    buf[n..].fill(0);
                    self.peeked = got;
                    return Ok(true);
                }
            }
            let mut chunk = [0u8; 64];
            let mut read = ReadBuf::new(&mut chunk);
            poll_fn(|cx| self.poll_read_in_phase(cx, &mut read)).await?;
            if read.filled().is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            got.extend_from_slice(read.filled());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_complete_http1_request_is_ruled_out_at_its_first_byte() {
        assert_eq!(preface_so_far(b"G"), PrefaceSoFar::Ruled);
        assert_eq!(
            preface_so_far(b"GET / HTTP/1.0\r\n\r\n"),
            PrefaceSoFar::Ruled
        );
    }

    #[test]
    fn the_preface_is_partial_until_its_last_byte() {
        assert_eq!(preface_so_far(b""), PrefaceSoFar::Partial);
        assert_eq!(preface_so_far(b"PRI * HTTP/2.0"), PrefaceSoFar::Partial);
        assert_eq!(preface_so_far(&H2_PREFACE[..23]), PrefaceSoFar::Partial);
        assert_eq!(preface_so_far(H2_PREFACE), PrefaceSoFar::Complete);
    }

    #[test]
    fn a_frame_after_the_preface_still_completes_it() {
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(preface_so_far(&bytes), PrefaceSoFar::Complete);
    }

    #[test]
    fn a_near_miss_is_ruled_out() {
        assert_eq!(preface_so_far(b"PRI * HTTP/1.1"), PrefaceSoFar::Ruled);
        assert_eq!(preface_so_far(b"POST / HTTP/1.1"), PrefaceSoFar::Ruled);
    }
}
