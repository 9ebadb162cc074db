//! Hot reload: `SIGHUP` re-reads the config file, validates it fully, and only then swaps the
//! new rules in atomically. A bad file is refused and the last good rules keep serving.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::edge::TlsPort;
use crate::limiter::Store;
use crate::metrics::METRICS;
use crate::routes::Rules;
use crate::tls::load_listener;

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// New rules are live; the listed settings changed but need a restart and were ignored.
    Applied {
        /// Settings that differ from the running ones and only take effect on restart.
        needs_restart: Vec<String>,
    },
    /// The file was refused; the previous rules are still live.
    Refused(String),
}

impl ReloadOutcome {
    /// `slidegate_config_reloads_total{result}`: `ok`; `needs_restart` when rules applied but
    /// a restart-only setting (a `listen` address, `threads`, the store…) differs, so the file
    /// and the running process disagree until a restart; `error` when refused.
    pub fn result_label(&self) -> &'static str {
        match self {
            ReloadOutcome::Applied { needs_restart } if needs_restart.is_empty() => "ok",
            ReloadOutcome::Applied { .. } => "needs_restart",
            ReloadOutcome::Refused(_) => "error",
        }
    }
}

/// The files `--watch` follows: the config, and the plan files its routes read.
fn watched_files(config: &Config) -> Vec<std::path::PathBuf> {
    let plan_files = (config.routes.iter()).filter_map(|r| match &r.plans.as_ref()?.source {
        crate::config::PlanSource::File(path) => Some(path.clone()),
        crate::config::PlanSource::Redis { .. } => None,
    });
    std::iter::once(config.source.clone())
        .chain(plan_files)
        .collect()
}

/// Owns the running config and swaps rules in on reload.
pub struct Reloader {
    current: Mutex<Config>,
    rules: Arc<ArcSwap<Rules>>,
    store: Arc<dyn Store>,
    /// Also reload when the file's modification time or size changes (polled once a second).
    watch: bool,
    /// The TLS listener, whose certificates and versions are loaded again on every reload.
    tls: Option<Arc<TlsPort>>,
}

impl Reloader {
    /// A reloader for the running `config`, publishing into `rules` and telling `store`.
    pub fn new(
        config: Config,
        rules: Arc<ArcSwap<Rules>>,
        store: Arc<dyn Store>,
        watch: bool,
    ) -> Self {
        // Every result's series exists from the start, at 0: an alert on `increase(..) > 0`
        // then fires at the first refused reload, not only from the second.
        for result in ["ok", "needs_restart", "error"] {
            METRICS.config_reloads.with_label_values(&[result]);
        }
        Reloader {
            current: Mutex::new(config),
            rules,
            store,
            watch,
            tls: None,
        }
    }

    /// Also load the TLS listener again on every reload (every certificate, its SNI names,
    /// `tls_min_version`) and swap it in whole; a file that cannot be used refuses the whole
    /// reload.
    pub fn with_tls(mut self, tls: Option<Arc<TlsPort>>) -> Self {
        self.tls = tls;
        self
    }

    /// Modification time and size of the config file and of each plan file it names, to
    /// notice edits when watching (`None` for a file that cannot be read now).
    fn fingerprint(&self) -> Vec<Option<(std::time::SystemTime, u64)>> {
        let paths = watched_files(&self.current.lock().unwrap_or_else(|e| e.into_inner()));
        let fingerprint_of = |path: &std::path::Path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        };
        paths.iter().map(|p| fingerprint_of(p)).collect()
    }

    /// Re-read the config file and apply it if it is valid. Counts
    /// `slidegate_config_reloads_total{result}` and logs the outcome.
    pub fn reload(&self) -> ReloadOutcome {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = match Config::load(&current.source)
            .map_err(|e| e.to_string())
            .and_then(|new| {
                let in_file = |e: &dyn std::fmt::Display| format!("{}: {e}", new.source.display());
                let rules = Rules::build(&new).map_err(|e| in_file(&e))?;
                // Only a running TLS listener takes new certificates; adding one needs a
                // restart (reported by the diff below).
                let tls = match (&self.tls, &new.server.tls) {
                    (Some(_), Some(tls)) => {
                        Some(load_listener(tls).map_err(|e| e.in_config(&new.source).to_string())?)
                    }
                    _ => None,
                };
                Ok((new, rules, tls))
            }) {
            Ok((new, rules, tls)) => {
                let needs_restart = current.restart_only_changes(&new);
                if let (Some(port), Some(tls)) = (&self.tls, tls) {
                    port.replace(tls);
                }
                self.rules.store(Arc::new(rules));
                self.store.rules_changed();
                // Keep the running restart-only settings so a later diff is honest.
                current.routing = new.routing;
                ReloadOutcome::Applied { needs_restart }
            }
            Err(message) => ReloadOutcome::Refused(message),
        };
        // Log first, count last: the counter tells watchers the reload is complete, log included.
        match &outcome {
            ReloadOutcome::Applied { needs_restart } => {
                log::info!("config reloaded from {}", current.source.display());
                for key in needs_restart {
                    log::warn!("config reload: {key} changed but needs a restart; still running the old value");
                }
                METRICS
                    .config_reloads
                    .with_label_values(&[outcome.result_label()])
                    .inc();
            }
            ReloadOutcome::Refused(message) => {
                log::error!("config reload refused, keeping the running rules: {message}");
                METRICS
                    .config_reloads
                    .with_label_values(&[outcome.result_label()])
                    .inc();
            }
        }
        outcome
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot listen for SIGHUP, reload disabled: {e}");
                return;
            }
        };
        let mut poll = tokio::time::interval(std::time::Duration::from_secs(1));
        let mut seen = self.fingerprint();
        let mut settled = None;
        // A change is applied once the file has stayed the same for a whole poll: an editor
        // or `cp` still writing it would otherwise have a half-written file applied (a route
        // cut before its `limits` line is a valid route without limits).
        loop {
            // This runtime serves no traffic, so a brief blocking read is harmless here.
            tokio::select! {
                _ = hup.recv() => {
                    self.reload();
                    seen = self.fingerprint();
                    settled = None;
                }
                _ = poll.tick(), if self.watch => {
                    let now = self.fingerprint();
                    // A file that cannot be read now (mid-replace) is waited out.
                    let readable = now.iter().all(Option::is_some);
                    match settled.take() {
                        Some(before) if readable && now != seen && now == before => {
                            self.reload();
                            seen = self.fingerprint();
                        }
                        _ if readable && now != seen => settled = Some(now),
                        _ => {}
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReloadOutcome;

    #[test]
    fn restart_only_changes_are_their_own_result() {
        let applied = |keys: &[&str]| ReloadOutcome::Applied {
            needs_restart: keys.iter().map(|k| k.to_string()).collect(),
        };
        assert_eq!(applied(&[]).result_label(), "ok");
        assert_eq!(applied(&["server.listen"]).result_label(), "needs_restart");
        assert_eq!(ReloadOutcome::Refused("x".into()).result_label(), "error");
    }
}
