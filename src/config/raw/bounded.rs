//! Values bounded at parse time: durations within a range ([`BoundedDuration`] and its named
//! instances), whole-millisecond windows and resolutions, and byte sizes. Serde errors name
//! the bound, and the TOML parser adds the line.

use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// Parse a humantime duration and check it lies in `min..=max`; messages start with `what`.
///
/// Runs inside deserialization, so the TOML parser attaches the value's line to the error.
fn parse_bounded(what: &str, text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let dur =
        humantime::parse_duration(text).map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    if dur < min {
        return Err(format!(
            "{what} {text:?} is shorter than {}",
            humantime::format_duration(min)
        ));
    }
    if dur > max {
        return Err(format!(
            "{what} {text:?} is longer than {}",
            humantime::format_duration(max)
        ));
    }
    Ok(dur)
}

/// A humantime duration bounded to `MIN_MS..=MAX_MS` milliseconds, checked while parsing so
/// an out-of-range value is reported with its line like any other parse error.
#[derive(Clone, Copy)]
pub(in crate::config) struct BoundedDuration<const MIN_MS: u64, const MAX_MS: u64>(pub Duration);

impl<'de, const MIN_MS: u64, const MAX_MS: u64> Deserialize<'de>
    for BoundedDuration<MIN_MS, MAX_MS>
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let min = Duration::from_millis(MIN_MS);
        let max = Duration::from_millis(MAX_MS);
        parse_bounded("duration", &text, min, max)
            .map(BoundedDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// `store.timeout`: 1 ms ..= 60 s. Zero would time out every decision before the store could
/// answer; unbounded values overflow `timeout * 4` in the Redis store's connect timeout.
pub(in crate::config) type StoreTimeout = BoundedDuration<1, 60_000>;

/// `server.grace_period`: 0 ..= 1 h. Zero (no drain) is allowed; an hour is far beyond any
/// sane drain and keeps the seconds pingora is given small.
pub(in crate::config) type GracePeriod = BoundedDuration<0, 3_600_000>;

/// `server.shutdown_delay`: 0 ..= 10 min. How long SIGTERM keeps serving with `/readyz` at 503
/// before the drain: endpoint propagation takes seconds, and a longer stop only holds a deploy.
pub(in crate::config) type ShutdownDelay = BoundedDuration<0, 600_000>;

/// `server.client_header_timeout`, `client_body_timeout`, `send_timeout`: 1 ms ..= 1 h (a
/// whole request head in more than an hour is an attack, not a client).
pub(in crate::config) type ClientTimeout = BoundedDuration<1, 3_600_000>;

/// `server.keepalive_timeout`: 0 (keep-alive off, like nginx `keepalive_timeout 0`) ..= 1 h.
pub(in crate::config) type KeepaliveTimeout = BoundedDuration<0, 3_600_000>;

/// `[upstreams.*]` `connect_timeout`, `read_timeout`, `write_timeout`, `idle_timeout`:
/// 1 ms ..= 1 h. Zero would fail every request (or pool nothing); Pingora takes them as-is.
pub(in crate::config) type UpstreamTimeout = BoundedDuration<1, 3_600_000>;

/// A route's `plan.refresh`: 100 ms ..= 60 s (default 2 s).
pub(in crate::config) type PlanRefresh = BoundedDuration<100, 60_000>;

/// A concurrency limit's `lease_ttl`: 1 s ..= 1 h (a crashed proxy's leases stay held for
/// at most this long).
pub(in crate::config) type LeaseTtl = BoundedDuration<1000, 3_600_000>;

/// `lease_ttl` when a concurrency limit names none.
pub(in crate::config) const DEFAULT_LEASE_TTL: std::time::Duration =
    std::time::Duration::from_secs(30);

pub(in crate::config) type DenyCacheMaxAge = BoundedDuration<1, 3_600_000>;

/// `max_delay` (route and `[store]` default): 0 (no waiting, today's behaviour) ..= 60 s. A
/// waiting request holds its client's connection (or HTTP/2 stream) and a timer; a client that
/// would wait longer is better told `Retry-After` and left to come back.
pub(in crate::config) type MaxDelay = BoundedDuration<0, 60_000>;

/// A size in bytes written as `"32MB"`, `"1GB"`, `"512KB"` or plain bytes (`"1048576"`).
///
/// Units are binary, as in nginx (`32m` is 32 × 2^20): `KB`/`KiB` = 2^10, `MB`/`MiB` = 2^20,
/// `GB`/`GiB` = 2^30; case-insensitive. At least 1 MiB, at most 1 TiB, checked while parsing.
#[derive(Clone, Copy)]
pub(in crate::config) struct ByteSize(pub u64);

/// Parse a [`ByteSize`] text.
fn parse_byte_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {text:?}: expected e.g. \"32MB\" or \"1GB\""))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(format!(
                "invalid size {text:?}: unit must be B, KB, MB or GB"
            ))
        }
    };
    let bytes = n
        .checked_mul(1 << shift)
        .filter(|b| *b <= 1 << 40)
        .ok_or_else(|| format!("size {text:?} is larger than 1TB"))?;
    if bytes < 1 << 20 {
        return Err(format!("size {text:?} is smaller than 1MB"));
    }
    Ok(bytes)
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_byte_size(&text)
            .map(ByteSize)
            .map_err(serde::de::Error::custom)
    }
}

/// Longest window: 30 days. Window plus a microsecond timestamp then stays far below 2^53,
/// so Lua's doubles in the Redis script are exact, and neither `Limit::window_us` nor the
/// milliseconds of a `LimitId` can truncate.
pub const MAX_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// A window length: humantime syntax, whole milliseconds, 1 ms ..= [`MAX_WINDOW`].
#[derive(Clone, Copy)]
pub(in crate::config) struct Window(pub Duration);

impl<'de> Deserialize<'de> for Window {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        whole_ms("window", &String::deserialize(d)?)
            .map(Window)
            .map_err(serde::de::Error::custom)
    }
}

/// A limit's slot length: like a [`Window`] (whole milliseconds, 1 ms ..= [`MAX_WINDOW`]);
/// how it must fit its window is checked in `validate`.
#[derive(Clone, Copy)]
pub(in crate::config) struct Resolution(pub Duration);

impl<'de> Deserialize<'de> for Resolution {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        whole_ms("resolution", &String::deserialize(d)?)
            .map(Resolution)
            .map_err(serde::de::Error::custom)
    }
}

/// A humantime duration of whole milliseconds, 1 ms ..= [`MAX_WINDOW`].
fn whole_ms(what: &str, text: &str) -> Result<Duration, String> {
    let dur = parse_bounded(what, text, Duration::from_millis(1), MAX_WINDOW)?;
    if !dur.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(format!(
            "{what} {text:?} must be a whole number of milliseconds"
        ));
    }
    Ok(dur)
}

/// Durations print back in the humantime syntax they are read in (`-T`).
fn humantime_text<S: Serializer>(d: Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(d).to_string())
}

impl<const MIN_MS: u64, const MAX_MS: u64> Serialize for BoundedDuration<MIN_MS, MAX_MS> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        humantime_text(self.0, s)
    }
}

impl Serialize for Window {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        humantime_text(self.0, s)
    }
}

impl Serialize for Resolution {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        humantime_text(self.0, s)
    }
}

/// The largest whole binary unit, so `-T` prints `"256MB"` for the default.
impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (n, unit) = [(30, "GB"), (20, "MB"), (10, "KB")]
            .into_iter()
            .find(|(shift, _)| self.0.is_multiple_of(1 << shift))
            .map_or((self.0, "B"), |(shift, unit)| (self.0 >> shift, unit));
        s.serialize_str(&format!("{n}{unit}"))
    }
}

#[cfg(test)]
mod print_back {
    use super::*;

    #[test]
    fn sizes_and_durations_print_as_they_parse() {
        for text in ["256MB", "1GB", "1536KB", "1048577B"] {
            let size = ByteSize(parse_byte_size(text).unwrap());
            let printed = serde_json::to_value(size).unwrap();
            assert_eq!(printed.as_str(), Some(text));
        }
        let d: GracePeriod = BoundedDuration(Duration::from_millis(1500));
        assert_eq!(serde_json::to_value(d).unwrap().as_str(), Some("1s 500ms"));
    }
}
