//! `[log] log_format` lines: the pieces of an nginx-style format filled in from a request's
//! entry on the writer thread (`config::log_format` parses them). The variables of `combined`
//! write exactly what `combined_line` writes for them.

use std::io::Write;

use super::format::{dash_or, write_request, LocalTimeCache};
use super::record::Entry;
use crate::config::log_format::{LogVar, Piece};
use crate::metrics::Decision;

/// Append one line of `pieces` for `e`.
pub(super) fn custom_line(
    out: &mut Vec<u8>,
    text: &str,
    e: &Entry,
    pieces: &[Piece],
    clock: &mut LocalTimeCache,
) {
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
            Piece::Var(var) => variable(out, text, e, *var, clock),
        }
    }
    out.push(b'\n');
}

/// Seconds with milliseconds, as nginx's `$request_time`.
fn seconds(out: &mut Vec<u8>, d: std::time::Duration) {
    let ms = d.as_millis();
    let _ = write!(out, "{}.{:03}", ms / 1000, ms % 1000);
}

fn or_dash(out: &mut Vec<u8>, value: Option<impl std::fmt::Display>) {
    match value {
        Some(v) => {
            let _ = write!(out, "{v}");
        }
        None => out.push(b'-'),
    }
}

/// nginx's `$limit_req_status` words for a decision.
fn limit_req_status(decision: Decision) -> &'static str {
    match decision {
        Decision::Allowed | Decision::LocalAllowed | Decision::ErrorAllowed => "PASSED",
        Decision::Exempt => "PASSED",
        Decision::Delayed => "DELAYED",
        Decision::Denied | Decision::LocalDenied | Decision::ErrorDenied => "REJECTED",
        Decision::Overloaded => "REJECTED",
        Decision::ShadowDenied => "REJECTED_DRY_RUN",
    }
}

fn variable(out: &mut Vec<u8>, text: &str, e: &Entry, var: LogVar, clock: &mut LocalTimeCache) {
    match var {
        LogVar::RemoteAddr => or_dash(out, e.client),
        LogVar::RemoteUser => out.push(b'-'),
        LogVar::TimeLocal => clock.write(out, e.time),
        LogVar::Request => write_request(out, text, e),
        LogVar::Status => {
            let _ = write!(out, "{}", e.status);
        }
        LogVar::BodyBytesSent => {
            let _ = write!(out, "{}", e.bytes_sent);
        }
        LogVar::HttpReferer => dash_or(out, text, &e.referer),
        LogVar::HttpUserAgent => dash_or(out, text, &e.user_agent),
        LogVar::Host => dash_or(out, text, &e.host),
        LogVar::ServerProtocol => {
            let _ = write!(out, "{:?}", e.version);
        }
        LogVar::RequestTime => seconds(out, e.duration),
        LogVar::UpstreamAddr => or_dash(out, e.upstream),
        LogVar::UpstreamResponseTime => match e.upstream_time {
            Some(d) => seconds(out, d),
            None => out.push(b'-'),
        },
        LogVar::RequestId => dash_or(out, text, &e.request_id),
        LogVar::LimitReqStatus => or_dash(out, e.decision.map(limit_req_status)),
        LogVar::Route => dash_or(out, text, &e.route),
        LogVar::LimitDecision => or_dash(out, e.decision.map(Decision::as_str)),
        LogVar::LimitRefused => dash_or(out, text, &e.limits),
        LogVar::LimitPk => dash_or(out, text, &e.pk),
        LogVar::Cost => or_dash(out, e.cost),
        LogVar::CostSettled => or_dash(out, e.settled_cost),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use http::Version;

    use super::super::format::combined_line;
    use super::super::record::{Batch, LogLine};
    use super::*;
    use crate::config::log_format::{LogFormat, COMBINED};

    fn denied(batch: &mut Batch) {
        batch.push(&LogLine {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_577_598_123),
            client: Some("10.0.0.7".parse().unwrap()),
            method: "GET",
            host: Some("api.example"),
            path: "/api/items",
            target: b"/api/items?page=2",
            version: Version::HTTP_2,
            tls_version: None,
            status: 429,
            route: Some("api"),
            decision: Some(Decision::Denied),
            limits: Some("api-10s-global"),
            pk: Some("q2Jd0Vb1m3lWAZ3c"),
            cost: Some(3),
            settled_cost: None,
            upstream: None,
            upstream_time: None,
            duration: Duration::from_micros(1500),
            bytes_received: 0,
            bytes_sent: 17,
            user_agent: Some(b"curl/8"),
            referer: None,
            request_id: Some(b"r-1"),
            request_line: None,
            error: None,
        });
    }

    fn line(batch: &Batch, format: &str) -> String {
        let f: LogFormat = format.parse().unwrap();
        let mut out = Vec::new();
        let clock = &mut LocalTimeCache::default();
        custom_line(&mut out, &batch.text, &batch.entries[0], f.pieces(), clock);
        String::from_utf8(out).unwrap()
    }

    /// `combined` as a `log_format` is `combined`, byte for byte; the limit variables name
    /// the decision, the refusing policy, the `pk` and the costs (`-` for none).
    #[test]
    fn combined_variables_and_the_limit_ones() {
        let mut batch = Batch::default();
        denied(&mut batch);
        let mut plain = Vec::new();
        let clock = &mut LocalTimeCache::default();
        combined_line(&mut plain, &batch.text, &batch.entries[0], clock);
        assert_eq!(line(&batch, COMBINED).as_bytes(), plain);
        let f = "$status $limit_req_status $limit_decision \"$limit_refused\" pk=$limit_pk \
                 cost=$cost settled=$cost_settled $route $request_time $upstream_addr $host \
                 $server_protocol $request_id";
        assert_eq!(
            line(&batch, f),
            "429 REJECTED denied \"api-10s-global\" pk=q2Jd0Vb1m3lWAZ3c cost=3 settled=- api \
             0.001 - api.example HTTP/2.0 r-1\n"
        );
    }
}
