//! A bound on the tests that load the machine. The suite runs more test threads than cores
//! (scripts/test: twice as many), because most tests spend their time waiting on windows,
//! faults and timeouts; a test that drives a proxy at full speed (an h2load burst, a key
//! flood, an overload) or that holds a latency bound under load takes a permit first, so at
//! most one of those runs per core, as when the suite ran one test per core.

use std::sync::{Condvar, Mutex, PoisonError};

/// Heavy tests running at once: one per core.
fn permits() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

static TAKEN: Mutex<usize> = Mutex::new(0);
static FREED: Condvar = Condvar::new();

/// A permit to load the machine, held until the end of the test (given back on a panic too).
/// Not a lock guard: an async test holds it across its awaits.
#[must_use = "the permit is given back when dropped: bind it for the whole test"]
pub struct Heavy(());

/// Waits for a permit.
pub fn heavy() -> Heavy {
    let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
    while *taken >= permits() {
        taken = FREED.wait(taken).unwrap_or_else(PoisonError::into_inner);
    }
    *taken += 1;
    Heavy(())
}

impl Drop for Heavy {
    fn drop(&mut self) {
        *TAKEN.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        FREED.notify_one();
    }
}
