//! Test harness: real Redis, the real shim (in-process from its library, or its binary),
//! real Envoy loading the built `.wasm` and a real upstream behind it (`upstream.rs`), each on a port it picked itself or one
//! claimed for it (`ports.rs`), stopped when dropped.
//!
//! Readiness is polled (Redis PING, the shim's `/healthz`, Envoy admin `/ready`), never
//! slept for; every wait has a limit sized for a loaded two-core machine. Binaries come
//! from `make build`; Envoy from `.venv` (or `ENVOY_BIN`).
#![allow(dead_code)] // each test binary uses its own subset
#![allow(unused_imports)] // and so not every re-export below

pub mod envoy;
pub mod fixtures;
pub mod http;
pub mod ports;
pub mod process;
pub mod redis;
pub mod shim;
pub mod upstream;

pub use envoy::*;
pub use fixtures::*;
pub use http::*;
pub use ports::*;
pub use process::*;
pub use redis::*;
pub use shim::*;
pub use upstream::*;

/// One test on both hosts of the filter: for each `name(host: FilterHost)`, a module
/// `name` with the tests `wasm` and `native` (`cargo test name::native`).
#[macro_export]
macro_rules! on_both_hosts {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn wasm() {
                super::$name($crate::support::FilterHost::Wasm)
            }

            #[test]
            fn native() {
                super::$name($crate::support::FilterHost::Native)
            }
        }
    )*};
}
