//! A shard's buckets in chunks of fixed capacity instead of one vector that doubles.
//!
//! A doubling vector copies everything it holds each time it grows and frees the old buffer,
//! which the allocator keeps resident until it purges it: measured on a flood of one-request
//! clients, about 40 bytes of RSS per tracked client (176 B per client with one vector, 134 B
//! with the allocator told to purge at once). Chunks are allocated once, at their full
//! capacity, and never moved; a position is a chunk and an offset, so a random bucket is still
//! sampled in O(1), and removing one still moves only the last into its place.

use std::ops::{Index, IndexMut};

/// Items per chunk: 256 buckets are about 20 KiB.
const CHUNK: usize = 256;

/// See the module documentation. Positions are `0..len()`, as in a `Vec`.
#[derive(Debug)]
pub(super) struct Chunks<T> {
    /// Every chunk but the last is full; the last may be empty (kept, so that a push and a
    /// removal alternating at a chunk's edge do not allocate each time).
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunks<T> {
    fn default() -> Self {
        Chunks {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunks<T> {
    /// Items held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The item at `i`, if `i < len()`.
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    /// Add `item` at position `len()`.
    pub(super) fn push(&mut self, item: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => last.push(item),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(item);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Remove the item at `i` and return it; the last item takes its place (as
    /// [`Vec::swap_remove`]). Panics when `i >= len()`.
    pub(super) fn swap_remove(&mut self, i: usize) -> T {
        assert!(i < self.len, "position {i} of {}", self.len);
        if self.chunks.last().is_some_and(Vec::is_empty) {
            self.chunks.pop();
        }
        let last = self
            .chunks
            .last_mut()
            .and_then(Vec::pop)
            .expect("len > 0: the last chunk holds an item");
        self.len -= 1;
        if i == self.len {
            return last;
        }
        std::mem::replace(&mut self[i], last)
    }

    /// Free the chunks beyond what the items need (and the list of chunks, when it is mostly
    /// empty).
    pub(super) fn shrink(&mut self) {
        self.chunks.truncate(self.len.div_ceil(CHUNK));
        if self.chunks.capacity() > 2 * self.chunks.len() {
            self.chunks.shrink_to_fit();
        }
    }

    /// Every item, in position order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }
}

impl<T> Index<usize> for Chunks<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        &self.chunks[i / CHUNK][i % CHUNK]
    }
}

impl<T> IndexMut<usize> for Chunks<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same operations on a `Vec` and on chunks leave the same items at the same positions.
    #[test]
    fn chunks_behave_as_a_vec_with_swap_remove() {
        let (mut chunks, mut vec) = (Chunks::default(), Vec::new());
        let mut rng = fastrand::Rng::with_seed(7);
        for step in 0..20_000u32 {
            // Grow for a while past several chunk edges, then shrink, then mix.
            let remove = match step {
                0..6_000 => rng.u8(..10) == 0,
                6_000..11_000 => rng.u8(..10) != 0,
                _ => rng.bool(),
            };
            if remove && !vec.is_empty() {
                let i = rng.usize(..vec.len());
                assert_eq!(chunks.swap_remove(i), vec.swap_remove(i));
            } else {
                chunks.push(step);
                vec.push(step);
            }
            assert_eq!(chunks.len(), vec.len());
            if step % 1_000 == 0 {
                chunks.shrink();
                assert!(chunks.iter().copied().eq(vec.iter().copied()));
                assert_eq!(chunks.get(vec.len()), None);
            }
        }
        assert!(chunks.iter().copied().eq(vec.iter().copied()));
        for (i, v) in vec.iter().enumerate() {
            assert_eq!(chunks[i], *v);
        }
    }

    #[test]
    fn a_chunk_is_allocated_once_and_never_moves() {
        let mut chunks = Chunks::default();
        chunks.push(0u64);
        let first = &chunks[0] as *const u64;
        for i in 1..CHUNK as u64 * 3 {
            chunks.push(i);
        }
        assert_eq!(
            &chunks[0] as *const u64, first,
            "items are never moved by growth"
        );
        assert_eq!(chunks.chunks.len(), 3);
        // Emptied to a chunk's edge, the empty chunk stays until shrink.
        for _ in 0..CHUNK {
            chunks.swap_remove(0);
        }
        assert_eq!(chunks.chunks.len(), 3);
        chunks.shrink();
        assert_eq!(chunks.chunks.len(), 2);
    }
}
