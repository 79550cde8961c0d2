//! The part of Envoy's gRPC API the shim serves: the messages of the rate-limit and quota
//! services ([`messages`]), as the deciding layer reads and writes them. The services as
//! tonic routes them are transport (`transport::grpc::server`).

pub mod messages;

#[cfg(test)]
mod conformance;
