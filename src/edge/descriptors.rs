//! The descriptor reserve (issue 52 row 7): the proxy never spends its last file descriptors on
//! client connections and the HTTP/2 streams that hold upstream connections, so the admin
//! listener (`/healthz`), Redis, the logs and new clients stay served.
//!
//! The process's descriptor limit (`RLIMIT_NOFILE`, raised to its hard limit at start) less
//! [`RESERVE`] is a budget of descriptors, counted where the edge accepts work:
//!
//! - a client connection takes 2: its own descriptor and one for the upstream connection its
//!   requests use (one at a time on HTTP/1.1; an HTTP/2 connection's first stream). Without 2
//!   free it is closed at once, like one over `max_connections`;
//! - an HTTP/2 stream in flight uses its connection's second descriptor if no other stream does,
//!   else takes 1 more (each may hold an upstream connection of its own), but never one of the
//!   last [`NEW_CLIENT_ROOM`]: those are left to new client connections. A stream that finds none is refused
//!   (`RST_STREAM(REFUSED_STREAM)`, reason `descriptors`: not processed, the client may retry).
//!
//! So a few connections trickling many HTTP/2 bodies (each stream holding an upstream
//! connection) are held to the budget less the room, and new clients and the admin listener
//! still find descriptors. The count errs on the safe side: an HTTP/2 upstream multiplexes
//! streams over few connections, and an idle HTTP/1 connection holds no upstream one.

use std::sync::{Arc, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Descriptors never counted in the budget: the listeners, the admin listener and its
/// connections, Redis, log files, Pingora's own (epoll, timers, the upgrade socket) and idle
/// upstream connections in the pool.
pub const RESERVE: u64 = 64;

/// Descriptors HTTP/2 streams leave free for new client connections (2 each: 32 connections).
pub const NEW_CLIENT_ROOM: usize = 64;

/// The budget has no room for what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

/// The budget, once the descriptor limit is known (none in process tests: no bound).
static BUDGET: OnceLock<Arc<Semaphore>> = OnceLock::new();

/// The budget for a descriptor limit of `soft`: `soft` less [`RESERVE`] (at least half of it,
/// for a limit too small to run well anyway).
pub fn budget_for(soft: u64) -> usize {
    let budget = soft.saturating_sub(RESERVE).max(soft / 2);
    usize::try_from(budget)
        .unwrap_or(usize::MAX)
        .min(Semaphore::MAX_PERMITS)
}

/// Set the budget from the descriptor limit in effect (once, at start); returns it.
pub fn init(soft: u64) -> usize {
    let budget = budget_for(soft);
    let _ = BUDGET.set(Arc::new(Semaphore::new(budget)));
    budget
}

/// The 2 descriptors a new client connection holds until it ends: `Err` when the budget has no 2
/// free (close the connection), `Ok(None)` with no budget set.
pub fn connection() -> Result<Option<OwnedSemaphorePermit>, NoRoom> {
    match BUDGET.get() {
        None => Ok(None),
        Some(b) => b
            .clone()
            .try_acquire_many_owned(2)
            .map(Some)
            .map_err(|_| NoRoom),
    }
}

/// The descriptor an HTTP/2 stream holds while its request is in flight: `Err` when taking it would
/// leave fewer than [`NEW_CLIENT_ROOM`] free (refuse the stream), `Ok(None)` with no budget.
pub fn stream() -> Result<Option<OwnedSemaphorePermit>, NoRoom> {
    let Some(b) = BUDGET.get() else {
        return Ok(None);
    };
    // Take first, then look: streams of several threads looking first would all see room and
    // all take it, past the room left to new clients. Taken first, each sees the others' takes.
    let permit = b.clone().try_acquire_owned().map_err(|_| NoRoom)?;
    if b.available_permits() < NEW_CLIENT_ROOM {
        return Err(NoRoom);
    }
    Ok(Some(permit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_leaves_the_reserve() {
        assert_eq!(budget_for(256), 192);
        assert_eq!(budget_for(1024), 960);
        assert_eq!(budget_for(100), 50);
        assert_eq!(budget_for(0), 0);
        assert_eq!(budget_for(20_000) / 2, 9_968);
    }

    #[test]
    fn streams_leave_room_for_new_connections() {
        let b = Arc::new(Semaphore::new(budget_for(256)));
        let conns: Vec<_> = (0..12)
            .map(|_| b.clone().try_acquire_many_owned(2).unwrap())
            .collect();
        let mut streams = Vec::new();
        while b.available_permits() > NEW_CLIENT_ROOM {
            streams.push(b.clone().try_acquire_owned().unwrap());
        }
        assert_eq!(streams.len(), 192 - 24 - NEW_CLIENT_ROOM);
        // The room still takes 32 new connections.
        let more: Vec<_> = (0..32)
            .map(|_| b.clone().try_acquire_many_owned(2).unwrap())
            .collect();
        assert!(b.clone().try_acquire_many_owned(2).is_err());
        drop((conns, more));
    }
}
