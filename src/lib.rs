//! ratelimit-wasm: a distributed HTTP rate limiter for Envoy.
//!
//! The crate is two things at once. Compiled for `wasm32`, it is the proxy-wasm HTTP
//! filter: the thin host layer in `host`. Compiled natively, it is the pure decision
//! logic that layer drives, which `cargo test` exercises whole:
//!
//! - [`config`], [`attributes`], [`matching`], [`keys`], [`plan`]: the plugin
//!   configuration, what a request offers, which rules apply to it, the counter keys and
//!   the checks it needs: the `ratelimit-rules` crate, shared with `redis-shim counters`;
//! - [`request`]: one request's decision as a state machine, from the plan through the
//!   [`local`] layer (buckets, deny cache, leases in shared data) and the shim's answer
//!   ([`shim_call`], batched per worker by [`batch`]; each worker's calls, queue, lease
//!   waiters, returns and settlements run by [`dispatch`] over any host, through its
//!   `Host` trait) to the [`response`] the client
//!   gets, with the [`stats`] to count on the way, and what it gives back when its
//!   stream ends ([`stream_end`]: the concurrency slots it holds); [`settlement`] charges
//!   an admitted request's real cost once its response reports it, read from a body by
//!   [`response_body`];
//! - [`wire`]: the filter-to-shim wire format, the `ratelimit-wire` crate shared with
//!   `redis-shim`.
//!
//! Nothing outside `host` touches the proxy-wasm host.

// A panic kills the VM for every request on its worker: none outside tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod batch;
pub mod dispatch;
pub mod events;
pub mod judged;
pub mod local;
pub mod rate_headers;
pub mod request;
pub mod response;
pub mod response_body;
pub mod settlement;
pub mod shim_call;
pub mod skew_log;
pub mod spill;
pub mod stats;
pub mod stream_end;
pub use ratelimit_rules::{attributes, config, keys, matching, plan};
pub use ratelimit_wire as wire;

// Natively the host layer is only type-checked (by clippy), never linked; the wasm32
// unit tests (wasm-bindgen-test) leave it out too.
#[cfg(all(any(target_arch = "wasm32", clippy), not(test)))]
mod host;
