//! Space-Saving (Metwally, Agrawal, El Abbadi, 2005) over one route's denials: `capacity`
//! counters, each an O(1) update (the "stream summary" as a sorted array: a bump swaps the
//! counter to the end of its group of equal counts and adds one; a new client takes the
//! least counter's place and inherits its count as its error).
//!
//! What it guarantees, with `N` denials seen and `k = capacity`: every client with more than
//! `N / k` denials holds a counter, and for each counter `denied - error <= true denials <=
//! denied`, with `error <= N / k`. Admissions are counted beside the denials of the clients
//! that hold a counter; an admission takes a counter only if one holds no denial (a free one,
//! or a client with admissions only): the summary is of who is limited.

use std::collections::HashMap;

use hashbrown::HashTable;

/// One counter.
#[derive(Debug, Clone, Default)]
pub struct Slot {
    /// The client's bucket key; empty while the slot is free.
    pub key: String,
    hash: u64,
    /// Denials counted, with the error below.
    pub denied: u64,
    /// How much of `denied` may belong to the clients this slot held before.
    pub error: u64,
    /// Admissions since the client took the slot.
    pub allowed: u64,
    /// The limits that refused it, one bit each in the route's order.
    pub refused: u64,
    used: bool,
}

/// See the module documentation.
pub struct SpaceSaving {
    /// Ascending by `denied`; the free slots first (`..free`), then the clients with no
    /// denial, then the others.
    slots: Vec<Slot>,
    /// How many slots are free.
    free: usize,
    /// Positions of the used slots, found by their key.
    index: HashTable<usize>,
    /// The last position of each count present.
    last: HashMap<u64, usize, ahash::RandomState>,
    hasher: ahash::RandomState,
}

impl SpaceSaving {
    /// `capacity` counters (at least one), all free.
    pub fn new(capacity: usize, hasher: ahash::RandomState) -> SpaceSaving {
        let capacity = capacity.max(1);
        let mut summary = SpaceSaving {
            slots: vec![Slot::default(); capacity],
            free: capacity,
            index: HashTable::with_capacity(capacity),
            last: HashMap::with_capacity_and_hasher(capacity, ahash::RandomState::new()),
            hasher,
        };
        summary.last.insert(0, capacity - 1);
        summary
    }

    /// Count one decision of `key`: a denial (by the limits of `refused`), or an admission.
    pub fn record(&mut self, key: &str, denied: bool, refused: u64) {
        let hash = self.hasher.hash_one(key);
        let slots = &self.slots;
        let found = self.index.find(hash, |&i| slots[i].key == key).copied();
        match (found, denied) {
            (Some(i), false) => self.slots[i].allowed += 1,
            (Some(i), true) => {
                let j = self.bump(i);
                self.slots[j].refused |= refused;
            }
            (None, _) => {
                // A free counter while any is left (the last free one, so the free ones stay
                // first); else the least one, if a denial asks or it holds no denial: an
                // admission never takes a counter that holds denials.
                let at = match self.free {
                    0 if denied || self.slots[0].denied == 0 => 0,
                    0 => return,
                    free => free - 1,
                };
                self.free = self.free.saturating_sub(1);
                self.take(at, key, hash, refused);
                match denied {
                    true => drop(self.bump(at)),
                    false => self.slots[at].allowed = 1,
                }
            }
        }
    }

    /// The counter at `at` is `key`'s now, with the count it had as its error.
    fn take(&mut self, at: usize, key: &str, hash: u64, refused: u64) {
        let old = &self.slots[at];
        if old.used {
            if let Ok(entry) = self.index.find_entry(old.hash, |&i| i == at) {
                entry.remove();
            }
        }
        let slot = &mut self.slots[at];
        slot.key.clear();
        slot.key.push_str(key);
        slot.hash = hash;
        slot.error = slot.denied;
        slot.allowed = 0;
        slot.refused = refused;
        slot.used = true;
        let slots = &self.slots;
        self.index.insert_unique(hash, at, |&i| slots[i].hash);
    }

    /// Add one to the counter at `i`, keeping the order; returns its new position.
    fn bump(&mut self, i: usize) -> usize {
        let c = self.slots[i].denied;
        let j = self.last.get(&c).copied().unwrap_or(i);
        if i != j {
            self.repoint(i, usize::MAX);
            self.repoint(j, i);
            // The entry moving from `i` to `j` (marked above, so no two entries say `i`).
            if self.slots[i].used {
                let moved = self.slots[i].hash;
                if let Some(p) = self.index.find_mut(moved, |&p| p == usize::MAX) {
                    *p = j;
                }
            }
            self.slots.swap(i, j);
        }
        if j > 0 && self.slots[j - 1].denied == c {
            self.last.insert(c, j - 1);
        } else {
            self.last.remove(&c);
        }
        self.slots[j].denied = c + 1;
        self.last.entry(c + 1).or_insert(j);
        j
    }

    /// The index entry of the used slot at `from` now says `to`.
    fn repoint(&mut self, from: usize, to: usize) {
        let slot = &self.slots[from];
        if !slot.used {
            return;
        }
        if let Some(p) = self.index.find_mut(slot.hash, |&p| p == from) {
            *p = to;
        }
    }

    /// The used counters, most denied first.
    pub fn entries(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().rev().filter(|s| s.used)
    }

    /// Free every counter (keeping their memory).
    pub fn clear(&mut self) {
        for slot in &mut self.slots {
            slot.key.clear();
            slot.denied = 0;
            slot.error = 0;
            slot.allowed = 0;
            slot.refused = 0;
            slot.used = false;
        }
        self.free = self.slots.len();
        self.index.clear();
        self.last.clear();
        self.last.insert(0, self.slots.len() - 1);
    }

    /// True while no client holds a counter.
    pub fn is_empty(&self) -> bool {
        self.free == self.slots.len()
    }

    /// How many counters it holds.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(k: usize) -> SpaceSaving {
        SpaceSaving::new(k, ahash::RandomState::with_seeds(1, 2, 3, 4))
    }

    /// Exact while the clients fit; sorted; admissions only for clients holding a counter.
    #[test]
    fn exact_while_the_clients_fit() {
        let mut s = summary(4);
        for _ in 0..5 {
            s.record("a", true, 1);
        }
        s.record("b", true, 2);
        s.record("b", false, 0);
        s.record("c", false, 0);
        s.record("a", false, 0);
        let got: Vec<_> = s
            .entries()
            .map(|e| (e.key.as_str(), e.denied, e.error, e.allowed, e.refused))
            .collect();
        assert_eq!(
            got,
            [("a", 5, 0, 1, 1), ("b", 1, 0, 1, 2), ("c", 0, 0, 1, 0)]
        );
        // Full: an admission takes the counter of a client with admissions only, never one
        // with denials; a denial takes the least.
        s.record("d", false, 0);
        s.record("e", false, 0);
        let keys = |s: &SpaceSaving| s.entries().map(|e| e.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&s), ["a", "b", "c", "e"], "e took d's counter");
        s.record("f", true, 4);
        s.record("g", false, 0);
        assert_eq!(keys(&s), ["a", "b", "f", "g"]);
        for _ in 0..3 {
            s.record("h", false, 0);
        }
        assert_eq!(keys(&s), ["a", "b", "f", "h"], "h took g's counter");
        assert_eq!(s.entries().nth(3).unwrap().allowed, 3);
    }

    /// On a skewed stream of many clients, the Space-Saving bounds hold for every client: the
    /// heavy hitters (more than N/k) all hold a counter, and each counter brackets the truth.
    #[test]
    fn bounds_hold_on_a_skewed_stream() {
        let k = 20;
        let mut s = summary(k);
        let mut truth: HashMap<String, u64> = HashMap::new();
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 20_000u64;
        for _ in 0..n {
            // A few heavy clients and a long tail.
            let id = match rng.u32(0..100) {
                0..=29 => 0,
                30..=44 => 1,
                45..=54 => 2,
                _ => rng.u32(3..2000),
            };
            let key = format!("r:ip:{id}");
            s.record(&key, true, 1);
            *truth.entry(key).or_default() += 1;
        }
        let bound = n / k as u64;
        let held: HashMap<&str, &Slot> = s.entries().map(|e| (e.key.as_str(), e)).collect();
        assert_eq!(held.len(), k);
        for (key, &t) in &truth {
            match held.get(key.as_str()) {
                Some(e) => {
                    assert!(
                        e.denied - e.error <= t && t <= e.denied,
                        "{key}: {e:?} vs {t}"
                    );
                    assert!(e.error <= bound);
                }
                None => assert!(
                    t <= bound,
                    "{key} ({t}) is a heavy hitter but holds no counter"
                ),
            }
        }
        let order: Vec<u64> = s.entries().map(|e| e.denied).collect();
        assert!(order.windows(2).all(|w| w[0] >= w[1]), "{order:?}");
        assert_eq!(s.entries().next().unwrap().key, "r:ip:0");
        s.clear();
        assert_eq!(s.entries().count(), 0);
        s.record("x", true, 0);
        assert_eq!(s.entries().next().unwrap().denied, 1);
    }
}
