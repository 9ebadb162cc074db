//! Windows that survive a restart and a zero-downtime upgrade: the memory store's buckets
//! written to `[store] state_file` when the process stops deciding, and read at the next start.
//!
//! **When.** The process writes (an atomic replace: a temporary file beside it, written,
//! `fsync`ed, renamed over the old one, the directory `fsync`ed; mode 0600) on SIGTERM once
//! the drain has ended (no connection left, so no decision), after the grace period or SIGINT
//! otherwise, and on SIGQUIT *before* Pingora hands the listening sockets to the successor,
//! which reads the file only once it has them (`Server::bootstrap` waits for them): the old
//! process has written before the new one reads, and the new one reads before it decides.
//! The old process still decides for its own connections after the hand-over (Pingora keeps
//! both accepting for 5 s, and the old finishes what it holds): those decisions reach neither
//! the file nor the successor, so for that overlap a client can be admitted by each process
//! from the same starting count (never more than its limit by each). It writes nothing at its
//! exit after a hand-over (the successor owns the file from then on).
//!
//! **What.** Every held bucket of every route: the exact log's entries, a slotted or cost
//! limit's slots, a calendar quota's count; with the key hash's seed (so the same client finds
//! its bucket: the file is as secret as the seed, hence 0600). Not kept: leases of a
//! concurrency limit (requests in flight end with the process), the summaries of evicted
//! buckets (what they held frees within a window; a client evicted before the stop starts
//! from nothing after it), and the local fallback of a shared store (its counts are this
//! process's view of an outage).
//!
//! **Bound.** At most [`MAX_FILE_BYTES`]: the fullest buckets first, the rest dropped, counted
//! and logged. The reader drops what has passed while the process was down, limits no
//! longer configured, and what exceeds `max_memory`.
//!
//! **Refusal.** A file that is not one (magic), of another format version, whose checksum does
//! not match (corrupt, cut short) or larger than the bound is refused with its reason; the
//! process starts empty. A crash (`kill -9`, OOM) writes nothing: the next start reads the file
//! of the last orderly stop, whose entries still in their window count again, and forgets
//! everything decided since that start.

mod format;
mod windows;

use std::io::Write as _;
use std::path::{Path, PathBuf};

pub use format::{decode, encode, ArenaState, BucketState, LimitState, Snapshot, MAGIC, VERSION};

use super::MemoryStore;
use crate::limiter::LimitId;

/// The largest state file written or read: 16 MiB, about 1.3 million entries (12 bytes each,
/// 260,000 clients at 5 of 5). At a SIGQUIT the file is written before the sockets are handed
/// over, and Pingora's new process waits about 5 s for them from its start, so the write must
/// stay well inside that: in a debug build a full 16 MiB file (250,000 clients at 5 of 5,
/// 37,631 of them left out) was written in 1.3 s and read in 0.9 s; 63 MB took 4.6 s.
pub const MAX_FILE_BYTES: usize = 16 << 20;

/// Why a state file was not written or not read.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// It does not start with [`MAGIC`].
    #[error("not a slidegate state file (it does not start with \"SLGWSTAT\")")]
    Foreign,
    /// Shorter than the header.
    #[error("cut short: shorter than the header")]
    Truncated,
    /// Another format version.
    #[error("format version {0}, but this slidegate reads version {VERSION} only")]
    Version(u32),
    /// The checksum does not match.
    #[error("checksum mismatch: the file is corrupt or cut short")]
    Checksum,
    /// The checksum matched, but the contents make no sense.
    #[error("corrupt: {0}")]
    Corrupt(&'static str),
    /// Larger than [`MAX_FILE_BYTES`].
    #[error("{0} bytes, more than the {MAX_FILE_BYTES} bytes a state file may hold")]
    TooLarge(u64),
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What a write kept and left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Saved {
    /// Buckets written.
    pub buckets: usize,
    /// Their steps (entries; a slot or a period counts one).
    pub steps: usize,
    /// Buckets left out: the file would have exceeded [`MAX_FILE_BYTES`].
    pub dropped_buckets: usize,
    /// Bytes written.
    pub bytes: usize,
}

/// What a read restored and left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Buckets restored.
    pub buckets: usize,
    /// What they count (requests, cost units).
    pub counted: usize,
    /// Buckets whose every window passed while the process was down.
    pub expired: usize,
    /// Buckets of routes or limits no longer configured.
    pub gone: usize,
    /// Buckets beyond `max_memory`.
    pub full: usize,
}

/// Write `store`'s windows to `path` (see the module documentation), at most `max_bytes`.
pub fn save(store: &MemoryStore, path: &Path, max_bytes: usize) -> Result<Saved, PersistError> {
    let (snapshot, mut saved) = windows::take_snapshot(store, max_bytes);
    let bytes = encode(&snapshot);
    write_atomically(path, &bytes)?;
    saved.bytes = bytes.len();
    Ok(saved)
}

/// Read `path` into `store`, which must not have decided yet; `ids` finds a limit by its
/// route and its id's text. `Ok(None)`: there is no file (a first start).
pub fn load(
    store: &MemoryStore,
    path: &Path,
    ids: &dyn Fn(&str, &str) -> Option<LimitId>,
) -> Result<Option<Loaded>, PersistError> {
    let bytes = match read_bounded(path) {
        Ok(bytes) => bytes,
        Err(PersistError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let snapshot = decode(&bytes)?;
    Ok(Some(windows::restore(
        store,
        snapshot,
        ids,
        windows::wall_now_us(),
    )))
}

/// The file's bytes, refused past [`MAX_FILE_BYTES`] before they are read.
fn read_bounded(path: &Path) -> Result<Vec<u8>, PersistError> {
    let len = std::fs::metadata(path)?.len();
    if len > MAX_FILE_BYTES as u64 {
        return Err(PersistError::TooLarge(len));
    }
    Ok(std::fs::read(path)?)
}

/// The temporary file a write goes to first, beside `path` (a rename is atomic within one
/// file system only).
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Replace `path` by `bytes` so that a reader finds the old file or the new one, whole, even
/// across a power loss: write a temporary file, `fsync` it, rename it over `path`, `fsync` the
/// directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = temporary(path);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
