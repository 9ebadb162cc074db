//! `[log] log_format`: an access line written as nginx's `log_format` writes it, text with
//! `$variables` (or `${variables}`) filled in per request: nginx's own (those of `combined` and a
//! few more) and slidegate's, which name the limit and the bucket (`$limit_decision`,
//! `$limit_refused`, `$limit_pk`, `$cost`, `$cost_settled`). An empty value is `-`, as nginx
//! writes it. Parsed here, once; `access_log` writes it.

/// A variable of `log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogVar {
    /// `$remote_addr`: the client address (after trusted `X-Forwarded-For` hops).
    RemoteAddr,
    /// `$remote_user`: always `-` (no HTTP authentication).
    RemoteUser,
    /// `$time_local`: `01/Dec/2026:08:26:38 +0000`.
    TimeLocal,
    /// `$request`: the request line as sent.
    Request,
    /// `$status`.
    Status,
    /// `$body_bytes_sent`.
    BodyBytesSent,
    /// `$http_referer`, escaped as nginx escapes.
    HttpReferer,
    /// `$http_user_agent`, escaped as nginx escapes.
    HttpUserAgent,
    /// `$host`: the request's host, without port.
    Host,
    /// `$server_protocol`: `HTTP/1.1`, `HTTP/2.0`.
    ServerProtocol,
    /// `$request_time`: seconds with milliseconds.
    RequestTime,
    /// `$upstream_addr`.
    UpstreamAddr,
    /// `$upstream_response_time`: seconds with milliseconds.
    UpstreamResponseTime,
    /// `$request_id`: `X-Request-Id`.
    RequestId,
    /// `$limit_req_status`: nginx's words for the decision (`PASSED`, `DELAYED`, `REJECTED`,
    /// `REJECTED_DRY_RUN`).
    LimitReqStatus,
    /// `$route`: the matched route's name.
    Route,
    /// `$limit_decision`: the decision as `slidegate_requests_total` counts it.
    LimitDecision,
    /// `$limit_refused`: the policy names of the limits that refused, comma-separated.
    LimitRefused,
    /// `$limit_pk`: the client's bucket's `pk` (a keyed hash, never the key).
    LimitPk,
    /// `$cost`: the cost charged at admission.
    Cost,
    /// `$cost_settled`: the cost the upstream reported (`settle`).
    CostSettled,
}

/// Every variable and its name.
pub const VARIABLES: [(&str, LogVar); 21] = [
    ("remote_addr", LogVar::RemoteAddr),
    ("remote_user", LogVar::RemoteUser),
    ("time_local", LogVar::TimeLocal),
    ("request", LogVar::Request),
    ("status", LogVar::Status),
    ("body_bytes_sent", LogVar::BodyBytesSent),
    ("http_referer", LogVar::HttpReferer),
    ("http_user_agent", LogVar::HttpUserAgent),
    ("host", LogVar::Host),
    ("server_protocol", LogVar::ServerProtocol),
    ("request_time", LogVar::RequestTime),
    ("upstream_addr", LogVar::UpstreamAddr),
    ("upstream_response_time", LogVar::UpstreamResponseTime),
    ("request_id", LogVar::RequestId),
    ("limit_req_status", LogVar::LimitReqStatus),
    ("route", LogVar::Route),
    ("limit_decision", LogVar::LimitDecision),
    ("limit_refused", LogVar::LimitRefused),
    ("limit_pk", LogVar::LimitPk),
    ("cost", LogVar::Cost),
    ("cost_settled", LogVar::CostSettled),
];

/// `combined` as a `log_format`: what `format = "combined"` writes.
pub const COMBINED: &str = "$remote_addr - $remote_user [$time_local] \"$request\" $status \
                            $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

/// One piece of a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Written as is.
    Text(String),
    /// Filled in per request.
    Var(LogVar),
}

/// A parsed `log_format`: its text (what a restart's diff compares) and its pieces.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogFormat {
    text: String,
    #[serde(skip)]
    pieces: Vec<Piece>,
}

impl LogFormat {
    /// The pieces of a line, in order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }
}

/// Why a `log_format` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogFormatError {
    /// `$name` is not a variable.
    #[error("unknown variable ${0} (known: {known})", known = known())]
    Unknown(String),
    /// `$` with no name, or `${` unclosed.
    #[error("a '$' must start a variable name, as in $remote_addr or ${{remote_addr}}")]
    Dangling,
    /// A line break would split a line.
    #[error("must be one line (no control characters)")]
    Control,
}

fn known() -> String {
    VARIABLES.map(|(n, _)| format!("${n}")).join(", ")
}

impl std::str::FromStr for LogFormat {
    type Err = LogFormatError;

    /// nginx's syntax: `$name` runs over letters, digits and `_`; `${name}` stops at `}`.
    fn from_str(text: &str) -> Result<LogFormat, LogFormatError> {
        if text.chars().any(char::is_control) {
            return Err(LogFormatError::Control);
        }
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            if at > 0 {
                pieces.push(Piece::Text(rest[..at].to_owned()));
            }
            let after = &rest[at + 1..];
            let (name, next) = match after.strip_prefix('{') {
                Some(braced) => {
                    let end = braced.find('}').ok_or(LogFormatError::Dangling)?;
                    (&braced[..end], &braced[end + 1..])
                }
                None => {
                    let end = (after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
                        .unwrap_or(after.len());
                    (&after[..end], &after[end..])
                }
            };
            if name.is_empty() {
                return Err(LogFormatError::Dangling);
            }
            let var = (VARIABLES.iter().find(|(n, _)| *n == name))
                .ok_or_else(|| LogFormatError::Unknown(name.to_owned()))?;
            pieces.push(Piece::Var(var.1));
            rest = next;
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Ok(LogFormat {
            text: text.to_owned(),
            pieces,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_syntax_parses_and_unknown_names_are_named() {
        let f: LogFormat = "$remote_addr [${time_local}] $limit_pk-$cost_settled\"x"
            .parse()
            .unwrap();
        assert_eq!(
            f.pieces(),
            [
                Piece::Var(LogVar::RemoteAddr),
                Piece::Text(" [".into()),
                Piece::Var(LogVar::TimeLocal),
                Piece::Text("] ".into()),
                Piece::Var(LogVar::LimitPk),
                Piece::Text("-".into()),
                Piece::Var(LogVar::CostSettled),
                Piece::Text("\"x".into()),
            ]
        );
        assert!(COMBINED.parse::<LogFormat>().is_ok());
        assert_eq!(
            "$limit".parse::<LogFormat>(),
            Err(LogFormatError::Unknown("limit".into()))
        );
        assert_eq!("a $ b".parse::<LogFormat>(), Err(LogFormatError::Dangling));
        assert_eq!("${cost".parse::<LogFormat>(), Err(LogFormatError::Dangling));
        assert_eq!("a\nb".parse::<LogFormat>(), Err(LogFormatError::Control));
    }
}
