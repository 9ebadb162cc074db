//! The events of a `text/event-stream` (WHATWG HTML §9.2.6) as its bytes pass: lines end in
//! CRLF, LF or CR (a CRLF may be split between two chunks); an event's `data` lines are joined
//! by `\n` (one space after the colon dropped) and the event ends at a blank line. Other
//! fields and comments are skipped; an event the stream leaves unfinished is dropped, as a
//! browser drops it. Bounded: a line or an event over the limit ends the reading.

/// A line or an event longer than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Over;

/// The state between two chunks.
#[derive(Debug, Default)]
pub(super) struct Events {
    /// A line not yet ended.
    line: Vec<u8>,
    /// The `data` of the event so far.
    data: Vec<u8>,
    has_data: bool,
    /// The last chunk ended in CR: an LF starting the next one ends no second line.
    after_cr: bool,
}

impl Events {
    /// Read `chunk`; `event` gets the data of each event it ends.
    pub(super) fn feed(
        &mut self,
        mut chunk: &[u8],
        limit: usize,
        event: &mut impl FnMut(&[u8]),
    ) -> Result<(), Over> {
        if std::mem::take(&mut self.after_cr) && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        while let Some(end) = chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
            if self.line.is_empty() {
                self.line_done(&chunk[..end], limit, event)?;
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[..end]);
                self.line_done(&line, limit, event)?;
                line.clear();
                self.line = line;
            }
            let cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
        }
        if self.line.len() + chunk.len() + self.data.len() > limit {
            return Err(Over);
        }
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    fn line_done(
        &mut self,
        line: &[u8],
        limit: usize,
        event: &mut impl FnMut(&[u8]),
    ) -> Result<(), Over> {
        if line.is_empty() {
            if std::mem::take(&mut self.has_data) {
                event(&self.data);
            }
            self.data.clear();
            return Ok(());
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &[][..]),
        };
        if name != b"data" {
            return Ok(());
        }
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if self.data.len() + value.len() + 1 > limit {
            return Err(Over);
        }
        if std::mem::replace(&mut self.has_data, true) {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]], limit: usize) -> (Vec<String>, Result<(), Over>) {
        let mut e = Events::default();
        let mut got = Vec::new();
        let mut push = |d: &[u8]| got.push(String::from_utf8_lossy(d).into_owned());
        let mut result = Ok(());
        for c in chunks {
            result = e.feed(c, limit, &mut push);
            if result.is_err() {
                break;
            }
        }
        (got, result)
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_line_ends_and_chunk_cuts() {
        let text = b"event: x\r\ndata: {\"a\":1}\r\n\r\n: comment\ndata:b\ndata: c\n\ndata: [DONE]\r\rdata: cut";
        let want = vec!["{\"a\":1}".to_owned(), "b\nc".into(), "[DONE]".into()];
        assert_eq!(events(&[text], 1 << 10), (want.clone(), Ok(())));
        // Every cut of the stream in two, CRLF split included, reads the same.
        for at in 0..text.len() {
            let (a, b) = text.split_at(at);
            assert_eq!(
                events(&[a, b], 1 << 10),
                (want.clone(), Ok(())),
                "cut at {at}"
            );
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(events(&bytes, 1 << 10), (want, Ok(())));
    }

    #[test]
    fn a_line_or_an_event_over_the_bound_ends_the_reading() {
        let (got, r) = events(&[b"data: 12345\n\ndata: 123456789\n"], 8);
        assert_eq!((got, r), (vec!["12345".to_owned()], Err(Over)));
        let (_, r) = events(&[b"data: 1234\ndata: 5678\n\n"], 8);
        assert_eq!(r, Err(Over), "two lines of one event");
        let (_, r) = events(&[b": a comment longer than eight"], 8);
        assert_eq!(r, Err(Over), "an unended line");
    }
}
