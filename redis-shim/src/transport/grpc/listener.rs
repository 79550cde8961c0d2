//! The gRPC listener (`--grpc-listen`): Envoy's rate-limit service ([`crate::decide::rls`]) and
//! its quota service ([`crate::decide::rlqs`]) on one port, both deciding against the limits of
//! `--rls-config`. [`prepare`] loads that configuration (refusing at start what it cannot
//! run), binds the listener and routes both services; [`crate::server`] serves them.

use crate::decide::rls::{config, filter_rule};
use crate::transport::config::RlsOptions;
use crate::transport::grpc::rlqs::RlqsService;
use crate::transport::grpc::rls::RlsService;
use crate::transport::grpc::server::{RateLimitQuotaServer, RateLimitServer, Routed};
use crate::transport::shim::Shim;
use axum::Router;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;

/// Loads the configuration and binds the listener: the listener and the services' routes,
/// served by [`crate::server`] as the HTTP endpoints are (connection cap, header timeout,
/// graceful shutdown). Refuses (before serving anything) a configuration it cannot run.
/// The quota streams end when `stop` turns true.
pub async fn prepare(
    options: &RlsOptions,
    shim: Arc<Shim>,
    stop: watch::Receiver<bool>,
) -> Result<(TcpListener, Router), Box<dyn std::error::Error + Send + Sync>> {
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
    let listener = TcpListener::bind(options.listen)
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
    let rlqs = RlqsService::new(shim, config, stop);
    let routes = Routes::new(Routed(RateLimitServer(Arc::new(rls))))
        .add_service(Routed(RateLimitQuotaServer(Arc::new(rlqs))));
    Ok((listener, routes.into_axum_router()))
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
        filter_rule::load(&options.config_path, filter.as_ref()).map_err(|e| format!("--rls-config: {e}"))?;
    if filter.is_some() && config.limits().iter().all(|limit| limit.shared.is_none()) {
        tracing::warn!(
            "--rls-filter-config is given but no rate_limit names a filter_rule: nothing is shared"
        );
    }
    Ok(config)
}
