//! `settle = "json:…"` in the proxy: the upstream is asked for an uncompressed body, the scan
//! of the body ([`crate::response::usage`]) starts at the final head and reads each chunk as
//! it passes to the client (never holding one back), and what it reports goes on the ticket
//! that [`super::settle`] corrects at the end.

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use pingora::http::{RequestHeader, ResponseHeader};

use crate::limiter::settle::{Reported, Ticket};
use crate::response::usage::Scan;
use crate::routes::Route;

/// On a route that settles from the body: ask the upstream for the body uncompressed, which
/// is the only form the scan reads (the client gets it so too).
pub(super) fn ask_identity(route: &Route, request: &mut RequestHeader) -> pingora::Result<()> {
    if route.spec.cost.body_settle().is_some() {
        request.insert_header(ACCEPT_ENCODING, "identity")?;
    }
    Ok(())
}

/// The scan of the body after the final `head`, when the route settles from the body and
/// `ticket` waits for a cost. A body compressed all the same is not read: the ticket says so.
pub(super) fn start(
    route: &Route,
    head: &ResponseHeader,
    ticket: Option<&mut Ticket>,
) -> Option<Box<Scan>> {
    let (paths, scan_bytes) = route.spec.cost.body_settle()?;
    let ticket = ticket?;
    let encoded = (head.headers.get_all(CONTENT_ENCODING).iter())
        .any(|v| !v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"));
    if encoded {
        ticket.settled = Some(Reported::Encoded);
        return None;
    }
    let event_stream = head.headers.get(CONTENT_TYPE).is_some_and(|v| {
        let essence = v
            .as_bytes()
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default();
        essence
            .trim_ascii()
            .eq_ignore_ascii_case(b"text/event-stream")
    });
    Some(Box::new(Scan::new(paths.clone(), scan_bytes, event_stream)))
}

/// Read a body chunk as it passes (the last one when `end`); `true` when the scan is done.
pub(super) fn feed(
    scan: &mut Scan,
    ticket: Option<&mut Ticket>,
    body: Option<&Bytes>,
    end: bool,
) -> bool {
    let mut said = body.and_then(|b| scan.feed(b));
    if end {
        said = scan.finish().or(said);
    }
    if let (Some(said), Some(ticket)) = (said, ticket) {
        ticket.settled = Some(said);
    }
    end
}

/// A response that went out whole without its body's end having been seen (a body closed by
/// its trailers): what the scan found is final.
pub(super) fn finish(scan: &mut Scan, ticket: Option<&mut Ticket>) {
    feed(scan, ticket, None, true);
}
