//! A malformed upstream response head, summarised for the process log. Pingora's HTTP/1
//! client puts the whole head it could not parse into its error (`buf: <the head, escaped>`),
//! `Set-Cookie` and tokens included, and its proxy logs that error at ERROR. slidegate logs
//! what an operator needs instead: the status as sent, how many fields, and which rule the
//! head broke; never a value.

use std::fmt;

use pingora::{Error, ErrorSource, ErrorType};

/// What Pingora's error context starts with when it carries the raw head.
const RAW_HEAD: &str = "buf: ";

/// The rules httparse refuses a head for (its errors' texts, which carry no input).
const RULES: [&str; 7] = [
    "invalid header name",
    "invalid header value",
    "invalid new line",
    "invalid response status",
    "invalid token",
    "too many headers",
    "invalid HTTP version",
];

/// What a refused head looked like, without any of its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadSummary {
    /// The status code as sent, when it is 1 to 9 digits (`2000`); else `None`.
    pub status: Option<String>,
    /// Field lines before the end of the head (or of what arrived).
    pub fields: usize,
    /// The rule it broke (httparse's wording), when known.
    pub rule: Option<&'static str>,
}

impl fmt::Display for HeadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.status {
            Some(s) => write!(f, "status {s}")?,
            None => f.write_str("status unreadable")?,
        }
        write!(f, ", {} field lines", self.fields)?;
        match self.rule {
            Some(rule) => write!(f, ", {rule}"),
            None => f.write_str(", unparsable"),
        }
    }
}

/// The summary of `error` if it is a refused upstream head carrying the raw bytes (in its
/// context or its causes'); `None` for any other error.
pub fn refused_head(error: &Error) -> Option<HeadSummary> {
    let mut at: &Error = error;
    loop {
        let raw = at.context.as_ref().map(|c| c.as_str());
        if let Some(escaped) = raw.and_then(|c| c.strip_prefix(RAW_HEAD)) {
            let cause = at.cause.as_ref().map(ToString::to_string);
            let rule = cause.and_then(|c| RULES.iter().copied().find(|r| *r == c));
            return Some(summarise(&unescape(escaped), rule));
        }
        // A wrapped error is its cause, boxed or not (`Error::because(.., e)` with a
        // `Box<Error>`).
        let cause = at.cause.as_ref()?;
        at = match cause.downcast_ref::<Box<Error>>() {
            Some(boxed) => boxed,
            None => cause.downcast_ref::<Error>()?,
        };
    }
}

/// Is `error` one whose text may carry an upstream's head (a parse failure on the upstream
/// side)? Such errors are logged through [`refused_head`] only.
pub fn may_carry_head(error: &Error) -> bool {
    *error.esource() == ErrorSource::Upstream && *error.etype() == ErrorType::InvalidHTTPHeader
}

fn summarise(head: &[u8], rule: Option<&'static str>) -> HeadSummary {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n");
    let head = &head[..end.map_or(head.len(), |e| e + 2)];
    let mut lines = head.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    let status = (lines.next())
        .and_then(|line| line.split(|&b| b == b' ').filter(|t| !t.is_empty()).nth(1))
        .filter(|code| (1..=9).contains(&code.len()) && code.iter().all(u8::is_ascii_digit))
        .map(|code| String::from_utf8_lossy(code).into_owned());
    HeadSummary {
        status,
        fields: lines.count(),
        rule,
    }
}

/// Undo `escape_ascii` (`\r`, `\n`, `\t`, `\\`, `\'`, `\"`, `\xNN`), so that an escaped
/// backslash in a value is not read as a line end.
fn unescape(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let (byte, used) = match b[i + 1] {
            b'r' => (b'\r', 2),
            b'n' => (b'\n', 2),
            b't' => (b'\t', 2),
            b'x' => match b
                .get(i + 2..i + 4)
                .and_then(|h| std::str::from_utf8(h).ok())
            {
                Some(hex) => (u8::from_str_radix(hex, 16).unwrap_or(b'?'), 4),
                None => (b'?', 2),
            },
            other => (other, 2),
        };
        out.push(byte);
        i += used;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(head: &[u8], cause: &str) -> Box<Error> {
        let rule = cause.to_owned();
        let context = format!("{RAW_HEAD}{}", head.escape_ascii());
        let e = Error::because(ErrorType::InvalidHTTPHeader, context, rule);
        e.into_up()
    }

    #[test]
    fn a_refused_head_is_summarised_without_values() {
        let head = b"HTTP/1.1 2000 OK\r\nSet-Cookie: sid=SECRET\r\nX-A: \\r\\n\x7f\r\n\r\nbody";
        let e = refused(head, "invalid response status");
        let s = refused_head(&e).unwrap();
        assert_eq!(s.status.as_deref(), Some("2000"));
        assert_eq!(s.fields, 2);
        assert_eq!(s.rule, Some("invalid response status"));
        let line = s.to_string();
        assert_eq!(line, "status 2000, 2 field lines, invalid response status");
        assert!(may_carry_head(&e));
    }

    #[test]
    fn wrapped_or_unknown_causes_and_other_errors() {
        let inner = refused(b"HTTP/1.1 200 OK\r\nA: b", "made up");
        let outer = Error::because(ErrorType::InvalidHTTPHeader, "reading", inner);
        let s = refused_head(&outer).unwrap();
        assert_eq!(
            (s.status.as_deref(), s.fields, s.rule),
            (Some("200"), 1, None)
        );
        let plain = Error::explain(ErrorType::ReadError, "while reading response headers");
        assert_eq!(refused_head(&plain), None);
        let odd = refused(
            b"HTTP/1.1 SECRETTOKEN OK\r\n\r\n",
            "invalid response status",
        );
        assert_eq!(refused_head(&odd).unwrap().status, None);
    }
}
