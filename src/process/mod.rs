//! The process around the proxy: assembling the server, reload, graceful stop, the pid
//! file and signals, the container health probe, OS limits, the allocator, and the
//! benchmark build's layer switches.

#[cfg(feature = "mimalloc")]
pub mod allocator;
pub mod bench_switch;
pub mod drain;
pub mod healthcheck;
pub mod limits_os;
pub mod pid_file;
pub mod quiet;
pub mod reload;
pub mod server;
pub mod state_file;
pub mod stopping;
pub mod stores;
