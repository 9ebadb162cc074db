//! What the promise of a limit looks like from the upstream: the arrival times of admitted
//! requests, checked for any window holding more than the limit, and a bounded poll of a
//! gauge on the proxy's `/metrics` (readiness, never a fixed sleep).

use std::time::{Duration, Instant};

use super::proxy::Proxy;
use super::upstream::Upstream;

/// When the upstream saw each request whose `header` is `value`, in arrival order.
pub fn arrivals(up: &Upstream, header: &str, value: &str) -> Vec<Instant> {
    up.requests()
        .into_iter()
        .filter(|r| r.headers.get(header).is_some_and(|v| v == value))
        .map(|r| r.arrived)
        .collect()
}

/// The shortest span between an arrival and the `requests`-th one after it: more than
/// `requests` fit in one window exactly when this is shorter than the window (as seen by the
/// upstream, so forwarding jitter is inside it). `None` with `requests` or fewer arrivals.
pub fn tightest_span(arrivals: &[Instant], requests: usize) -> Option<Duration> {
    arrivals
        .windows(requests + 1)
        .map(|w| w[requests].duration_since(w[0]))
        .min()
}

/// Poll `sample` on `/metrics` until it equals `want`; panics after `within`.
pub async fn until_metric(proxy: &Proxy, sample: &str, want: f64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = proxy.metric(sample);
        if now == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sample} is {now:?}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
