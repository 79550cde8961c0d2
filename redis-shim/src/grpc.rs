//! The gRPC listener (`--grpc-listen`): Envoy's rate-limit service ([`crate::rls`]) and
//! its quota service ([`crate::rlqs`]) on one port, both deciding against the limits of
//! `--rls-config`. [`start`] loads that configuration (refusing at start what it cannot
//! run), binds the listener and serves until told to stop.

use crate::config::RlsOptions;
use crate::endpoint::Shim;
use crate::rlqs::service::RlqsService;
use crate::rls::service::RlsService;
use crate::rls::{config, filter_rule};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Loads the configuration and serves both services on their own listener until `stop`
/// turns true. Refuses (before serving anything) a configuration it cannot run.
pub async fn start(
    options: &RlsOptions,
    shim: Arc<Shim>,
    stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, Box<dyn std::error::Error + Send + Sync>> {
    let config = load_config(options)?;
    for limit in config.limits() {
        if limit.detailed_metric {
            tracing::warn!(
                limit = %limit.path,
                "detailed_metric: accepted, but no per-value series are kept (their number grows with traffic and values can be secrets); the limit counts in rlshim_rls_descriptors_total"
            );
        }
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
        "rate-limit and quota services listening"
    );
    let config = Arc::new(config);
    let rls = RlsService {
        shim: shim.clone(),
        config: config.clone(),
    };
    let rlqs = RlqsService::new(shim, config, stop.clone());
    let mut stopped = stop;
    let server = tonic::transport::Server::builder()
        // A quota stream's grants go back only when the stream ends: a peer that vanished
        // without closing its connection (a host gone, a partition) must end it too.
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .add_service(RateLimitServiceServer::new(rls))
        .add_service(RateLimitQuotaServiceServer::new(rlqs))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async move {
                let _ = stopped.wait_for(|stopped| *stopped).await;
            },
        );
    Ok(tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::error!(%error, "the gRPC services failed");
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
