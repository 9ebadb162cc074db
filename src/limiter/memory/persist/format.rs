//! The state file's bytes: a header (magic, version, when it was written on the wall clock and
//! on the writer's store clock, the key hash seed), the arenas with their buckets and each
//! bucket's limits as (time, amount) steps, and an xxh3 checksum of everything before it.
//! Little-endian throughout:
//!
//! ```text
//! "SLGWSTAT" | version u32 | wall_us u64 | clock_us u64 | seed u64 | arenas u32
//!   arena:   name_len u16 | name | buckets u32
//!   bucket: key u64 | limits u8
//!   limit:  id_len u8 | id (its Redis key suffix, e.g. "60000", "1000@100c") | steps u32
//!   step:   time_us u64 | amount u32
//! checksum u64 (xxh3 of every byte before it)
//! ```
//!
//! Decoding checks the length, magic, version and checksum before it reads a count, and every
//! count against the bytes left, so a corrupt or hostile file is refused without a large
//! allocation or a panic.

use super::PersistError;

/// The file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"SLGWSTAT";

/// The format this build writes and reads.
pub const VERSION: u32 = 1;

/// Magic, version, wall, clock, seed, arena count.
const HEADER: usize = 8 + 4 + 8 + 8 + 8 + 4;
const CHECKSUM: usize = 8;
/// One step's bytes.
pub(super) const STEP_BYTES: usize = 12;

/// Everything the file holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Wall-clock time of the write, µs since the Unix epoch.
    pub wall_us: u64,
    /// The writer's store clock at the write (µs since 2020, its entries' clock).
    pub clock_us: u64,
    /// The key hash's seed the buckets' keys were made with.
    pub seed: u64,
    /// One per route.
    pub arenas: Vec<ArenaState>,
}

/// One route's buckets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ArenaState {
    /// The route's name.
    pub route: String,
    /// Its buckets.
    pub buckets: Vec<BucketState>,
}

/// One bucket: its key hash and each limit's steps.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketState {
    /// The seeded hash of the bucket key.
    pub key: u64,
    /// One per limit that counts something.
    pub limits: Vec<LimitState>,
}

/// One limit of one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitState {
    /// The limit's id as its Redis key suffix.
    pub id: String,
    /// (time µs on the writer's clock, amount), oldest first.
    pub steps: Vec<(u64, u32)>,
}

impl BucketState {
    /// Its encoded size.
    pub(super) fn encoded_len(&self) -> usize {
        let limits: usize = (self.limits.iter())
            .map(|l| 1 + l.id.len() + 4 + l.steps.len() * STEP_BYTES)
            .sum();
        8 + 1 + limits
    }
}

/// Size of an arena's own bytes (name and count), its buckets apart.
pub(super) fn arena_overhead(route: &str) -> usize {
    2 + route.len() + 4
}

/// Size of a file with no arena.
pub(super) const EMPTY_LEN: usize = HEADER + CHECKSUM;

/// The file's bytes.
pub fn encode(s: &Snapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(EMPTY_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for v in [s.wall_us, s.clock_us, s.seed] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&(s.arenas.len() as u32).to_le_bytes());
    for arena in &s.arenas {
        // Route names are config keys: short (the config refuses none, so cut at u16).
        let name = &arena.route.as_bytes()[..arena.route.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(arena.buckets.len() as u32).to_le_bytes());
        for b in &arena.buckets {
            out.extend_from_slice(&b.key.to_le_bytes());
            out.push(b.limits.len().min(u8::MAX as usize) as u8);
            for l in b.limits.iter().take(u8::MAX as usize) {
                let id = &l.id.as_bytes()[..l.id.len().min(u8::MAX as usize)];
                out.push(id.len() as u8);
                out.extend_from_slice(id);
                out.extend_from_slice(&(l.steps.len() as u32).to_le_bytes());
                for &(t, n) in &l.steps {
                    out.extend_from_slice(&t.to_le_bytes());
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
        }
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A reader over the checked body that refuses to run past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PersistError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(PersistError::Corrupt("a count runs past the end"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, PersistError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, PersistError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, PersistError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, PersistError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
    /// A count of items of at least `min` bytes each, no more than the bytes left can hold.
    fn count(&mut self, n: usize, min: usize) -> Result<usize, PersistError> {
        if n.saturating_mul(min) > self.left() {
            return Err(PersistError::Corrupt("a count larger than the file"));
        }
        Ok(n)
    }
    fn text(&mut self, n: usize) -> Result<String, PersistError> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| PersistError::Corrupt("a name"))
    }
}

/// The snapshot in `bytes`, or why it is refused.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, PersistError> {
    if bytes.len() < MAGIC.len() && MAGIC.starts_with(bytes) {
        return Err(PersistError::Truncated);
    }
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(PersistError::Foreign);
    }
    if bytes.len() < EMPTY_LEN {
        return Err(PersistError::Truncated);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4"));
    if version != VERSION {
        return Err(PersistError::Version(version));
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM);
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8")) {
        // A file cut short fails here too: its last 8 bytes are no checksum of the rest.
        return Err(PersistError::Checksum);
    }
    let mut r = Reader {
        bytes: body,
        at: 12,
    };
    let (wall_us, clock_us, seed) = (r.u64()?, r.u64()?, r.u64()?);
    let n = r.u32()? as usize;
    let mut arenas = Vec::with_capacity(r.count(n, 6)?);
    for _ in 0..n {
        let len = r.u16()? as usize;
        let route = r.text(len)?;
        let n = r.u32()? as usize;
        let mut buckets = Vec::with_capacity(r.count(n, 9)?);
        for _ in 0..n {
            let key = r.u64()?;
            let n = r.u8()? as usize;
            let mut limits = Vec::with_capacity(r.count(n, 5)?);
            for _ in 0..n {
                let len = r.u8()? as usize;
                let id = r.text(len)?;
                let n = r.u32()? as usize;
                let mut steps = Vec::with_capacity(r.count(n, STEP_BYTES)?);
                for _ in 0..n {
                    steps.push((r.u64()?, r.u32()?));
                }
                limits.push(LimitState { id, steps });
            }
            buckets.push(BucketState { key, limits });
        }
        arenas.push(ArenaState { route, buckets });
    }
    if r.left() != 0 {
        return Err(PersistError::Corrupt("bytes after the last arena"));
    }
    Ok(Snapshot {
        wall_us,
        clock_us,
        seed,
        arenas,
    })
}
