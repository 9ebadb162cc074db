//! Shared test harness: real Redis servers and clusters, real upstream HTTP servers and the real
//! slidegate binary, each started on loopback ports chosen at run time and torn down on drop.
#![allow(dead_code)]

pub mod admin;
pub mod browser;
pub mod proxy;
pub mod ratelimit;
pub mod redis;
pub mod tls;
pub mod upstream;
