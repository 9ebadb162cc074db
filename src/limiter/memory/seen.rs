//! Which buckets were evicted while they still counted something: a Bloom filter of their keys
//! beside the summary's counts, so that a client never evicted starts from nothing instead of
//! from whatever its cells hold.
//!
//! The counts alone cannot tell a new client from an evicted one: once a flood of made-up keys
//! has touched every cell of a row, every new client reads a count, and when it is evicted in
//! turn it records that count plus its own, so the figures climb with the flood (a 1 MB store
//! after 200,000 one-request keys admitted 54 % of new clients' quota). A filter answers "never
//! evicted" for all but a few percent of new clients, with 64 bits of state per cell fewer.
//!
//! Keys leave the filter by generations: a key goes into the current one, whose `expires` is
//! the latest time anything recorded in it stops counting; when the older generation has
//! expired it is cleared and becomes the current one. A key is thus kept at least until what it
//! recorded frees (no false negative: the summary never under-counts), and a generation fills
//! for at most about one window.

/// Bits set per key: 3 gives about 9 % false positives with a fifth of the bits set.
const HASHES: u64 = 3;

/// One generation: its bits, and when everything recorded in it has stopped counting (µs).
#[derive(Debug, Default)]
struct Generation {
    words: Vec<u64>,
    expires_us: u64,
}

/// The filter of evicted keys: two generations of `bits` bits each (a power of two).
#[derive(Debug)]
pub(super) struct Seen {
    bits: usize,
    /// The current generation first, then the older one.
    generations: [Generation; 2],
}

impl Seen {
    /// A filter of `bytes` bytes in all (at least 64 bits a generation), allocated at the
    /// first key.
    pub(super) fn sized_for(bytes: usize) -> Seen {
        let bits = (bytes * 8 / 2).max(64);
        Seen {
            bits: 1 << bits.ilog2(),
            generations: Default::default(),
        }
    }

    /// Bytes the two generations take (reserved whether allocated or not).
    pub(super) fn bytes(&self) -> usize {
        2 * self.bits / 8
    }

    /// Keep `key` until at least `frees_us`, at `now`.
    pub(super) fn insert(&mut self, key: u64, frees_us: u64, now: u64) {
        self.rotate(now);
        let words = self.bits / 64;
        let bits = self.bits;
        let current = &mut self.generations[0];
        if current.words.is_empty() {
            current.words = vec![0; words];
        }
        for i in indexes(key, bits) {
            current.words[i / 64] |= 1 << (i % 64);
        }
        current.expires_us = current.expires_us.max(frees_us);
    }

    /// May `key` have been inserted with a time after `now`? (No, for all but a few percent of
    /// keys never inserted.)
    pub(super) fn contains(&self, key: u64, now: u64) -> bool {
        self.generations.iter().any(|g| {
            g.expires_us > now
                && !g.words.is_empty()
                && indexes(key, self.bits).all(|i| g.words[i / 64] & (1 << (i % 64)) != 0)
        })
    }

    /// Shrink to `bytes`: each generation's halves folded together by OR (an index is the
    /// hash's low bits, so a key's bits land where it is looked up).
    pub(super) fn resize_for(&mut self, bytes: usize) {
        let bits = Seen::sized_for(bytes).bits;
        while self.bits > bits {
            self.bits /= 2;
            for g in &mut self.generations {
                if !g.words.is_empty() {
                    let half = g.words.split_off(g.words.len() / 2);
                    for (w, h) in g.words.iter_mut().zip(half) {
                        *w |= h;
                    }
                }
            }
        }
        if self.generations.iter().all(|g| g.words.is_empty()) {
            self.bits = bits;
        }
    }

    /// Once the older generation has expired: clear it and make it the current one.
    fn rotate(&mut self, now: u64) {
        if self.generations[1].expires_us <= now {
            self.generations.swap(0, 1);
            let fresh = &mut self.generations[0];
            fresh.words.fill(0);
            fresh.expires_us = 0;
        }
    }
}

/// The bit indexes of `key` (a keyed hash already): [`HASHES`] of them, by double hashing.
fn indexes(key: u64, bits: usize) -> impl Iterator<Item = usize> {
    let h1 = mix(key ^ 0x5EE5_5EE5_5EE5_5EE5);
    let h2 = mix(h1) | 1;
    (0..HASHES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) as usize) & (bits - 1))
}

/// splitmix64's finaliser.
pub(super) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn a_key_is_kept_until_it_frees_across_generations() {
        let mut seen = Seen::sized_for(1 << 10);
        seen.insert(7, 100 * S, S);
        assert!(seen.contains(7, 99 * S));
        assert!(!seen.contains(7, 100 * S));
        // Later keys rotate generations only once the older has expired: 7 stays.
        for t in 2..99 {
            seen.insert(1000 + t, t * S + 5 * S, t * S);
            assert!(seen.contains(7, t * S), "{t}");
        }
    }

    #[test]
    fn keys_never_inserted_are_mostly_absent_at_a_fifth_of_the_bits() {
        let mut seen = Seen::sized_for(1 << 14);
        let n = seen.bits as u64 / 5;
        for k in 0..n {
            seen.insert(super::mix(k), 10 * S, S);
        }
        for k in 0..n {
            assert!(seen.contains(super::mix(k), 2 * S));
        }
        let others = (n..n + 10_000).filter(|&k| seen.contains(super::mix(k), 2 * S));
        let fp = others.count();
        assert!(fp < 1_300, "{fp} of 10,000 false positives");
    }

    #[test]
    fn folding_keeps_every_key() {
        let mut seen = Seen::sized_for(1 << 12);
        let keys: Vec<u64> = (0..300).map(super::mix).collect();
        for &k in &keys {
            seen.insert(k, 10 * S, S);
        }
        seen.resize_for(1 << 10);
        assert_eq!(seen.bytes(), 1 << 10);
        assert!(keys.iter().all(|&k| seen.contains(k, 2 * S)));
    }
}
