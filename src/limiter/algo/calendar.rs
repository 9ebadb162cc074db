//! Calendar quotas ([`Calendar`], `{ quota = 10000, per = "month", time_zone = "Europe/Berlin" }`):
//! at most `quota` admissions (or cost units) per calendar day, ISO week (from Monday) or month
//! in a time zone, counted from the period's start and forgotten at its end, as the zone's
//! clocks read: a Berlin day is 23 or 25 hours on the days its clocks change.
//!
//! Every decision is on the store's clock. The memory store's clock counts µs since
//! [`UNIX_AT_ZERO_US`] (`clock.rs`), so its record finds its period itself. In Redis the script
//! decides on `TIME`, but has no time-zone rules: the proxy sends the boundaries of the periods
//! around its own now ([`Calendar::boundaries_ms`]), and the script takes the period its `TIME`
//! falls in (the one before, the proxy's, or the next), so a proxy whose clock is off by less
//! than a period still counts on Redis's. The record is a period's end and its count, in memory
//! as in Redis (`lua/kinds/calendar.lua`): a few bytes per client, expiring after the period.

use std::sync::Mutex;
use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use super::clock::UNIX_AT_ZERO_US;
use super::{
    state_of, Kind, KindOptions, Limit, LimitId, OptionError, QuotaUnit, RecordRules, Unit,
};
use crate::limiter::{LimitState, LimitView};

/// The calendar period a quota counts in (`per`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Per {
    /// From midnight to midnight.
    Day,
    /// An ISO week, from Monday midnight.
    Week,
    /// From the first of the month at midnight.
    Month,
}

impl Per {
    /// Its config spelling.
    pub fn name(self) -> &'static str {
        match self {
            Per::Day => "day",
            Per::Week => "week",
            Per::Month => "month",
        }
    }

    /// The longest such period (an hour more where clocks go back): the limit's window.
    pub fn longest(self) -> Duration {
        let days = [1, 7, 31][self as usize];
        Duration::from_secs(days * 86_400 + 3600)
    }
}

/// A time zone of the IANA database bundled in the binary, by its index in the zones in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Zone(u16);

/// The zones in use, each once: a name (leaked once per zone a config names) and its rules.
static ZONES: Mutex<Vec<(&'static str, TimeZone)>> = Mutex::new(Vec::new());

impl Zone {
    /// The zone named `name` (`UTC`, `Europe/Berlin`), or why there is none.
    pub fn named(name: &str) -> Result<Zone, String> {
        let mut zones = ZONES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = zones.iter().position(|(n, _)| *n == name) {
            return Ok(Zone(i as u16));
        }
        let tz = jiff::tz::db().get(name).map_err(|_| {
            format!("`{name}` is no IANA time zone (such as \"Europe/Berlin\" or \"UTC\")")
        })?;
        let i = u16::try_from(zones.len()).map_err(|_| "too many time zones".to_owned())?;
        zones.push((Box::leak(name.into()), tz));
        Ok(Zone(i))
    }

    /// Its name and rules.
    fn get(self) -> (&'static str, TimeZone) {
        let zones = ZONES.lock().unwrap_or_else(|e| e.into_inner());
        zones[usize::from(self.0)].clone()
    }
}

/// A calendar quota's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    per: Per,
    zone: Zone,
    unit: Unit,
}

impl Calendar {
    /// A quota per `per` in `zone` counting `unit`.
    pub const fn new(per: Per, zone: Zone, unit: Unit) -> Calendar {
        Calendar { per, zone, unit }
    }

    /// The period `unix_us` (µs since the Unix epoch) falls in: its start and end, µs since the
    /// Unix epoch.
    pub fn period(self, unix_us: u64) -> (u64, u64) {
        let (_, tz) = self.zone.get();
        // µs since the Unix epoch of a date's first instant in the zone.
        let start_of = |d: Date| Some(d.to_zoned_datetime(tz.clone()).ok()?.timestamp());
        let found = (|| {
            let ts = Timestamp::from_microsecond(unix_us as i64).ok()?;
            let date = ts.to_zoned_datetime(tz.clone()).date();
            let first = match self.per {
                Per::Day => date,
                Per::Week => {
                    let back = i64::from(date.weekday().to_monday_zero_offset());
                    date.checked_sub(back.days()).ok()?
                }
                Per::Month => date.first_of_month(),
            };
            let next = match self.per {
                Per::Day => first.tomorrow().ok()?,
                Per::Week => first.checked_add(7.days()).ok()?,
                Per::Month => first.checked_add(1.month()).ok()?,
            };
            let (start, end) = (start_of(first)?, start_of(next)?);
            Some((start.as_microsecond(), end.as_microsecond()))
        })();
        match found {
            Some((start, end)) => (start.max(0) as u64, end.max(0) as u64),
            // Out of the calendar's range: a day from now.
            None => (unix_us, unix_us + 86_400_000_000),
        }
    }

    /// The boundaries the script needs around `unix_us`, ms since the Unix epoch: the start of
    /// the period it falls in, its end (the next one's start), and the next one's end.
    pub fn boundaries_ms(self, unix_us: u64) -> [u64; 3] {
        let (start, end) = self.period(unix_us);
        let (_, after) = self.period(end);
        [start / 1000, end / 1000, after / 1000]
    }
}

/// The calendar's ARGV: its window value is the end of the proxy's period in ms, its kind value
/// negative (no other kind's): `-(1 + a · 2^22 + b)`, `a` and `b` the lengths in whole seconds
/// of the proxy's period and of the next one (each < 2^22 s, 48 days; the product < 2^53, exact
/// in a double). With them the script knows the three periods around its `TIME` (see
/// `lua/kinds/calendar.lua`).
const SPLIT: i64 = 1 << 22;

impl Kind for Calendar {
    type Record = PeriodCount;

    fn new_record(self) -> PeriodCount {
        let (calendar, end, count) = (self, 0, 0);
        PeriodCount {
            calendar,
            end,
            count,
        }
    }

    /// `per` (`day`, `week`, `month`) and `time_zone` (an IANA name, default `UTC`).
    fn from_options(options: &KindOptions<'_>) -> Option<Result<(Self, Duration), OptionError>> {
        let per = options.get("per")?;
        let err = |option, message: String| Some(Err(OptionError { option, message }));
        let per = match per {
            "day" => Per::Day,
            "week" => Per::Week,
            "month" => Per::Month,
            other => {
                let message = format!("`{other}` is no period: \"day\", \"week\" or \"month\"");
                return err("per", message);
            }
        };
        let zone = match Zone::named(options.get("time_zone").unwrap_or("UTC")) {
            Ok(zone) => zone,
            Err(message) => return err("time_zone", message),
        };
        Some(Ok((Calendar::new(per, zone, options.unit), per.longest())))
    }

    /// `<period>@<zone>` (`month@Europe/Berlin`), and `c` for a cost quota: never a log's
    /// (digits) nor another calendar's.
    fn push_key_suffix(self, _window_ms: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(self.per.name().as_bytes());
        out.push(b'@');
        out.extend_from_slice(self.zone.get().0.as_bytes());
        if self.unit == Unit::Cost {
            out.push(b'c');
        }
    }

    /// `month`, `day-cost` (a route's quotas of one period differ in their zone only rarely:
    /// the config refuses two of one name).
    fn policy_suffix(self, _window_ms: u32) -> String {
        let unit = if self.unit == Unit::Cost { "-cost" } else { "" };
        format!("{}{unit}", self.per.name())
    }

    /// The end of the proxy's period and the lengths of it and the next (`SPLIT`), drawn
    /// around the proxy's clock (the script still decides on its own `TIME`).
    fn script_args(self, _window_us: u64) -> [i64; 2] {
        let now = std::time::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_micros() as u64);
        let [start, end, after] = self.boundaries_ms(now).map(|b| b as i64);
        let secs = |a: i64, b: i64| ((b - a) / 1000).clamp(0, SPLIT - 1);
        [end, -(1 + secs(start, end) * SPLIT + secs(end, after))]
    }

    fn state_from_reply(self, reply: &[i64]) -> LimitState {
        state_of(reply, u64::MAX)
    }

    /// `[count, remaining, reset]` (to the period's end), no values: a log's without entries.
    fn view_from_inspect(self, _: &Limit, head: [i64; 3], values: &[i64]) -> Option<LimitView> {
        values
            .is_empty()
            .then(|| super::log::view_from_inspect(head, values))
    }

    fn unit(self) -> Unit {
        self.unit
    }

    fn quota_unit(self) -> QuotaUnit {
        match self.unit {
            Unit::Cost => QuotaUnit::Cost,
            Unit::Requests => QuotaUnit::Requests,
        }
    }

    /// None: a period has no fixed length (`t` tells the time to its end).
    fn policy_window_s(self, _window: Duration) -> Option<u64> {
        None
    }

    /// One no resolution (a divisor of a month in ms) and no lease has: the period's tag.
    fn summary_tag(self) -> u32 {
        u32::MAX - 1 - (self.per as u32) - (u32::from(self.zone.0) << 2)
    }

    /// The end of `now`'s period.
    fn frees_if_recorded(self, _window_us: u64, now: u64) -> u64 {
        to_store(self.period(to_unix(now)).1)
    }

    fn is_lease(self) -> bool {
        false
    }

    fn resolution_us(self) -> Option<u64> {
        None
    }

    /// `month in Europe/Berlin from 2026-12-01T00:00:00 to 2027-01-01T00:00:00` (local times).
    fn about(self, now_unix_us: u64) -> Option<String> {
        let (name, tz) = self.zone.get();
        let (start, end) = self.period(now_unix_us);
        let text = |us: u64| {
            Timestamp::from_microsecond(us as i64)
                .map(|t| t.to_zoned_datetime(tz.clone()).datetime().to_string())
                .unwrap_or_default()
        };
        Some(format!(
            "{} in {name} from {} to {}",
            self.per.name(),
            text(start),
            text(end)
        ))
    }
}

/// The store's clock (µs since [`UNIX_AT_ZERO_US`]) as µs since the Unix epoch.
fn to_unix(store_us: u64) -> u64 {
    store_us + UNIX_AT_ZERO_US
}

/// µs since the Unix epoch on the store's clock.
fn to_store(unix_us: u64) -> u64 {
    unix_us.saturating_sub(UNIX_AT_ZERO_US)
}

/// One calendar quota of one bucket in the memory store: what it counted in the period ending
/// at `end` (µs on the store's clock; 0: nothing counted).
#[derive(Debug, Clone)]
pub struct PeriodCount {
    calendar: Calendar,
    end: u64,
    count: u32,
}

impl RecordRules for PeriodCount {
    /// A period that ended counts nothing.
    fn evict(&mut self, _id: LimitId, now: u64) {
        if now >= self.end {
            (self.end, self.count) = (0, 0);
        }
    }

    fn count(&self) -> u64 {
        u64::from(self.count)
    }

    fn push(&mut self, _id: LimitId, now: u64, weight: u32) {
        if self.end <= now {
            (self.end, self.count) = (self.calendar.frees_if_recorded(0, now), 0);
        }
        self.count = self.count.saturating_add(weight);
    }

    /// The period's end, full or not: nothing leaves before it.
    fn reset_us(&self, _id: LimitId, _requests: u32, now: u64) -> u64 {
        let end = match self.end {
            0 => self.calendar.frees_if_recorded(0, now),
            end => end,
        };
        end.saturating_sub(now).max(1)
    }

    /// Taken back when `at` is in the counted period.
    fn refund(&mut self, _id: LimitId, at: u64, amount: u32) {
        if self.end > at && self.calendar.frees_if_recorded(0, at) == self.end {
            self.count = self.count.saturating_sub(amount);
        }
    }

    fn newest(&self, _id: LimitId) -> Option<u64> {
        None
    }

    fn frees_us(&self, _id: LimitId) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.end
        }
    }

    /// `count` in the period ending at `frees_us`.
    fn seed(&mut self, _id: LimitId, count: u64, frees_us: u64) {
        self.end = frees_us;
        self.count = count.min(u64::from(u32::MAX)) as u32;
    }

    fn heap_bytes(&self) -> usize {
        0
    }

    fn growth(&self, _id: LimitId) -> usize {
        0
    }

    /// The period's count at its last µs (pushed there, it falls in the same period).
    fn persisted(&self, _id: LimitId) -> Vec<(u64, u32)> {
        match (self.end, self.count) {
            (0, _) | (_, 0) => Vec::new(),
            (end, count) => vec![(end - 1, count)],
        }
    }

    fn view(&self, limit: &Limit, now: u64, _to_unix: &dyn Fn(u64) -> u64) -> LimitView {
        let mut counted = self.clone();
        counted.evict(limit.id(), now);
        let count = counted.count();
        LimitView {
            count,
            remaining: u64::from(limit.requests).saturating_sub(count) as u32,
            reset: Duration::from_micros(counted.reset_us(limit.id(), limit.requests, now)),
            entries_us: Vec::new(),
            slots: Vec::new(),
        }
    }
}

#[cfg(test)]
#[path = "calendar_tests.rs"]
mod tests;
