//! What slidegate adds to a response or answers itself: the upstream head's hop-by-hop
//! fields and upgrades, the rate-limit fields and their `pk`, problem bodies and gRPC
//! answers.

pub mod grpc;
pub mod hop_by_hop;
pub mod partition_key;
pub mod problem;
pub mod ratelimit_headers;
pub mod upgrade;
pub mod usage;
