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
//! One concept per module, from the edge inwards:
//!
//! - [`cli`]: flags and environment into a [`ShimConfig`] ([`config`], which validates
//!   it); the binary (`main.rs`) only adds logging and signals.
//! - `server`: [`run`], which serves a bound listener until a shutdown future completes,
//!   each connection with the header-read timeout. The root package's tests
//!   (`tests/support/shim.rs`) call it in-process with flags parsed by [`cli::Args`].
//! - `connection_cap`: the connection cap, which closes idle connections to make room.
//! - [`routes`]: the route table, every path and what each endpoint requires.
//! - [`endpoint`]: the template every endpoint goes through: the token, then for a POST
//!   an in-flight permit (`admission`) and the body read within its limits (`body`),
//!   and the counting of what it answered ([`metrics`]).
//! - The endpoints, each only what it does once admitted: `check` (one request's checks,
//!   and how a decision is answered, counted and logged), `check_batch` (a worker's
//!   queue in one call), `operator` (health, readiness, metrics), [`admin`] (counters
//!   peeked at, reset, or their other variants listed).
//! - [`counters`]: the `redis-shim counters` command, a client of [`admin`] that keys
//!   requests with the filter's own code (the `ratelimit-rules` crate, no proxy-wasm).
//! - What runs on the store, each returning what happened and neither counting nor
//!   logging: [`decision`] (one request, all or nothing across cluster slots),
//!   [`refund`] (what a request spanning slots gives back when a later slot refuses),
//!   [`adjustments`] (the filter's returns and settlements), [`peek`] (counters read
//!   without charging).
//! - [`store`]: the `Store` trait those run on; [`redis_store`], the Redis (standalone
//!   or cluster) store, over [`redis_connection`].
//! - [`scripts`]: the Lua scripts, their arguments and replies.
//! - [`rls`]: Envoy's rate-limit service over gRPC (`--grpc-listen`), from an
//!   envoyproxy/ratelimit configuration, deciding on the same path as `check`;
//!   [`rlqs`]: its quota service on the same port ([`grpc`]), granting tokens as leases.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod adjustments;
pub mod admin;
mod admission;
mod body;
mod check;
mod check_batch;
pub mod cli;
mod cluster_nodes;
mod coalesce;
pub mod config;
mod connection_cap;
pub mod counters;
pub mod decision;
pub mod endpoint;
pub mod envoy_api;
#[cfg(test)]
mod fake_store;
mod grpc;
mod log_once;
pub mod metrics;
mod operator;
pub mod peek;
pub mod redis_connection;
pub mod redis_store;
pub mod refund;
pub mod rlqs;
pub mod rls;
pub mod routes;
pub mod scripts;
mod server;
pub mod store;

pub use config::ShimConfig;
pub use server::run;
