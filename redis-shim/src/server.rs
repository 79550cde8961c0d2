//! The server: the routes, and [`run`], which serves them on a bound listener until a
//! shutdown future completes, so tests serve the real shim on a port they picked.

use crate::config::ShimConfig;
use crate::handlers::{self, Shim, MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES};
use crate::store::RedisStore;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use ratelimit_wire::{CHECK_BATCH_PATH, CHECK_PATH};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Serves the shim on `listener` until `shutdown` completes, then finishes the checks in
/// flight (for at most the shutdown timeout) and returns.
pub async fn run(
    listener: TcpListener,
    config: ShimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    config.validate()?;
    let store = RedisStore::connect(&config.redis)?;
    let shim = Arc::new(Shim::new(store, config));
    let app = Router::new()
        .route(CHECK_PATH, post(handlers::check))
        .route(
            CHECK_BATCH_PATH,
            post(handlers::check_batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES)),
        )
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .route("/metrics", get(handlers::metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(shim.clone());

    let (drain_started, mut drain_started_rx) = tokio::sync::watch::channel(false);
    let signal_shim = shim.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        signal_shim.draining.store(true, Ordering::SeqCst);
        tracing::info!("shutdown requested: finishing the checks in flight");
        let _ = drain_started.send(true);
    });
    let grace = shim.config.shutdown_timeout;
    let deadline = async move {
        let _ = drain_started_rx.wait_for(|started| *started).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = server => served?,
        _ = deadline => tracing::warn!(timeout = ?grace, "shutdown timeout: abandoning the checks still in flight"),
    }
    Ok(())
}
