//! redis-shim: the HTTP service that makes ratelimit-wasm's decisions global.
//!
//! The filter in every Envoy posts a [`CheckRequest`] to `POST /v1/check`; the shim runs
//! all of its checks as one Lua script in Redis (read, refill, decide and write with no
//! gap) and answers a [`CheckResponse`]. Shaped so tests drive the real server:
//! [`run`] takes a bound listener and a shutdown future.

pub mod scripts;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ratelimit_wasm::wire::{Algorithm, CheckRequest, CheckResponse, CHECK_PATH, TOKEN_HEADER};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Largest check request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Everything the shim needs to run.
#[derive(Debug, Clone)]
pub struct ShimConfig {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` for TLS).
    pub redis_url: String,
    /// Longest a single Redis operation may take before the check fails.
    pub redis_timeout: Duration,
    /// Prefix of every key the shim writes.
    pub key_prefix: String,
    /// Shared token callers must send in `x-ratelimit-token`, if set.
    pub token: Option<String>,
}

struct Shim {
    redis: ConnectionManager,
    config: ShimConfig,
    token_bucket: Script,
}

/// Serves the shim on `listener` until `shutdown` completes, then finishes the checks in
/// flight and returns.
pub async fn run(
    listener: TcpListener,
    config: ShimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let client = redis::Client::open(config.redis_url.as_str())?;
    // Lazy: the shim starts (and reports unhealthy) while Redis is still coming up, and
    // the manager reconnects by itself after Redis restarts. One multiplexed connection
    // carries every concurrent check, pipelined.
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.redis_timeout))
        .set_response_timeout(Some(config.redis_timeout))
        .set_number_of_retries(1);
    let redis = ConnectionManager::new_lazy_with_config(client, manager_config)?;
    let shim = Arc::new(Shim {
        redis,
        config,
        token_bucket: scripts::token_bucket(),
    });
    let app = Router::new()
        .route(CHECK_PATH, post(check))
        .route("/healthz", get(healthz))
        .with_state(shim);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Compares in time independent of where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn check(State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(expected) = &shim.config.token {
        let presented = headers
            .get(TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !constant_time_eq(presented, expected.as_bytes()) {
            return error(
                StatusCode::UNAUTHORIZED,
                format!("missing or wrong {TOKEN_HEADER}"),
            );
        }
    }
    if body.len() > MAX_BODY_BYTES {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body over {MAX_BODY_BYTES} bytes"),
        );
    }
    let request: CheckRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid check request: {e}")),
    };
    if let Err(invalid) = request.validate() {
        return error(StatusCode::BAD_REQUEST, invalid.to_string());
    }
    if let Some(unsupported) = request
        .checks
        .iter()
        .position(|c| c.algorithm != Algorithm::TokenBucket || c.shadow || c.lease != 0)
    {
        return error(
            StatusCode::BAD_REQUEST,
            format!("checks[{unsupported}]: only plain token_bucket checks are supported so far"),
        );
    }

    let mut invocation = shim.token_bucket.prepare_invoke();
    for check in &request.checks {
        scripts::add_check(
            &mut invocation,
            format!("{}{}", shim.config.key_prefix, check.key),
            check,
        );
    }
    let mut redis = shim.redis.clone();
    let reply = tokio::time::timeout(
        shim.config.redis_timeout,
        invocation.invoke_async::<Vec<Vec<i64>>>(&mut redis),
    )
    .await;
    let rows = match reply {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "redis check failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, format!("redis: {e}"));
        }
        Err(_) => {
            tracing::warn!("redis check timed out");
            return error(StatusCode::SERVICE_UNAVAILABLE, "redis: timed out");
        }
    };
    match scripts::parse_reply(rows, &request.checks) {
        Ok(results) => Json(CheckResponse {
            allowed: results.iter().all(|r| r.allowed),
            results,
        })
        .into_response(),
        Err(malformed) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("script reply: {}", malformed.0),
        ),
    }
}

/// 200 when Redis answers PING within the timeout, 503 otherwise.
async fn healthz(State(shim): State<Arc<Shim>>) -> Response {
    let mut redis = shim.redis.clone();
    let ping = redis::cmd("PING");
    match tokio::time::timeout(shim.config.redis_timeout, ping.query_async::<String>(&mut redis)).await {
        Ok(Ok(_)) => (
            StatusCode::OK,
            Json(json!({ "status": "ok", "redis": "reachable" })),
        )
            .into_response(),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unreachable: {e}")),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "redis unreachable: timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
