//! Failed admin authentications: counted, logged within the log budget, and slowed per client
//! address, as fail2ban or Kong's brute-force protection do (issue 52 row 12).
//!
//! Each address may fail [`FREE_FAILURES`] times at once, then once per [`REFILL`] (a GCRA
//! bucket: `tat` is when the address's failures will have drained). An address over that is
//! answered `429` with `Retry-After` *without its token being checked*, so guessing from one
//! address runs at 1 try per 10 s instead of the tens of thousands a second the check allows.
//! A request without credentials (a browser's first visit, before its login prompt) is no
//! failure.
//!
//! IPv6 addresses are taken by their /64 (one host commonly holds a whole /64). The table is
//! fixed: [`SETS`] × [`WAYS`] ways (128 KB), placed by a hash keyed at random per
//! process, so a client cannot aim at one set. An address whose set holds only addresses still
//! draining is charged to one shared overflow instead, so a flood of addresses neither grows the
//! table nor evicts an address being slowed; the cost falls on the flood's own overflow.

use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use prometheus::{register_int_counter_vec, IntCounterVec};

use crate::logs::limit::{Every, EVENT_INTERVAL};

/// Failures an address may make at once.
pub const FREE_FAILURES: u32 = 5;
/// One more failure allowed per this long.
pub const REFILL: Duration = Duration::from_secs(10);
/// Sets of the table.
pub const SETS: usize = 1024;
/// Entries per set.
pub const WAYS: usize = 4;

/// `slidegate_admin_auth_failures_total{outcome}`.
static FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "slidegate_admin_auth_failures_total",
        "Admin requests with wrong credentials (outcome=wrong) or refused unchecked because \
         their address failed too often (outcome=throttled)",
        &["outcome"]
    )
    .expect("register slidegate_admin_auth_failures_total")
});

/// Register this module's metric at startup.
pub fn register_metrics() {
    LazyLock::force(&FAILURES);
}

/// An address as throttled: IPv4 whole, IPv6 by its /64.
fn key_of(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)) | (1 << 127),
        IpAddr::V6(v6) => u128::from(v6) & !((1u128 << 64) - 1),
    }
}

#[derive(Debug, Clone, Copy)]
struct Way {
    key: u128,
    /// When this address's failures will have drained; at or before now the way is free.
    tat: Instant,
}

/// The table (see the module documentation). Pure: every call takes the time.
pub struct Table {
    hasher: RandomState,
    ways: Vec<Option<Way>>,
    overflow: Option<Way>,
}

/// The GCRA slack: how far `tat` may run ahead of now and still allow a try.
fn tolerance() -> Duration {
    REFILL * (FREE_FAILURES - 1)
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table {
            hasher: RandomState::new(),
            ways: vec![None; SETS * WAYS],
            overflow: None,
        }
    }

    fn set(&self, key: u128) -> std::ops::Range<usize> {
        let set = (self.hasher.hash_one(key) as usize) % SETS;
        set * WAYS..(set + 1) * WAYS
    }

    /// Where `key`'s failures are counted now: its own way, a free one, or the shared overflow.
    fn way_mut(&mut self, key: u128, now: Instant) -> &mut Option<Way> {
        let range = self.set(key);
        let own = range
            .clone()
            .find(|&i| self.ways[i].is_some_and(|s| s.key == key));
        let free = || {
            range
                .clone()
                .find(|&i| self.ways[i].is_none_or(|s| s.tat <= now))
        };
        match own.or_else(free) {
            Some(i) => &mut self.ways[i],
            None => &mut self.overflow,
        }
    }

    /// May `ip` try a token now? `Err(wait)`: not for `wait`.
    pub fn may_try(&mut self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = key_of(ip);
        match *self.way_mut(key, now) {
            Some(s) if s.tat > now + tolerance() => Err(s.tat - tolerance() - now),
            _ => Ok(()),
        }
    }

    /// `ip` presented wrong credentials at `now`.
    pub fn failed(&mut self, ip: IpAddr, now: Instant) {
        let key = key_of(ip);
        let way = self.way_mut(key, now);
        let tat = match *way {
            // The shared overflow keeps its count whoever is charged to it.
            Some(s) if s.key == key || s.tat > now => s.tat.max(now),
            _ => now,
        };
        let key = way.map_or(key, |s| if s.tat > now { s.key } else { key });
        *way = Some(Way {
            key,
            tat: tat + REFILL,
        });
    }
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

/// [`Table`] behind a mutex, with the metric and the log line.
#[derive(Default)]
pub struct Throttle {
    table: Mutex<Table>,
    line: Mutex<(Every, u64)>,
}

impl Throttle {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// May `ip` try a token at `now`? A refusal is counted and logged.
    pub fn may_try(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let verdict = self.table().may_try(ip, now);
        if verdict.is_err() {
            FAILURES.with_label_values(&["throttled"]).inc();
            self.log(ip, now, true);
        }
        verdict
    }

    /// `ip` presented wrong credentials at `now`: counted, logged, and charged.
    pub fn failed(&self, ip: IpAddr, now: Instant) {
        FAILURES.with_label_values(&["wrong"]).inc();
        self.table().failed(ip, now);
        self.log(ip, now, false);
    }

    /// One WARN line per [`EVENT_INTERVAL`] at most, with the counts since the last one.
    fn log(&self, ip: IpAddr, now: Instant, throttled: bool) {
        let mut line = self.line.lock().unwrap_or_else(|e| e.into_inner());
        line.1 += u64::from(throttled);
        let Some(n) = line.0.note(now, EVENT_INTERVAL) else {
            return;
        };
        let refused = std::mem::take(&mut line.1);
        log::warn!(
            "admin: {n} failed authentication(s) since the last line, {refused} of them refused \
             unchecked (429); latest from {ip}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    #[test]
    fn five_failures_then_one_per_refill() {
        let t = Instant::now();
        let mut table = Table::new();
        let ip = v4(0x0a00_0001);
        for _ in 0..FREE_FAILURES {
            assert_eq!(table.may_try(ip, t), Ok(()));
            table.failed(ip, t);
        }
        assert_eq!(table.may_try(ip, t), Err(REFILL));
        assert_eq!(table.may_try(ip, t + REFILL / 2), Err(REFILL / 2));
        assert_eq!(table.may_try(ip, t + REFILL), Ok(()));
        table.failed(ip, t + REFILL);
        assert!(table.may_try(ip, t + REFILL).is_err());
        // Others are not slowed, and the address is forgiven once drained.
        assert_eq!(table.may_try(v4(7), t), Ok(()));
        assert_eq!(table.may_try(ip, t + REFILL * 7), Ok(()));
    }

    #[test]
    fn ipv6_is_throttled_by_its_64() {
        let t = Instant::now();
        let mut table = Table::new();
        let a = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 1));
        let b = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 9, 9, 9, 9));
        let other = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 2, 0, 0, 0, 1));
        for _ in 0..FREE_FAILURES {
            table.failed(a, t);
        }
        assert!(table.may_try(b, t).is_err());
        assert_eq!(table.may_try(other, t), Ok(()));
    }

    #[test]
    fn a_flood_of_addresses_neither_grows_the_table_nor_frees_a_slowed_one() {
        let t = Instant::now();
        let mut table = Table::new();
        let victim = v4(0x0a00_0001);
        for _ in 0..FREE_FAILURES {
            table.failed(victim, t);
        }
        for n in 0..100_000u32 {
            table.failed(v4(0x5000_0000 + n), t);
        }
        assert_eq!(table.ways.len(), SETS * WAYS);
        assert_eq!(
            std::mem::size_of::<Option<Way>>(),
            32,
            "4,096 entries in 128 KB"
        );
        assert!(
            table.may_try(victim, t).is_err(),
            "the slowed address was forgotten"
        );
        // The flood's overflow is charged to one shared entry, which is slowed in turn.
        let untracked = (0..100_000u32)
            .map(|n| v4(0x5000_0000 + n))
            .filter(|&ip| table.may_try(ip, t).is_err())
            .count();
        assert!(untracked > 90_000, "{untracked}");
    }
}
