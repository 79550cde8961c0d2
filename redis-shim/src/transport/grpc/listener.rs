//! The gRPC listener (`--grpc-listen`): Envoy's rate-limit service ([`crate::decide::rls`]) and
//! its quota service ([`crate::decide::rlqs`]) on one port, both deciding against the limits of
//! `--rls-config`. [`prepare`] loads that configuration (refusing at start what it cannot
//! run, every error of every file at once), binds the listener, routes both services
//! and keeps the configuration current ([`reload`]); [`crate::server`] serves them.

use crate::decide::rls::loading;
use crate::transport::config::RlsOptions;
use crate::transport::grpc::reload::{self, LiveConfig};
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
    let seen = loading::snapshot(&options.files());
    let config = loading::load(&options.files()).map_err(|errors| loading::describe(&errors))?;
    if options.filter_config_path.is_some() && config.limits().iter().all(|limit| limit.shared.is_none()) {
        tracing::warn!(
            "--rls-filter-config is given but no rate_limit names a filter_rule: nothing is shared"
        );
    }
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
    let config = Arc::new(LiveConfig::new(config));
    reload::watch(options.clone(), seen, config.clone(), shim.clone(), stop.clone());
    let rls = RlsService {
        shim: shim.clone(),
        config: config.clone(),
        settings: options.settings,
    };
    let rlqs = RlqsService::new(shim, config, stop);
    let routes = Routes::new(Routed(RateLimitServer(Arc::new(rls))))
        .add_service(Routed(RateLimitQuotaServer(Arc::new(rlqs))));
    Ok((listener, routes.into_axum_router()))
}
