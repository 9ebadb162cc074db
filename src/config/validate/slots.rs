//! The `resolution` of a limit, checked against its window: pure, so the rules have unit tests.

use std::time::Duration;

use crate::limiter::MAX_SLOTS;

/// Check a `resolution` (already parsed as whole milliseconds ≥ 1 ms) against its `window`:
/// it must divide the window into at most [`MAX_SLOTS`] slots. Returns the resolution, or the
/// message of the config error.
pub(super) fn resolution_in(window: Duration, resolution: Duration) -> Result<Duration, String> {
    let (w, r) = (window.as_millis(), resolution.as_millis());
    let show = |d: Duration| humantime::format_duration(d).to_string();
    if r > w {
        return Err(format!(
            "resolution {} is longer than the window {}",
            show(resolution),
            show(window)
        ));
    }
    if !w.is_multiple_of(r) {
        return Err(format!(
            "resolution {} does not divide the window {} (slots must tile it exactly)",
            show(resolution),
            show(window)
        ));
    }
    if w / r > u128::from(MAX_SLOTS) {
        return Err(format!(
            "resolution {} divides the window {} into {} slots; at most {MAX_SLOTS} are allowed \
             (every decision reads each slot): use a resolution of at least {}",
            show(resolution),
            show(window),
            w / r,
            show(Duration::from_millis((w as u64).div_ceil(MAX_SLOTS)))
        ));
    }
    Ok(resolution)
}

/// A cost limit's resolution when none is given: the largest whole number of milliseconds
/// dividing the window that is at most a sixtieth of it (`1h` → `1m`, `1m` → `1s`, `10s` →
/// `125ms`, the largest divisor of 10000 ms up to 166), or the message of the
/// config error when no such slot gives at most [`MAX_SLOTS`] slots.
pub(super) fn cost_default(window: Duration) -> Result<Duration, String> {
    let w = window.as_millis() as u64;
    let lowest = w.div_ceil(MAX_SLOTS).max(1);
    let mut r = (w / 60).max(1);
    while r >= lowest {
        if w.is_multiple_of(r) {
            return Ok(Duration::from_millis(r));
        }
        r -= 1;
    }
    match w <= MAX_SLOTS {
        true => Ok(Duration::from_millis(1)),
        false => Err(format!(
            "no whole-millisecond slot of at most a sixtieth of the window {} divides it into at              most {MAX_SLOTS} slots: give this cost limit a `resolution`",
            humantime::format_duration(window)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_limit_defaults_to_the_largest_divisor_up_to_a_sixtieth() {
        assert_eq!(cost_default(ms(3_600_000)), Ok(ms(60_000)));
        assert_eq!(cost_default(ms(60_000)), Ok(ms(1000)));
        assert_eq!(cost_default(ms(10_000)), Ok(ms(125)));
        assert_eq!(cost_default(ms(10)), Ok(ms(1)));
        assert!(cost_default(ms(60_013)).is_err(), "a prime window");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_resolution_that_tiles_the_window_in_at_most_1000_slots_passes() {
        assert_eq!(resolution_in(ms(1000), ms(100)), Ok(ms(100)));
        assert_eq!(resolution_in(ms(1000), ms(1000)), Ok(ms(1000)));
        assert_eq!(resolution_in(ms(1000), ms(1)), Ok(ms(1)));
        assert_eq!(resolution_in(ms(60_000), ms(60)), Ok(ms(60)));
    }

    #[test]
    fn longer_than_the_window_not_dividing_it_or_too_many_slots_fail() {
        assert!(resolution_in(ms(100), ms(200))
            .unwrap_err()
            .contains("longer than"));
        assert!(resolution_in(ms(1000), ms(300))
            .unwrap_err()
            .contains("does not divide"));
        let e = resolution_in(ms(60_000), ms(50)).unwrap_err();
        assert!(
            e.contains("1200 slots") && e.contains("at least 60ms"),
            "{e}"
        );
    }
}
