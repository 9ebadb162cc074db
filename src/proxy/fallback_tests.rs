//! In-process hook tests of `on_error = "local"` when calls to the shared store are lost (they
//! time out without reaching it): this proxy's own log decides, and once the store answers
//! again it may admit only into what that log left, so one proxy never admits more than the
//! limit in a window however its calls fared.

use std::sync::Arc;

use super::tests::{decision, rules};
use super::SlideGate;
use crate::limiter::fixtures::Counting;
use crate::limiter::memory::MemoryStore;
use crate::limiter::Store;
use crate::metrics::Decision;

/// `api`: 3 requests a minute per client, on a shared store (never connected here).
const RULES: &str = r#"
[store]
backend = "redis"
url = "redis://127.0.0.1:1"

[[routes]]
name = "api"
upstream = "app"
path_prefix = "/"
limits = [ { requests = 3, window = "60s" } ]
"#;

#[tokio::test]
async fn lost_calls_then_answers_admit_at_most_the_limit() {
    let rules = rules("fallback.toml", RULES);
    let store = Arc::new(Counting::default());
    store.lose_calls(true);
    let local: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let gate = SlideGate::new(rules, store.clone())
        .with_local_fallback(Some(local), crate::limiter::fallback::learned::MAX_LEARNED);
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u32::from(decision(&gate).await == Some(Decision::LocalAllowed));
    }
    assert_eq!(admitted, 3, "the local log admits the limit");
    // The store answers again, having seen none of them: it would admit 3 more.
    store.lose_calls(false);
    for _ in 0..5 {
        let d = decision(&gate).await;
        assert!(
            !matches!(d, Some(Decision::Allowed)),
            "past the limit: {d:?}"
        );
    }
}
