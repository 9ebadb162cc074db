//! Formatting access log lines (JSON, nginx `combined`) on the writer thread.

use std::io::Write;
use std::time::{Duration, SystemTime};

use super::record::Entry;
use crate::metrics::Decision;

/// `2026-12-01T08:26:38` of the current second, rebuilt only when the second changes: most
/// lines of a busy proxy share it.
#[derive(Default)]
pub(super) struct SecondCache {
    second: u64,
    text: String,
}

impl SecondCache {
    /// Append `time` as RFC 3339 UTC with milliseconds.
    fn write(&mut self, out: &mut Vec<u8>, time: SystemTime) {
        let since = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        if since.as_secs() != self.second || self.text.is_empty() {
            self.second = since.as_secs();
            let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(self.second);
            // `2026-12-01T08:26:38Z` without the `Z`.
            let mut text = humantime::format_rfc3339_seconds(whole).to_string();
            text.pop();
            self.text = text;
        }
        out.extend_from_slice(self.text.as_bytes());
        let _ = write!(out, ".{:03}Z", since.subsec_millis());
    }
}

/// Append `s` as a JSON string.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for (i, c) in s.char_indices() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            _ => out.extend_from_slice(&s.as_bytes()[i..i + c.len_utf8()]),
        }
    }
    out.push(b'"');
}

/// Append `value` as a JSON string, or `null`.
fn json_opt(out: &mut Vec<u8>, value: Option<impl std::fmt::Display>) {
    match value {
        Some(v) => {
            let _ = write!(out, "\"{v}\"");
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// Milliseconds with microsecond resolution (plenty, and keeps lines short).
fn number_or_null(out: &mut Vec<u8>, n: Option<u32>) {
    match n {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.extend_from_slice(b"null"),
    }
}

fn write_ms(out: &mut Vec<u8>, d: Duration) {
    let us = d.as_micros();
    let _ = write!(out, "{}.{:03}", us / 1000, us % 1000);
}

/// Append an optional arena string as a JSON string, or `null`.
fn json_range(out: &mut Vec<u8>, text: &str, range: &Option<std::ops::Range<usize>>) {
    match range {
        Some(r) => json_str(out, &text[r.clone()]),
        None => out.extend_from_slice(b"null"),
    }
}

/// One JSON object, keys in the documented order. Hand-written: this runs once per request
/// on the writer thread, and the process's CPU is what the benchmark charges the log with.
pub(super) fn json_line(out: &mut Vec<u8>, text: &str, e: &Entry, clock: &mut SecondCache) {
    out.extend_from_slice(b"{\"time\":\"");
    clock.write(out, e.time);
    out.extend_from_slice(b"\",\"client\":");
    json_opt(out, e.client);
    out.extend_from_slice(b",\"method\":");
    json_str(out, &text[e.method.clone()]);
    out.extend_from_slice(b",\"host\":");
    json_range(out, text, &e.host);
    out.extend_from_slice(b",\"path\":");
    json_str(out, &text[e.path.clone()]);
    let _ = write!(out, ",\"protocol\":\"{:?}\",\"tls_version\":", e.version);
    json_opt(out, e.tls_version);
    let _ = write!(out, ",\"status\":{},\"route\":", e.status);
    json_range(out, text, &e.route);
    out.extend_from_slice(b",\"decision\":");
    json_opt(out, e.decision.map(Decision::as_str));
    out.extend_from_slice(b",\"limits\":");
    json_range(out, text, &e.limits);
    out.extend_from_slice(b",\"pk\":");
    json_range(out, text, &e.pk);
    out.extend_from_slice(b",\"cost\":");
    number_or_null(out, e.cost);
    out.extend_from_slice(b",\"settled_cost\":");
    number_or_null(out, e.settled_cost);
    out.extend_from_slice(b",\"upstream\":");
    json_opt(out, e.upstream);
    out.extend_from_slice(b",\"upstream_ms\":");
    match e.upstream_time {
        Some(d) => write_ms(out, d),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"duration_ms\":");
    write_ms(out, e.duration);
    let _ = write!(
        out,
        ",\"bytes_received\":{},\"bytes_sent\":{},\"request_id\":",
        e.bytes_received, e.bytes_sent
    );
    json_range(out, text, &e.request_id);
    out.extend_from_slice(b",\"user_agent\":");
    json_range(out, text, &e.user_agent);
    out.extend_from_slice(b",\"referer\":");
    json_range(out, text, &e.referer);
    out.extend_from_slice(b",\"error\":");
    json_range(out, text, &e.error);
    out.extend_from_slice(b"}\n");
}

/// `01/Dec/2026:08:26:38 +0000` (nginx's `$time_local`, in UTC) of the current second,
/// rebuilt only when the second changes.
#[derive(Default)]
pub(super) struct LocalTimeCache {
    second: u64,
    text: String,
}

impl LocalTimeCache {
    pub(super) fn write(&mut self, out: &mut Vec<u8>, time: SystemTime) {
        let second = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if second != self.second || self.text.is_empty() {
            self.second = second;
            self.text = time_local(SystemTime::UNIX_EPOCH + Duration::from_secs(second));
        }
        out.extend_from_slice(self.text.as_bytes());
    }
}

/// Pure: `Tue, 01 Dec 2026 08:26:38 GMT` -> `01/Dec/2026:08:26:38 +0000`.
fn time_local(time: SystemTime) -> String {
    let http = httpdate::fmt_http_date(time);
    let parts: Vec<&str> = http.split([' ', ',']).filter(|s| !s.is_empty()).collect();
    match parts.as_slice() {
        [_, day, mon, year, hms, _] => format!("{day}/{mon}/{year}:{hms} +0000"),
        _ => http,
    }
}

/// Append an optional arena string, or `-` (nginx's empty variable).
pub(super) fn dash_or(out: &mut Vec<u8>, text: &str, range: &Option<std::ops::Range<usize>>) {
    match range {
        Some(r) if !r.is_empty() => out.extend_from_slice(text[r.clone()].as_bytes()),
        _ => out.push(b'-'),
    }
}

/// nginx's `$request`: the request line as sent, escaped.
pub(super) fn write_request(out: &mut Vec<u8>, text: &str, e: &Entry) {
    match &e.request_line {
        // A head refused before it was parsed: the line as far as it was sent, as nginx logs it.
        Some(line) => dash_or(out, text, &Some(line.clone())),
        None => {
            out.extend_from_slice(text[e.method.clone()].as_bytes());
            out.push(b' ');
            out.extend_from_slice(text[e.target.clone()].as_bytes());
            let _ = write!(out, " {:?}", e.version);
        }
    }
}

/// nginx's `combined`, byte for byte: `$remote_addr - $remote_user [$time_local] "$request"
/// $status $body_bytes_sent "$http_referer" "$http_user_agent"`, `$request` being the request
/// line as sent (method, target with its query, protocol) and every variable escaped as nginx
/// escapes it; `$remote_user` is always `-` (slidegate does no HTTP authentication).
pub(super) fn combined_line(out: &mut Vec<u8>, text: &str, e: &Entry, clock: &mut LocalTimeCache) {
    match e.client {
        Some(c) => {
            let _ = write!(out, "{c}");
        }
        None => out.push(b'-'),
    }
    out.extend_from_slice(b" - - [");
    clock.write(out, e.time);
    out.extend_from_slice(b"] \"");
    write_request(out, text, e);
    let _ = write!(out, "\" {} {} \"", e.status, e.bytes_sent);
    dash_or(out, text, &e.referer);
    out.extend_from_slice(b"\" \"");
    dash_or(out, text, &e.user_agent);
    out.extend_from_slice(b"\"\n");
}

#[cfg(test)]
mod tests {
    use super::super::record::{Batch, LogLine};
    use super::*;
    use http::Version;

    fn entry(batch: &mut Batch, path: &str, host: Option<&str>) {
        batch.push(&LogLine {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_577_598_123),
            client: Some("2001:db8::1".parse().unwrap()),
            method: "GET",
            host,
            path,
            version: Version::HTTP_11,
            status: 200,
            route: Some("r.1"),
            decision: Some(Decision::ShadowDenied),
            limits: None,
            pk: None,
            cost: None,
            settled_cost: None,
            upstream: Some("127.0.0.1:3000".parse().unwrap()),
            upstream_time: Some(Duration::from_micros(1234)),
            duration: Duration::from_micros(5),
            bytes_received: 7,
            bytes_sent: 42,
            target: b"/a?b=\"c\"",
            tls_version: Some("TLSv1.3"),
            user_agent: Some(b"curl/8 \"x\" \xc3\xa9"),
            referer: None,
            request_id: Some(b"abc"),
            request_line: None,
            error: None,
        });
    }

    /// Whatever the path holds, the line is one valid JSON object with the right values.
    #[test]
    fn json_lines_parse_and_escape() {
        let mut batch = Batch::default();
        let odd = "/a\"b\\c\u{1}d/é/\u{7f}";
        entry(&mut batch, odd, None);
        entry(&mut batch, "/plain", Some("example.com"));
        let mut out = Vec::new();
        let mut clock = SecondCache::default();
        for e in &batch.entries {
            json_line(&mut out, &batch.text, e, &mut clock);
        }
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2);
        let l = &lines[0];
        assert_eq!(l["time"], "2025-12-01T08:26:38.123Z");
        assert_eq!(l["client"], "2001:db8::1");
        assert_eq!(l["path"], odd);
        assert!(l["host"].is_null());
        assert_eq!(l["route"], "r.1");
        assert_eq!(l["decision"], "shadow_denied");
        assert_eq!(l["upstream"], "127.0.0.1:3000");
        assert_eq!(l["upstream_ms"], 1.234);
        assert_eq!(l["duration_ms"], 0.005);
        assert_eq!(l["bytes_sent"], 42);
        assert_eq!(l["bytes_received"], 7);
        assert_eq!(l["protocol"], "HTTP/1.1");
        assert_eq!(l["tls_version"], "TLSv1.3");
        assert_eq!(l["request_id"], "abc");
        assert_eq!(l["user_agent"], r#"curl/8 \x22x\x22 \xC3\xA9"#);
        assert!(l["referer"].is_null());
        assert!(l["error"].is_null());
        assert_eq!(lines[1]["host"], "example.com");
    }

    #[test]
    fn combined_is_nginx_s_line() {
        let mut batch = Batch::default();
        entry(&mut batch, "/a", None);
        let mut out = Vec::new();
        combined_line(
            &mut out,
            &batch.text,
            &batch.entries[0],
            &mut LocalTimeCache::default(),
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2001:db8::1 - - [01/Dec/2025:08:26:38 +0000] \"GET /a?b=\\x22c\\x22 HTTP/1.1\" \
             200 42 \"-\" \"curl/8 \\x22x\\x22 \\xC3\\xA9\"\n"
        );
    }

    /// A refused head: `combined`'s `$request` is the raw line, escaped (nginx's line for
    /// `\x16\x03hello` and for a head with no line at all); JSON names what was wrong.
    #[test]
    fn a_refused_head_logs_its_raw_line_and_error() {
        let mut batch = Batch::default();
        for line in [&b"\x16\x03 hello \"x\""[..], b""] {
            batch.push(&LogLine {
                time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_577_598_123),
                client: Some("127.0.0.1".parse().unwrap()),
                method: "-",
                host: None,
                path: "-",
                target: b"",
                version: Version::HTTP_11,
                tls_version: None,
                status: 400,
                route: None,
                decision: None,
                limits: None,
                pk: None,
                cost: None,
                settled_cost: None,
                upstream: None,
                upstream_time: None,
                duration: Duration::ZERO,
                bytes_received: 0,
                bytes_sent: 0,
                user_agent: None,
                referer: None,
                request_id: None,
                request_line: Some(line),
                error: Some("invalid request line"),
            });
        }
        let mut out = Vec::new();
        let mut clock = LocalTimeCache::default();
        for e in &batch.entries {
            combined_line(&mut out, &batch.text, e, &mut clock);
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 - - [01/Dec/2025:08:26:38 +0000] \"\\x16\\x03 hello \\x22x\\x22\" 400 0 \
             \"-\" \"-\"\n127.0.0.1 - - [01/Dec/2025:08:26:38 +0000] \"-\" 400 0 \"-\" \"-\"\n"
        );
        let mut out = Vec::new();
        json_line(
            &mut out,
            &batch.text,
            &batch.entries[0],
            &mut SecondCache::default(),
        );
        let l: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(l["error"], "invalid request line");
        assert_eq!(l["method"], "-");
        assert_eq!(l["status"], 400);
    }
}
