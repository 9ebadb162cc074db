//! A proxy's own counts of one route's clients per minute, for the last [`KEPT_MINUTES`]
//! minutes: each minute at most `capacity` clients, merged fold by fold as Misra-Gries
//! summaries merge (Agarwal et al., 2012: add, and past `capacity` clients take the
//! (`capacity` + 1)-th largest count off every one and drop those left with none), so that a
//! minute's counts stay lower bounds, short of the truth by at most `N / capacity`.

use std::collections::{HashMap, VecDeque};

use crate::limiter::top::TopCount;

/// Minutes kept: the longest span asked, and the minute in progress.
pub const KEPT_MINUTES: u64 = 16;

/// See the module documentation.
pub struct Minutes {
    capacity: usize,
    /// Oldest first.
    minutes: VecDeque<(u64, HashMap<String, TopCount>)>,
}

impl Minutes {
    /// Minutes of at most `capacity` clients each.
    pub fn new(capacity: usize) -> Minutes {
        Minutes {
            capacity: capacity.max(1),
            minutes: VecDeque::new(),
        }
    }

    /// Clients kept per minute.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Add `counts` to `minute` (minutes older than [`KEPT_MINUTES`] before it are dropped).
    pub fn add(&mut self, minute: u64, counts: impl IntoIterator<Item = TopCount>) {
        while let Some(&(m, _)) = self.minutes.front() {
            if m + KEPT_MINUTES > minute {
                break;
            }
            self.minutes.pop_front();
        }
        if self.minutes.back().is_none_or(|(m, _)| *m != minute) {
            self.minutes.push_back((minute, HashMap::new()));
        }
        let Some((_, clients)) = self.minutes.back_mut() else {
            return;
        };
        for c in counts {
            let into = clients.entry(c.bucket.clone()).or_default();
            into.bucket = c.bucket;
            into.denied += c.denied;
            into.allowed += c.allowed;
            into.refused |= c.refused;
        }
        shrink(clients, self.capacity);
    }

    /// The clients of the `span` minutes up to `now` (the minute in progress included), plus
    /// `extra` (counts not folded yet), summed, most denied first, at most `max`.
    pub fn top(&self, now: u64, span: u64, extra: Vec<TopCount>, max: usize) -> Vec<TopCount> {
        let first = now.saturating_sub(span.saturating_sub(1));
        let mut sums: HashMap<String, TopCount> = HashMap::new();
        let kept = (self.minutes.iter())
            .filter(|(m, _)| (first..=now).contains(m))
            .flat_map(|(_, clients)| clients.values().cloned());
        for c in kept.chain(extra) {
            let into = sums.entry(c.bucket.clone()).or_default();
            into.bucket = c.bucket;
            into.denied += c.denied;
            into.allowed += c.allowed;
            into.refused |= c.refused;
        }
        let mut top: Vec<TopCount> = sums.into_values().collect();
        sort(&mut top);
        top.truncate(max);
        top
    }
}

/// Most denied first, then by bucket (a stable answer).
pub fn sort(top: &mut [TopCount]) {
    top.sort_by(|a, b| {
        b.denied
            .cmp(&a.denied)
            .then_with(|| a.bucket.cmp(&b.bucket))
    });
}

/// The Misra-Gries merge's last step: past `capacity` clients, take the (`capacity` + 1)-th
/// largest denial count off every client and keep those left with some.
fn shrink(clients: &mut HashMap<String, TopCount>, capacity: usize) {
    if clients.len() <= capacity {
        return;
    }
    let mut counts: Vec<u64> = clients.values().map(|c| c.denied).collect();
    let (_, &mut cut, _) = counts.select_nth_unstable_by(capacity, |a, b| b.cmp(a));
    clients.retain(|_, c| c.denied > cut);
    for c in clients.values_mut() {
        c.denied -= cut;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(bucket: &str, denied: u64, allowed: u64) -> TopCount {
        TopCount {
            bucket: bucket.into(),
            denied,
            allowed,
            refused: 1,
        }
    }

    #[test]
    fn minutes_sum_over_the_span_asked_and_forget_the_old_ones() {
        let mut m = Minutes::new(10);
        m.add(100, [count("a", 3, 1), count("b", 1, 0)]);
        m.add(100, [count("a", 2, 0)]);
        m.add(101, [count("b", 9, 2)]);
        let top = m.top(101, 2, vec![count("a", 1, 0)], 50);
        assert_eq!(top, [count("b", 10, 2), count("a", 6, 1)]);
        assert_eq!(m.top(101, 1, Vec::new(), 50), [count("b", 9, 2)]);
        m.add(100 + KEPT_MINUTES, [count("c", 1, 0)]);
        assert_eq!(m.minutes.len(), 2, "minute 100 dropped, 101 kept");
        assert_eq!(m.top(116, 15, Vec::new(), 50), [count("c", 1, 0)]);
    }

    /// Past capacity the counts stay lower bounds within N / capacity, and a client above that
    /// is kept.
    #[test]
    fn a_full_minute_keeps_lower_bounds() {
        let mut m = Minutes::new(4);
        let mut n = 0;
        let mut folds = Vec::new();
        for i in 0..40u64 {
            folds.push(count(&format!("tail{i}"), 1, 0));
            n += 1;
        }
        folds.push(count("heavy", 30, 0));
        n += 30;
        m.add(7, folds);
        let top = m.top(7, 1, Vec::new(), 50);
        assert!(top.len() <= 4);
        assert_eq!(top[0].bucket, "heavy");
        assert!(
            top[0].denied <= 30 && top[0].denied + n / 4 >= 30,
            "{top:?}"
        );
    }
}
