//! `[store] state_file`: the memory store's windows read once at the start and written once at
//! the stop (`crate::limiter::memory::persist` has the format and the order of a hand-over).
//! Every outcome is one log line naming the file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::config::Config;
use crate::limiter::memory::persist::{self, MAX_FILE_BYTES};
use crate::limiter::memory::MemoryStore;
use crate::limiter::{Limit, LimitId};

/// The memory store and its file.
pub struct StateFile {
    store: Arc<MemoryStore>,
    path: PathBuf,
    /// Written already (at a hand-over: the successor owns the file from then on).
    written: AtomicBool,
}

impl StateFile {
    /// The state file of `config`, if it sets one (and the store is the memory store).
    pub fn of(config: &Config, memory: Option<&Arc<MemoryStore>>) -> Option<Arc<StateFile>> {
        let path = config.store.state_file.clone()?;
        Some(Arc::new(StateFile {
            store: memory?.clone(),
            path,
            written: AtomicBool::new(false),
        }))
    }

    /// Read the file into the store, before it decides: each limit found by its route and id
    /// in `config`. A file refused for any reason leaves the store empty, and says why.
    pub fn load(&self, config: &Config) {
        // A route with plans counts its clients in every plan's limits (its own `limits` are
        // the default plan's).
        let ids: HashMap<&str, Vec<LimitId>> = (config.routing.routes.iter())
            .map(|r| {
                let plans = r.plans.iter().flat_map(|p| &p.each);
                let limits = r.limits.iter().chain(plans.flat_map(|p| &p.limits));
                (r.name.as_str(), limits.map(Limit::id).collect())
            })
            .collect();
        let find = |route: &str, text: &str| {
            let of_route = ids.get(route)?;
            of_route.iter().find(|id| id.to_string() == text).copied()
        };
        let path = self.path.display();
        match persist::load(&self.store, &self.path, &find) {
            Ok(None) => log::info!("state file {path}: none yet, starting with empty windows"),
            Ok(Some(l)) => log::info!(
                "state file {path}: {} buckets read ({} counted), {} passed while the process \
                 was down, {} of routes or limits no longer configured, {} beyond max_memory",
                l.buckets,
                l.counted,
                l.expired,
                l.gone,
                l.full
            ),
            Err(e) => log::warn!("state file {path} refused: {e}; starting with empty windows"),
        }
    }

    /// Write the store's windows, once (`when` says which stop, for the log line).
    pub fn save(&self, when: &str) {
        if self.written.swap(true, Ordering::AcqRel) {
            return;
        }
        let started = Instant::now();
        let path = self.path.display();
        match persist::save(&self.store, &self.path, MAX_FILE_BYTES) {
            Ok(s) => {
                log::info!(
                    "state file {path}: {} buckets ({} entries, {} bytes) written {when} in {:?}",
                    s.buckets,
                    s.steps,
                    s.bytes,
                    started.elapsed()
                );
                if s.dropped_buckets > 0 {
                    log::warn!(
                        "state file {path}: {} buckets left out, the file would have exceeded \
                         {MAX_FILE_BYTES} bytes (the fullest were kept)",
                        s.dropped_buckets
                    );
                }
            }
            Err(e) => log::error!("state file {path}: cannot write it {when}: {e}"),
        }
    }
}
