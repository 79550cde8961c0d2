//! The shim as Envoy's rate-limit service (`--grpc-listen`, `--rls-config`): Envoy's
//! native `envoy.filters.http.ratelimit` filter asks `ShouldRateLimit` over gRPC, with
//! descriptors decided against a configuration in envoyproxy/ratelimit's YAML format, on
//! the same Redis functions and decision path as the filter's checks (`docs/RLS.md`).
//!
//! - [`config`]: the YAML into descriptor trees, every bad field refused by name
//!   ([`descriptors`]: each level; [`unit`]: its units; [`wildcard`]: its `*` values;
//!   [`metadata`]: a descriptor's `metadata`; `yaml_fields`: its field readers);
//! - [`matching`]: which limit a descriptor falls under, and the entries it counts as;
//! - [`counter_key`]: its counter's Redis key, hashed;
//! - [`filter_rule`]: a limit sharing a Wasm filter rule's counter (mixed fleets), as
//!   [`shared`] records it;
//! - [`loading`]: the whole configuration loaded, with every file's error;
//! - [`plan`]: a request into checks, and [`response`]: their results into the answer,
//!   as the service-wide [`settings`] have it (no I/O).
//!
//! The gRPC service that asks them is transport (`transport::grpc::rls`), its
//! counters are in [`crate::metrics::rls`]; the quota service ([`crate::decide::rlqs`])
//! reads the same configuration.

pub mod config;
pub mod counter_key;
pub mod descriptors;
pub mod filter_rule;
pub mod loading;
pub mod matching;
pub mod metadata;
pub mod plan;
pub mod response;
pub mod settings;
pub mod shared;
pub mod unit;
pub mod wildcard;
mod yaml_fields;
