//! The shim as Envoy's rate-limit quota service (RLQS): Envoy's `rate_limit_quota` filter
//! streams `StreamRateLimitQuotas` usage reports per bucket, and each bucket falls under a
//! limit of `--rls-config`. A limited bucket is answered with a token bucket Envoy applies
//! itself: its share of the rule's rate, split among the Envoys reporting that counter
//! and re-balanced from their reports (`docs/RLS.md`, "Quota service").
//!
//! - [`bucket`]: which limit a bucket id falls under, and its counter;
//! - [`share`]: a share of a rule's rate as Envoy's token bucket, and the split;
//! - [`pool`]: the Envoys sharing one counter, and who is sent what after a report (no I/O);
//! - [`assignment`]: the assignments, as Envoy applies them.
//!
//! A stream's buckets and their Redis work (`transport::grpc::rlqs_session`), the pools
//! of all streams and the pushes (`transport::grpc::rlqs_pools`) and the gRPC service
//! (`transport::grpc::rlqs`) are transport; its counters are in [`crate::metrics::rlqs`].

pub mod assignment;
pub mod bucket;
pub mod pool;
pub mod share;
