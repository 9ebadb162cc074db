//! What slidegate writes about itself (the access log is `crate::access_log`): Pingora's
//! error lines summarised, the process log's noise bound, a route's limiter state changes.

pub mod hygiene;
pub mod limit;
pub mod state;
