//! In-process hook tests of smoothing (`max_delay`) when the store's answers come back late, as
//! on a loaded proxy: a waiter's budget is measured on what the store decided, so the time an
//! answer spends on its way back never turns a waiter that fits into a 429.

use std::sync::Arc;
use std::time::Duration;

use super::tests::{decision, rules};
use super::SlideGate;
use crate::limiter::fixtures::Counting;
use crate::metrics::Decision;

/// `smooth`: 2 requests per 500 ms per client, a denial may wait up to 500 ms.
const RULES: &str = r#"
[store]
backend = "memory"
max_queue = 8

[[routes]]
name = "smooth"
upstream = "app"
path_prefix = "/"
limits = [ { requests = 2, window = "500ms" } ]
max_delay = "500ms"
"#;

/// A and B (50 ms apart) fill the window; W and V are denied at once and wait for A's room.
/// From then on every answer comes back 80 ms late. One of W and V takes A's room; the other
/// is told B's room frees 50 ms later, within its 500 ms from its first denial, and must wait
/// for it: timed from the late answers, its wait would seem 80 ms longer than it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_fits_is_served_however_late_the_answers_come_back() {
    let rules = rules("smooth.toml", RULES);
    let store = Arc::new(Counting::default());
    store.answer_late_after(4, Duration::from_millis(80));
    let gate = SlideGate::new(rules, store.clone());
    assert_eq!(decision(&gate).await, Some(Decision::Allowed), "A");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(decision(&gate).await, Some(Decision::Allowed), "B");
    let (w, v) = tokio::join!(decision(&gate), decision(&gate));
    assert_eq!((w, v), (Some(Decision::Delayed), Some(Decision::Delayed)));
    assert!(
        store.reached() >= 7,
        "W and V were decided again after waiting"
    );
}
