//! redis-shim: the HTTP service that makes ratelimit-wasm's decisions global.
//!
//! A client posts a `CheckRequest` to `POST /v1/check`; the shim runs all of its checks
//! as one Lua script in Redis (read, decide and write with no gap) and answers a
//! `CheckResponse`. The filter posts several requests' checks at once to
//! `POST /v1/check-batch`, each decided the same way. `GET /healthz` (the process
//! serves), `GET /readyz` (Redis answers, not draining) and `GET /metrics` (Prometheus)
//! are for operators, and so are `POST /v1/admin/counters/show`, `/reset` and `/variants`
//! (always behind a token), which the `redis-shim counters` command calls. The wire types are
//! in the `ratelimit-wire` crate.
//!
//! ## Layers
//!
//! The modules stand in layers, from the edge inwards. A module imports only from its own
//! folder or from a folder listed below its own (`tests/layers.rs` reads this list and
//! checks every `crate::` path against it):
//!
//! 1. the crate root: the process. [`cli`] (flags and environment into a [`ShimConfig`];
//!    the binary, `main.rs`, only adds logging and signals), `server` ([`run`]: the store
//!    connected, every listener served until a shutdown future completes; the tests call
//!    it in-process, and [`run_in_memory`] on the store in memory) and [`routes`] (every HTTP path, what it
//!    requires, and its handler).
//! 2. [`ops`]: what operators call: the admin endpoints (counters shown, reset, their
//!    variants listed), liveness, readiness and metrics, and the `redis-shim counters`
//!    command that is the admin endpoints' client.
//! 3. [`transport`]: how requests come and go: the HTTP endpoints' template (token,
//!    in-flight permit, body read within its limits, counting) and the check endpoints;
//!    Envoy's rate-limit and quota services over gRPC; the [`transport::Shim`] they are all
//!    served with, its configuration, and the connection cap.
//! 4. [`decide`]: a request's checks decided against the store, all or nothing across
//!    cluster slots, with refunds, returns and settlements, peeks, and the answer every
//!    service gives; a `ShouldRateLimit` request planned into checks, a quota bucket's
//!    account. Returns what happened; does no I/O of its own but the store's.
//! 5. [`store`]: where the counters live: the `Store` trait (every call the checks make,
//!    one request's, a batch's, refunds and settlements) and what the admin endpoints
//!    need, Redis standalone or Cluster (the cluster's map of masters, concurrent
//!    callers' calls merged), the function library (the Lua scripts, their arguments and
//!    replies), the same algorithms in memory (tests and development), and a fake for
//!    unit tests.
//! 6. [`metrics`]: the Prometheus metrics every layer counts in.
//! 7. [`envoy_api`]: the messages of Envoy's rate-limit and quota services.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod cli;
pub mod decide;
pub mod envoy_api;
pub mod metrics;
pub mod ops;
pub mod routes;
mod server;
pub mod store;
pub mod transport;

pub use server::{run, run_in_memory};
pub use transport::config::ShimConfig;
