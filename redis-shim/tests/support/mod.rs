//! Test harness of the shim's tests: real Redis (standalone, or a three-master cluster;
//! one of each shared by a test binary's tests), the real shim (in-process from its
//! library, on Redis or on its store in memory, or its binary), each on a port it picked
//! itself or one claimed for it (`ports.rs`), stopped when dropped or when the test
//! process ends.
//!
//! Readiness is polled (Redis PING, the shim's `/healthz`), never slept for; every wait
//! has a limit sized for a loaded two-core machine.
#![allow(dead_code)] // each test binary uses its own subset
#![allow(unused_imports)] // and so not every re-export below

pub mod fixtures;
// The same client and port claims as the filter package's end-to-end tests: one copy.
#[path = "../../../tests/support/http.rs"]
pub mod http;
#[path = "../../../tests/support/ports.rs"]
pub mod ports;
pub mod process;
pub mod redis;
pub mod regions;
pub mod shim;

pub use fixtures::*;
pub use http::*;
pub use ports::*;
pub use process::*;
pub use redis::*;
pub use regions::{Link, Region, Regions};
pub use shim::*;
