//! Connections accepted but still silent when the proxy stops accepting.
//!
//! On a graceful shutdown (or the old process's half of an upgrade) Pingora stops the accept
//! loop and then drops every HTTP/1 connection still waiting in `read_request`, including one
//! accepted an instant before whose client has not written its request yet. That client sees its
//! connection closed without an answer, though the proxy accepted it: one request in a few
//! thousand during an upgrade under load. So [`EdgeApp`](super::EdgeApp) counts the connections
//! that have not sent a byte yet (from the moment it receives them, so a TLS handshake counts),
//! and its `cleanup` (which is what makes Pingora drop them) first waits, at most [`window`],
//! until that count has stayed at zero for [`QUIET`]: a connection accepted just before the
//! accept loop stopped is counted only when its task first runs, so one reading of zero is not
//! enough (that race still cut one request in ~8,000 during the upgrade test). Keep-alive
//! connections between requests are not counted: they already sent a request, and Pingora
//! closes them idle as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::edge::quiet::Quiet;

/// How often the count is read while waiting.
const POLL: Duration = Duration::from_millis(10);

/// How long the count must stay at zero before the silent connections are taken as all spoken.
pub const QUIET: Duration = Duration::from_millis(100);

/// The longest `cleanup` waits for silent connections: a client that connected writes its
/// request within a round trip, and one that has said nothing for a second is not about to.
/// Never longer than the grace period, which bounds the whole drain.
pub fn window(grace: Duration) -> Duration {
    grace.min(Duration::from_secs(1))
}

/// The count of accepted connections that have not sent a byte yet.
#[derive(Debug, Clone, Default)]
pub struct Silent(Arc<AtomicUsize>);

impl Silent {
    /// Count a connection just accepted; it leaves the count when the guard is dropped (on its
    /// first byte, or when the connection ends).
    pub fn enter(&self) -> SilentGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        SilentGuard(self.0.clone())
    }

    /// Connections accepted that have not sent a byte yet.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Wait until no accepted connection has been silent for [`QUIET`], or `window` has
    /// passed. Returns how many were still silent.
    pub async fn settle(&self, window: Duration) -> usize {
        let started = tokio::time::Instant::now();
        let mut quiet = Quiet::new(QUIET);
        loop {
            let now = tokio::time::Instant::now();
            let count = i64::try_from(self.count()).unwrap_or(i64::MAX);
            if quiet.settled(count, now.into_std()) || now - started >= window {
                return self.count();
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// One silent connection's place in [`Silent`]'s count.
#[derive(Debug)]
pub struct SilentGuard(Arc<AtomicUsize>);

impl Drop for SilentGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_a_second_at_most_and_never_beyond_the_grace_period() {
        assert_eq!(window(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(
            window(Duration::from_millis(200)),
            Duration::from_millis(200)
        );
        assert_eq!(window(Duration::ZERO), Duration::ZERO);
    }

    #[tokio::test]
    async fn settle_returns_once_the_last_silent_connection_speaks() {
        let silent = Silent::default();
        let first = silent.enter();
        let second = silent.enter();
        assert_eq!(silent.count(), 2);
        drop(first);
        let speaks = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(second);
        });
        let started = std::time::Instant::now();
        assert_eq!(silent.settle(Duration::from_secs(5)).await, 0);
        // Not at the first zero: the count had to stay there for the quiet period.
        assert!(started.elapsed() >= QUIET + Duration::from_millis(30));
        assert!(started.elapsed() < Duration::from_secs(2));
        speaks.await.unwrap();
    }

    #[tokio::test]
    async fn settle_gives_up_after_the_window() {
        let silent = Silent::default();
        let _quiet = silent.enter();
        let started = std::time::Instant::now();
        assert_eq!(silent.settle(Duration::from_millis(50)).await, 1);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
