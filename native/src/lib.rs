//! ratelimit-native: the ratelimit-wasm filter as an Envoy dynamic module
//! (`envoy.filters.http.dynamic_modules`), a shared library Envoy loads and runs in its
//! worker threads, with no VM. Deciding is the same pure core as the Wasm filter's (the
//! `ratelimit-wasm` crate outside its `host/`: the plan, the request's decision, the
//! local layer, the worker's batched calls to the shim); this crate is only the second
//! host under it, over Envoy's dynamic-module ABI (docs/NATIVE.md).
//!
//! In order, each importing only from those below it:
//! 1. [`hooks`]: the event hooks Envoy calls, exported;
//! 2. [`filter`]: one stream's filter;
//! 3. [`config`]: a loaded plugin configuration and each worker thread's worker for it;
//! 4. [`native_host`]: the ABI as the worker's `Host`;
//! 5. [`request_view`]: a stream's request, for the planner;
//! 6. [`stats`]: the filter's stats, defined on the configuration;
//! 7. [`main_thread`]: the shim calls Envoy's main thread carries for a worker;
//! 8. [`streams`]: what a worker thread's host knows of its streams, free of Envoy;
//! 9. [`slots`]: the process-wide slot table (the local layer's shared data);
//! 10. [`envoy`]: safe wrappers over the callbacks;
//! 11. [`abi`]: the ABI's types and callbacks, written here from Envoy's header.

// A panic in a hook is caught (see `hooks`), but none belongs outside tests.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod abi;
pub mod config;
pub mod envoy;
pub mod filter;
pub mod hooks;
pub mod main_thread;
pub mod native_host;
pub mod request_view;
pub mod slots;
pub mod stats;
pub mod streams;
