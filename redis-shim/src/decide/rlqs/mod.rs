//! The shim as Envoy's rate-limit quota service (RLQS): Envoy's `rate_limit_quota` filter
//! streams `StreamRateLimitQuotas` usage reports per bucket, and each bucket is charged to
//! the counter of the limit it falls under in `--rls-config` and answered with an
//! assignment: a grant of tokens charged first, as the filter's leases are, or a blanket
//! rule (`docs/RLS.md`, "Quota service").
//!
//! - [`bucket`]: which limit a bucket id falls under, and its counter;
//! - [`ledger`]: one bucket's account on one stream, and what each report comes to (no I/O);
//! - [`assignment`]: the assignments, as Envoy applies them.
//!
//! A stream's buckets and their Redis work (`transport::grpc::rlqs_session`) and
//! the gRPC service (`transport::grpc::rlqs`) are transport; its counters are in
//! [`crate::metrics::rlqs`].

pub mod assignment;
pub mod bucket;
pub mod ledger;
