//! The shim as Envoy's rate-limit service (`--grpc-listen`, `--rls-config`): Envoy's
//! native `envoy.filters.http.ratelimit` filter asks `ShouldRateLimit` over gRPC, with
//! descriptors decided against a configuration in envoyproxy/ratelimit's YAML format, on
//! the same Redis functions and decision path as the filter's checks (`docs/RLS.md`).
//!
//! - [`config`]: the YAML into descriptor trees, every unsupported field refused by name
//!   ([`unit`]: its units; `yaml_fields`: its field readers);
//! - [`matching`]: which limit a descriptor falls under;
//! - [`counter_key`]: its counter's Redis key, hashed;
//! - [`filter_rule`]: a limit sharing a Wasm filter rule's counter (mixed fleets), as
//!   [`shared`] records it;
//! - [`loading`]: the whole configuration loaded, with every file's error;
//! - [`plan`]: a request into checks, and their results into the answer (no I/O).
//!
//! The gRPC service that asks them is transport (`transport::grpc::rls`), its
//! counters are in [`crate::metrics::rls`]; the quota service ([`crate::decide::rlqs`])
//! reads the same configuration.

pub mod config;
pub mod counter_key;
pub mod filter_rule;
pub mod loading;
pub mod matching;
pub mod plan;
pub mod shared;
pub mod unit;
mod yaml_fields;
