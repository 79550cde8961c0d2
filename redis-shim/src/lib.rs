//! redis-shim: the HTTP service that makes ratelimit-wasm's decisions global.
//!
//! The filter in every Envoy posts a [`CheckRequest`] to `POST /v1/check`; the shim runs
//! all of its checks as one Lua script in Redis (read, decide and write with no gap, see
//! [`decide`]) and answers a [`CheckResponse`]. `GET /healthz` (the process serves),
//! `GET /readyz` (Redis answers, not draining) and `GET /metrics` (Prometheus) are for
//! operators. Shaped so tests drive the real server: [`run`] takes a bound listener and
//! a shutdown future.

pub mod decide;
pub mod metrics;
pub mod scripts;
pub mod store;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::{CheckOutcome, Metrics, RequestOutcome};
use ratelimit_wasm::wire::{CheckRequest, CheckResponse, CHECK_PATH, TOKEN_HEADER};
use scripts::Scripts;
use serde_json::json;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{RedisConfig, Store};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Largest check request body accepted: 16 checks with the longest keys fit in 8 KiB.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Longest key prefix accepted.
pub const MAX_PREFIX_LEN: usize = 64;

/// Everything the shim needs to run.
#[derive(Debug, Clone)]
pub struct ShimConfig {
    pub redis: RedisConfig,
    /// Prefix of every key the shim writes.
    pub key_prefix: String,
    /// Shared token callers must send in `x-ratelimit-token`, if set.
    pub token: Option<String>,
    /// Most check requests decided at once; more are answered 503 at once.
    pub max_in_flight: usize,
    /// Longest the shim waits for checks in flight after the shutdown signal.
    pub shutdown_timeout: Duration,
}

impl ShimConfig {
    /// Refuses a configuration the shim cannot run safely with.
    pub fn validate(&self) -> Result<(), String> {
        let prefix = &self.key_prefix;
        if prefix.len() > MAX_PREFIX_LEN || !prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "key prefix: at most {MAX_PREFIX_LEN} printable ASCII characters"
            ));
        }
        // A brace in the prefix would become every key's cluster hash tag, putting all
        // clients in one slot.
        if prefix.contains(['{', '}']) {
            return Err("key prefix: must not contain '{' or '}'".into());
        }
        if self.redis.urls.is_empty() {
            return Err("redis url: at least one is required".into());
        }
        if !self.redis.cluster && self.redis.urls.len() > 1 {
            return Err(
                "redis url: a standalone Redis takes exactly one (use cluster mode for several)".into(),
            );
        }
        if self.redis.timeout.is_zero() {
            return Err("redis timeout: must be positive".into());
        }
        if self.max_in_flight == 0 {
            return Err("max in flight: must be positive".into());
        }
        if self.token.as_deref() == Some("") {
            return Err("token: must not be empty when set".into());
        }
        Ok(())
    }
}

struct Shim {
    store: Store,
    scripts: Scripts,
    config: ShimConfig,
    metrics: Metrics,
    permits: Semaphore,
    draining: AtomicBool,
}

/// Serves the shim on `listener` until `shutdown` completes, then finishes the checks in
/// flight (for at most the shutdown timeout) and returns.
pub async fn run(
    listener: TcpListener,
    config: ShimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    config.validate()?;
    let store = Store::connect(&config.redis)?;
    let shim = Arc::new(Shim {
        store,
        scripts: Scripts::new(),
        permits: Semaphore::new(config.max_in_flight),
        config,
        metrics: Metrics::default(),
        draining: AtomicBool::new(false),
    });
    let app = Router::new()
        .route(CHECK_PATH, post(check))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
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

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Compares in time independent of where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn check(
    State(shim): State<Arc<Shim>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let (outcome, response) = decide_request(&shim, &headers, body).await;
    shim.metrics.request(outcome, started.elapsed());
    response
}

async fn decide_request(
    shim: &Shim,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (RequestOutcome, Response) {
    // Past the bound, answering at once keeps latency and memory bounded; Envoy's
    // failure mode decides what the request becomes.
    let Ok(_permit) = shim.permits.try_acquire() else {
        return (
            RequestOutcome::Overloaded,
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded: too many checks in flight",
            ),
        );
    };
    let _in_flight = shim.metrics.in_flight();
    if let Some(expected) = &shim.config.token {
        let presented = headers
            .get(TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !constant_time_eq(presented, expected.as_bytes()) {
            return (
                RequestOutcome::Unauthorized,
                error(
                    StatusCode::UNAUTHORIZED,
                    format!("missing or wrong {TOKEN_HEADER}"),
                ),
            );
        }
    }
    let body = match body {
        Ok(body) if body.len() <= MAX_BODY_BYTES => body,
        Ok(_) => {
            return (
                RequestOutcome::Invalid,
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body over {MAX_BODY_BYTES} bytes"),
                ),
            )
        }
        Err(rejection) => {
            let status = rejection.status();
            return (
                RequestOutcome::Invalid,
                error(
                    status,
                    format!("body over {MAX_BODY_BYTES} bytes or unreadable: {rejection}"),
                ),
            );
        }
    };
    let request: CheckRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return (
                RequestOutcome::Invalid,
                error(StatusCode::BAD_REQUEST, format!("invalid check request: {e}")),
            )
        }
    };
    if let Err(invalid) = request.validate() {
        return (
            RequestOutcome::Invalid,
            error(StatusCode::BAD_REQUEST, invalid.to_string()),
        );
    }

    let keys: Vec<String> = request
        .checks
        .iter()
        .map(|check| format!("{}{}", shim.config.key_prefix, check.key))
        .collect();
    let decision = match decide::decide(&shim.store, &shim.scripts, &keys, &request.checks).await {
        Ok(decision) => decision,
        Err(failure) => {
            shim.metrics.redis_error(failure.error.kind());
            if failure.slots_charged > 0 {
                shim.metrics.refund(failure.refund_complete);
            }
            tracing::warn!(error = %failure.error, refund_complete = failure.refund_complete, "redis check failed");
            return (
                RequestOutcome::RedisError,
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("redis: {}", failure.error),
                ),
            );
        }
    };
    if decision.refunded {
        shim.metrics.refund(decision.refund_complete);
    }
    for ((check, result), key) in request.checks.iter().zip(&decision.results).zip(&keys) {
        let outcome = match (result.allowed, check.shadow) {
            (true, _) => CheckOutcome::Allowed,
            (false, false) => CheckOutcome::Denied,
            (false, true) => {
                tracing::info!(key = %key, algorithm = check.algorithm.as_str(), limit = check.limit, "shadow check would deny");
                CheckOutcome::ShadowDenied
            }
        };
        shim.metrics.check(check.algorithm, outcome);
    }
    let outcome = if decision.allowed {
        RequestOutcome::Allowed
    } else {
        RequestOutcome::Denied
    };
    let response = Json(CheckResponse {
        allowed: decision.allowed,
        results: decision.results,
    })
    .into_response();
    (outcome, response)
}

/// Liveness: 200 while the process serves, whatever Redis does (restarting the shim
/// would not bring Redis back).
async fn healthz() -> Response {
    (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response()
}

/// Readiness: 200 when Redis answers PING within the timeout and the shim is not
/// shutting down, 503 otherwise.
async fn readyz(State(shim): State<Arc<Shim>>) -> Response {
    if shim.draining.load(Ordering::SeqCst) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    match shim.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({ "status": "ready", "redis": "reachable" })),
        )
            .into_response(),
        Err(e) => {
            shim.metrics.redis_error(e.kind());
            error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unreachable: {e}"))
        }
    }
}

async fn metrics(State(shim): State<Arc<Shim>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        shim.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }

    fn config() -> ShimConfig {
        ShimConfig {
            redis: RedisConfig {
                urls: vec!["redis://127.0.0.1:6379".into()],
                cluster: false,
                timeout: Duration::from_millis(50),
                max_pending: 10,
            },
            key_prefix: "rl:".into(),
            token: None,
            max_in_flight: 10,
            shutdown_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn configuration_is_validated() {
        assert!(config().validate().is_ok());
        let cases: Vec<(ShimConfig, &str)> = vec![
            (
                ShimConfig {
                    key_prefix: "rl{x}:".into(),
                    ..config()
                },
                "'{'",
            ),
            (
                ShimConfig {
                    key_prefix: "a b".into(),
                    ..config()
                },
                "printable",
            ),
            (
                ShimConfig {
                    max_in_flight: 0,
                    ..config()
                },
                "in flight",
            ),
            (
                ShimConfig {
                    token: Some(String::new()),
                    ..config()
                },
                "token",
            ),
        ];
        for (config, expected) in cases {
            let err = config.validate().unwrap_err();
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
        let mut two_urls = config();
        two_urls.redis.urls.push("redis://127.0.0.1:6380".into());
        assert!(two_urls.validate().unwrap_err().contains("standalone"));
        two_urls.redis.cluster = true;
        assert!(two_urls.validate().is_ok());
    }
}
