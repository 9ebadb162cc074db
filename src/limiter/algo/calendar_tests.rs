//! Unit tests of `calendar.rs`.

use super::*;
use crate::limiter::algo::clock::{Clock, FakeClock};
use crate::limiter::algo::LimitKind;

fn berlin(per: Per, unit: Unit) -> Calendar {
    Calendar::new(per, Zone::named("Europe/Berlin").unwrap(), unit)
}

/// µs since the Unix epoch of a UTC time given in seconds.
const S: u64 = 1_000_000;

#[test]
fn berlin_days_are_23_and_25_hours_when_clocks_change_weeks_start_monday() {
    let day = berlin(Per::Day, Unit::Requests);
    // 2026-03-29 00:00:30 CET (23:00:30Z the day before): a 23-hour day.
    let (start, end) = day.period(1_774_738_830 * S);
    assert_eq!((start, end - start), (1_774_738_800 * S, 23 * 3600 * S));
    // 2026-10-25, clocks back at 03:00 CEST: 25 hours from 2026-10-24T22:00Z.
    let (start, end) = day.period(1_792_900_000 * S);
    assert_eq!((start, end - start), (1_792_879_200 * S, 25 * 3600 * S));
    // The week of Wednesday 2026-12-02 starts Monday 2026-11-30 00:00 CET.
    let (start, end) = berlin(Per::Week, Unit::Requests).period(1_796_200_000 * S);
    assert_eq!((start, end - start), (1_795_993_200 * S, 7 * 86_400 * S));
    // December 2026 in Berlin: 2026-11-30T23:00Z to 2026-12-31T23:00Z; in UTC an hour on.
    let (start, end) = berlin(Per::Month, Unit::Requests).period(1_796_200_000 * S);
    assert_eq!((start, end), (1_796_079_600 * S, 1_798_758_000 * S));
    let utc = Calendar::new(Per::Month, Zone::named("UTC").unwrap(), Unit::Requests);
    assert_eq!(utc.period(1_796_200_000 * S).0, 1_796_083_200 * S);
    // What the script gets: the period's start, end and the next one's end, in ms.
    let ms = day.boundaries_ms(1_774_738_830 * S).map(|b| b / 1000);
    assert_eq!(ms, [1_774_738_800, 1_774_821_600, 1_774_908_000]);
    let id = Limit::of(
        5,
        Per::Day.longest(),
        LimitKind::Calendar(berlin(Per::Day, Unit::Cost)),
    )
    .id();
    assert_eq!(
        (id.to_string(), id.policy_suffix()),
        ("day@Europe/Berlinc".into(), "day-cost".into())
    );
    assert!(id.kind().script_args(0)[1] < 0);
}

#[test]
fn a_quota_counts_per_period_and_starts_again_at_its_end() {
    let day = berlin(Per::Day, Unit::Requests);
    let id = Limit::of(2, Per::Day.longest(), LimitKind::Calendar(day)).id();
    // 10 s before Berlin's midnight of 2026-10-25, on the store's clock.
    let clock = FakeClock::at(to_store(1_792_879_190 * S));
    let mut r = day.new_record();
    let admit = |r: &mut PeriodCount, now: u64| {
        r.evict(id, now);
        let ok = r.count() < 2;
        if ok {
            r.push(id, now, 1);
        }
        ok
    };
    assert!(admit(&mut r, clock.now_us()) && admit(&mut r, clock.now_us()));
    assert!(!admit(&mut r, clock.now_us()));
    assert_eq!(r.reset_us(id, 2, clock.now_us()), 10 * S);
    r.refund(id, clock.now_us(), 1);
    assert!(admit(&mut r, clock.now_us()));
    clock.advance(Duration::from_secs(10));
    assert!(admit(&mut r, clock.now_us()));
    assert_eq!(r.reset_us(id, 2, clock.now_us()), 25 * 3600 * S);
}

#[test]
fn options_name_what_is_wrong() {
    let parse = |given: &[(&'static str, &str)]| {
        let unit = Unit::Requests;
        Calendar::from_options(&KindOptions { given, unit })
    };
    assert!(parse(&[("time_zone", "UTC")]).is_none());
    let err = |r: Option<Result<(Calendar, Duration), OptionError>>| r.unwrap().unwrap_err();
    assert_eq!(err(parse(&[("per", "year")])).option, "per");
    assert_eq!(
        err(parse(&[("per", "day"), ("time_zone", "Mars/Base")])).option,
        "time_zone"
    );
    let (_, window) = parse(&[("per", "month")]).unwrap().unwrap();
    assert_eq!(window, Duration::from_secs(31 * 86_400 + 3600));
}
