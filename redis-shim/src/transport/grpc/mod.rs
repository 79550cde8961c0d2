//! Envoy's gRPC services on `--grpc-listen`: [`listener`] loads `--rls-config` and binds
//! the port, [`reload`] keeps it current, [`server`] routes each service's method as tonic does, [`rls`] answers
//! `ShouldRateLimit`, and [`rlqs`] serves the quota streams, each a [`rlqs_session`], their
//! shares of each counter in [`rlqs_pools`].
//! Both decide as the HTTP checks do ([`crate::decide`]), never through the HTTP files.

pub mod listener;
pub mod reload;
pub mod rlqs;
pub mod rlqs_pools;
pub mod rlqs_session;
pub mod rls;
pub mod server;

use ratelimit_wire::TOKEN_HEADER;

/// The caller's token, as gRPC metadata carries it (empty when absent).
fn presented_token(metadata: &tonic::metadata::MetadataMap) -> &[u8] {
    metadata
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default()
}
