//! The proxy-wasm host layer: the only code that talks to Envoy, and as little as that
//! takes. Deciding is the pure [`RequestDecision`](crate::request::RequestDecision)'s
//! for a request and the [`Worker`](crate::dispatch::worker::Worker)'s, over its host,
//! for the calls to the shim; this layer reads attributes and hands over callbacks.
//!
//! In order, each importing only from those below it (`tests/layers.rs` checks):
//! 1. [`root`]: the root context, one per plugin instance and worker;
//! 2. [`http`]: the context of one request;
//! 3. [`wasm_host`]: proxy-wasm as the worker's [`Host`](crate::dispatch::host::Host);
//! 4. [`current_request`]: the current request's attributes, for the planner;
//! 5. [`hostcalls`]: every other call into Envoy.

mod current_request;
mod hostcalls;
mod http;
mod root;
mod wasm_host;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;
use root::RateLimitRoot;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(RateLimitRoot { context_id, worker: None })
    });
}}
