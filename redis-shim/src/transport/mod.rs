//! How requests reach the shim and leave it: the HTTP endpoints ([`http`]) and Envoy's
//! gRPC services (`grpc`), and what both are served with: [`Shim`] (the store, the
//! [`config`], the metrics, the in-flight bound of `admission`), the connection cap of
//! every listener (`connection_cap`) and `log_once` for what callers may repeat.

mod admission;
pub mod config;
pub(crate) mod connection_cap;
pub(crate) mod grpc;
pub mod http;
mod log_once;
pub mod shim;

pub use shim::Shim;
