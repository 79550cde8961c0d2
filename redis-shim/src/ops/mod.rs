//! What operators call: the [`admin`] endpoints (counters shown, reset, their other
//! variants listed), the `operator` endpoints (liveness, readiness, metrics), and the
//! [`counters`] command, the admin endpoints' client.

pub mod admin;
pub mod counters;
pub(crate) mod operator;
