//! The cases of calendar quotas (`per`): exactly `quota` admitted in a period under concurrency
//! on every backend, `reset` the time to the period's end on the store's clock, all or nothing
//! with a log and by cost, and a refund gives back in the period it was taken in.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::store::{check, inspect, limit, ROUTE};
use futures::future::join_all;
use slidegate::limiter::algo::calendar::{Calendar, Per, Zone};
use slidegate::limiter::{Admission, Buckets, Limit, LimitKind, Store, Unit};

/// A quota per `per` in `zone` counting `unit`.
fn quota(amount: u32, per: Per, zone: &str, unit: Unit) -> Limit {
    let calendar = Calendar::new(per, Zone::named(zone).unwrap(), unit);
    Limit::of(amount, per.longest(), LimitKind::Calendar(calendar))
}

/// The time from now to the end of the current month in `zone`.
fn to_month_end(zone: &str) -> Duration {
    let calendar = Calendar::new(Per::Month, Zone::named(zone).unwrap(), Unit::Requests);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    Duration::from_micros(calendar.period(now).1 - now)
}

/// 300 concurrent decisions against a monthly quota of 37 in Berlin: exactly 37 admitted, each
/// answer's reset the time to the month's end (within a few seconds: the store's clock), the
/// inspector counting 37, and a refund giving one back.
pub async fn calendar_exact_under_concurrency(store: Arc<dyn Store>) {
    let month = quota(37, Per::Month, "Europe/Berlin", Unit::Requests);
    let runs = (0..300).map(|_| {
        let store = store.clone();
        async move { check(&store, "cal:a", &[month]).await }
    });
    let verdicts = join_all(runs).await;
    let admitted: Vec<_> = verdicts.iter().filter(|v| v.admitted).collect();
    assert_eq!(admitted.len(), 37, "{}", store.backend());
    let end = to_month_end("Europe/Berlin");
    for v in &verdicts {
        let reset = v.states[0].reset;
        assert!(
            reset <= end + Duration::from_secs(5) && reset + Duration::from_secs(5) >= end,
            "{}: reset {reset:?}, the month ends in {end:?}",
            store.backend()
        );
    }
    assert!(verdicts
        .iter()
        .filter(|v| !v.admitted)
        .all(|v| v.states[0].remaining == 0));
    let view = inspect(&store, "cal:a", &[month]).await;
    assert_eq!(
        (view[0].count, view[0].remaining),
        (37, 0),
        "{}",
        store.backend()
    );
    let at = admitted[0].recorded_times().expect("recorded").to_vec();
    let buckets = Buckets::one("cal:a");
    store
        .refund(Admission::new(ROUTE, &buckets, &[month], &at))
        .await
        .expect("refund");
    assert_eq!(inspect(&store, "cal:a", &[month]).await[0].count, 36);
    assert!(check(&store, "cal:a", &[month]).await.admitted);
    assert!(!check(&store, "cal:a", &[month]).await.admitted);
}

/// Stacked with a log, all or nothing, and by cost: a cost that does not fit the daily UTC
/// quota takes no request slot, a full log denies even a cost of 0 (charged nowhere), and two
/// quotas of one period in different zones are two records.
pub async fn calendar_cost_and_log_all_or_nothing(store: Arc<dyn Store>) {
    let day = quota(100, Per::Day, "UTC", Unit::Cost);
    let both = |cost| {
        [
            day.weighted(cost),
            limit(2, Duration::from_secs(60)).weighted(cost),
        ]
    };
    let v = check(&store, "cal:b", &both(90)).await;
    assert!(v.admitted, "{v:?}");
    assert_eq!((v.states[0].remaining, v.states[1].remaining), (10, 1));
    let v = check(&store, "cal:b", &both(11)).await;
    assert!(!v.admitted, "11 does not fit in 10: {v:?}");
    assert_eq!(v.violated().collect::<Vec<_>>(), [0]);
    assert_eq!(v.states[1].remaining, 1, "the denial took no request slot");
    assert!(check(&store, "cal:b", &both(5)).await.admitted);
    let v = check(&store, "cal:b", &both(0)).await;
    assert!(!v.admitted, "the log is full: {v:?}");
    assert_eq!(v.violated().collect::<Vec<_>>(), [1]);
    let counts = inspect(&store, "cal:b", &both(1)).await;
    assert_eq!(
        (counts[0].count, counts[1].count),
        (95, 2),
        "{}",
        store.backend()
    );
    let tokyo = quota(1, Per::Day, "Asia/Tokyo", Unit::Requests);
    let utc = quota(1, Per::Day, "UTC", Unit::Requests);
    assert!(check(&store, "cal:c", &[tokyo, utc]).await.admitted);
    let v = check(&store, "cal:c", &[tokyo, utc]).await;
    assert_eq!(v.violated().collect::<Vec<_>>(), [0, 1], "{v:?}");
}
