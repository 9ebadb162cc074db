//! The process around the proxy: assembling the server, reload, graceful stop, the pid
//! file and signals, the container health probe, OS limits and the allocator.

#[cfg(feature = "mimalloc")]
pub mod allocator;
pub mod drain;
pub mod healthcheck;
pub mod limits_os;
pub mod pid_file;
pub mod reload;
pub mod server;
pub mod state_file;
pub mod stores;
