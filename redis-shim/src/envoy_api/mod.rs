//! The part of Envoy's gRPC API the shim serves: the messages of the rate-limit and quota
//! services ([`messages`]) and the services as tonic routes them ([`server`]).

pub mod messages;
pub mod server;

#[cfg(test)]
mod conformance;
