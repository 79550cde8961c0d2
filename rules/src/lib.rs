//! ratelimit-rules: what a request is checked against, shared by the filter and
//! `redis-shim counters` without the proxy-wasm host.
//!
//! - [`config`]: the plugin configuration, checked and compiled once;
//! - [`attributes`], [`matching`], [`keys`], [`plan`]: what a request offers, which rules
//!   apply to it, the counter keys, and the checks it needs.
//!
//! The filter (`ratelimit-wasm`) re-exports these modules; the shim keys a request with
//! them as the filter does, never with a copy.

// A panic kills the filter's VM for every request on its worker: none outside tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod attributes;
pub mod config;
pub mod keys;
pub mod matching;
pub mod plan;
pub use ratelimit_wire as wire;
