//! `settle = "json:…"`: a model's usage read from its response body as the body passes to the
//! client, unchanged and unheld: a JSON body is kept (up to the bound) and read at its end; a
//! `text/event-stream` is read event by event, each path taken from the last event carrying
//! it (OpenAI's final usage chunk; Anthropic's `message_start` and `message_delta`). A body,
//! or one event, over the bound ends the scan: the charge then stands ([`Reported::Oversized`]).

mod paths;
mod sse;

use std::sync::Arc;

use serde_json::Value;

pub use paths::{PathError, UsagePaths};

use crate::limiter::settle::Reported;

/// The scan of one response body.
#[derive(Debug)]
pub struct Scan {
    paths: Arc<UsagePaths>,
    limit: usize,
    mode: Mode,
    /// Each path's last value seen: a count, or `Err` for a value that is none.
    terms: Vec<Option<Result<u64, ()>>>,
    /// The bound was passed: nothing more is read.
    over: bool,
}

#[derive(Debug)]
enum Mode {
    /// The body so far.
    Json(Vec<u8>),
    Events(sse::Events),
}

impl Scan {
    /// The scan of a body for `paths`, at most `limit` bytes of body (or of one event, for
    /// an `event_stream`) kept.
    pub fn new(paths: Arc<UsagePaths>, limit: usize, event_stream: bool) -> Scan {
        let mode = match event_stream {
            true => Mode::Events(sse::Events::default()),
            false => Mode::Json(Vec::new()),
        };
        let terms = vec![None; paths.len()];
        Scan {
            paths,
            limit,
            mode,
            terms,
            over: false,
        }
    }

    /// Read `chunk` as it passes: `Some` when what the body reports has changed (an event
    /// carried the paths, or the bound was passed).
    pub fn feed(&mut self, chunk: &[u8]) -> Option<Reported> {
        if self.over {
            return None;
        }
        let (paths, terms) = (&*self.paths, &mut self.terms);
        let mut changed = false;
        let result = match &mut self.mode {
            Mode::Json(body) if body.len() + chunk.len() > self.limit => Err(()),
            Mode::Json(body) => {
                body.extend_from_slice(chunk);
                Ok(())
            }
            Mode::Events(events) => {
                let mut event = |data: &[u8]| changed |= read(paths, terms, data);
                events.feed(chunk, self.limit, &mut event).map_err(|_| ())
            }
        };
        if result.is_err() {
            self.give_up();
            return Some(Reported::Oversized);
        }
        changed.then(|| report(&self.terms)).flatten()
    }

    /// The end of the body: what it reported in all (`None`: nothing).
    pub fn finish(&mut self) -> Option<Reported> {
        if self.over {
            return Some(Reported::Oversized);
        }
        if let Mode::Json(body) = &mut self.mode {
            let body = std::mem::take(body);
            read(&self.paths, &mut self.terms, &body);
        }
        report(&self.terms)
    }

    fn give_up(&mut self) {
        self.over = true;
        self.mode = Mode::Json(Vec::new());
    }
}

/// Read the paths in the JSON text `data`; true when it carried any.
fn read(paths: &UsagePaths, terms: &mut [Option<Result<u64, ()>>], data: &[u8]) -> bool {
    if !paths.may_carry(data) {
        return false;
    }
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return false;
    };
    let mut carried = false;
    for (i, term) in terms.iter_mut().enumerate() {
        if let Some(value) = paths.read(i, &doc) {
            *term = Some(value);
            carried = true;
        }
    }
    carried
}

/// The sum of the paths once each has been seen: a cost, or invalid when a value is no count
/// or the sum is over 2^32 - 1.
fn report(terms: &[Option<Result<u64, ()>>]) -> Option<Reported> {
    let mut sum: u64 = 0;
    for term in terms {
        match (*term)? {
            Ok(n) => sum = sum.saturating_add(n),
            Err(()) => return Some(Reported::Invalid),
        }
    }
    Some(u32::try_from(sum).map_or(Reported::Invalid, Reported::Cost))
}

#[cfg(test)]
mod tests;
