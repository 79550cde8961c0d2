//! ratelimit-wasm: a distributed HTTP rate limiter for Envoy.
//!
//! The crate is two things at once. Compiled for `wasm32`, it is the proxy-wasm HTTP
//! filter (the thin host layer in [`host`]). Compiled natively, it is the pure decision
//! logic that layer drives: configuration ([`config`]), request matching ([`matching`]),
//! counter keys ([`keys`]), the per-request plan of checks ([`plan`]), the filter-to-shim
//! wire format ([`wire`]: the `ratelimit-wire` crate, shared with `redis-shim`), the coalescing of shim calls
//! ([`batch`]) and the client-facing response contract ([`response`]). Nothing outside
//! [`host`] touches the proxy-wasm host, so `cargo test` exercises every decision
//! natively.

pub mod batch;
pub mod config;
pub mod keys;
pub mod local;
pub mod matching;
pub mod plan;
pub mod response;
pub use ratelimit_wire as wire;

// Natively the host layer is only type-checked (by clippy), never linked; the wasm32
// unit tests (wasm-bindgen-test) leave it out too.
#[cfg(all(any(target_arch = "wasm32", clippy), not(test)))]
mod host;
