//! A fixture started once per test binary and shared by its tests: Redis processes that many
//! tests use at once, each under a key prefix of its own ([`unique_prefix`]), so that a suite
//! of 160 cases does not start 160 clusters.
//!
//! Statics are never dropped, so a shared fixture is dropped when the binary exits (an
//! `atexit` hook, which runs on libtest's normal exit and on its exit after a failure): the
//! processes are killed and their directories removed, as when a test owns its fixture.
//! Only tests that never stop, freeze or fail over a server may share it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// A fixture of type `T`, started on first use; declare it as a `static`.
pub struct Shared<T: Send + 'static>(Mutex<Option<T>>);

impl<T: Send + 'static> Shared<T> {
    /// Not started yet.
    pub const fn new() -> Self {
        Shared(Mutex::new(None))
    }

    /// `f` of the fixture, which `start` starts the first time (blocking: call from a
    /// blocking context). A test that panicked inside `f` does not poison it for the others.
    pub fn with<R>(&'static self, start: impl FnOnce() -> T, f: impl FnOnce(&T) -> R) -> R {
        let mut fixture = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if fixture.is_none() {
            *fixture = Some(start());
            at_exit(Box::new(move || {
                let started = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
                drop(started);
            }));
        }
        f(fixture.as_ref().expect("started above"))
    }
}

/// A key prefix no other test of this binary uses.
pub fn unique_prefix(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("sgtest-{what}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

type Hook = Box<dyn FnOnce() + Send>;

static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Run `hook` when the process exits normally (`exit`, or `main` returning).
fn at_exit(hook: Hook) {
    let mut hooks = HOOKS.lock().unwrap_or_else(PoisonError::into_inner);
    if hooks.is_empty() {
        // SAFETY: `run_hooks` is a plain `extern "C" fn()` that never unwinds (it catches).
        let registered = unsafe { libc::atexit(run_hooks) };
        assert_eq!(registered, 0, "atexit failed");
    }
    hooks.push(hook);
}

extern "C" fn run_hooks() {
    let hooks = std::mem::take(&mut *HOOKS.lock().unwrap_or_else(PoisonError::into_inner));
    for hook in hooks {
        // A panic must not unwind into libc.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook));
    }
}
