//! The shim as Envoy's rate-limit service (`--grpc-listen`, `--rls-config`): Envoy's
//! native `envoy.filters.http.ratelimit` filter asks `ShouldRateLimit` over gRPC, with
//! descriptors decided against a configuration in envoyproxy/ratelimit's YAML format, on
//! the same Redis functions and decision path as the filter's checks (`docs/RLS.md`).
//!
//! - [`config`]: the YAML into descriptor trees, every unsupported field refused by name
//!   ([`unit`]: its units);
//! - [`matching`]: which limit a descriptor falls under;
//! - [`counter_key`]: its counter's Redis key, hashed;
//! - [`filter_rule`]: a limit sharing a Wasm filter rule's counter (mixed fleets);
//! - [`plan`]: a request into checks, and their results into the answer (no I/O);
//! - [`service`]: the gRPC service (token, in-flight bound, decision);
//! - [`metrics`]: its counters on `GET /metrics`.
//!
//! [`start`] loads the configuration, binds the listener and serves until told to stop.

pub mod config;
pub mod counter_key;
pub mod filter_rule;
pub mod matching;
pub mod metrics;
pub mod plan;
pub mod service;
pub mod unit;

use crate::config::RlsOptions;
use crate::endpoint::Shim;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use service::RlsService;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Loads the configuration and serves the rate-limit service on its own listener until
/// `stop` turns true. Refuses (before serving anything) a configuration it cannot run.
pub async fn start(
    options: &RlsOptions,
    shim: Arc<Shim>,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, Box<dyn std::error::Error + Send + Sync>> {
    let config = load_config(options)?;
    for limit in config.limits() {
        if limit.detailed_metric {
            tracing::warn!(
                limit = %limit.path,
                "detailed_metric: accepted, but no per-value series are kept (their number grows with traffic and values can be secrets); the limit counts in rlshim_rls_descriptors_total"
            );
        }
    }
    for limit in config.limits() {
        if let Some(shared) = &limit.shared {
            tracing::info!(limit = %limit.path, rule = %shared.rule, "shares the filter rule's counter");
        }
    }
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| format!("--grpc-listen {}: {e}", options.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        domains = config.domains.len(),
        "rate-limit service listening"
    );
    let service = RlsService {
        shim,
        config: Arc::new(config),
    };
    let server = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            },
        );
    Ok(tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::error!(%error, "the rate-limit service failed");
        }
    }))
}

/// `--rls-config`, with `--rls-filter-config` for the `filter_rule`s it names. Not async:
/// the filter's configuration is not `Send` and is dropped once the limits are linked.
fn load_config(options: &RlsOptions) -> Result<config::RlsConfig, String> {
    let filter = match &options.filter_config_path {
        Some(path) => {
            Some(filter_rule::load_filter_config(path).map_err(|e| format!("--rls-filter-config: {e}"))?)
        }
        None => None,
    };
    let config =
        config::load(&options.config_path, filter.as_ref()).map_err(|e| format!("--rls-config: {e}"))?;
    if filter.is_some() && config.limits().iter().all(|limit| limit.shared.is_none()) {
        tracing::warn!(
            "--rls-filter-config is given but no rate_limit names a filter_rule: nothing is shared"
        );
    }
    Ok(config)
}
