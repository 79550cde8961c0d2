//! redis-shim: the HTTP service that makes ratelimit-wasm's decisions global.
//!
//! A client posts a [`CheckRequest`] to `POST /v1/check`; the shim runs all of its checks
//! as one Lua script in Redis (read, decide and write with no gap, see [`decide`]) and
//! answers a [`CheckResponse`]. The filter posts several requests' checks at once to
//! `POST /v1/check-batch` ([`BatchCheckRequest`]), each decided the same way.
//! `GET /healthz` (the process serves), `GET /readyz` (Redis answers, not draining) and
//! `GET /metrics` (Prometheus) are for operators. Shaped so tests drive the real server:
//! [`run`] takes a bound listener and a shutdown future.

pub mod cli;
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
use futures_util::future::join_all;
use metrics::{CheckOutcome, Metrics, RequestOutcome};
use ratelimit_wire::{
    BatchAnswer, BatchCheckRequest, BatchCheckResponse, CheckRequest, CheckResponse, CHECK_BATCH_PATH,
    CHECK_PATH, MAX_BATCH, TOKEN_HEADER,
};
use scripts::Scripts;
use serde_json::json;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{RedisConfig, Store};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Largest check request body accepted: 16 checks with the longest keys fit in 8 KiB.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Largest batch body accepted.
pub const MAX_BATCH_BODY_BYTES: usize = MAX_BATCH * MAX_BODY_BYTES;
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
        .route(
            CHECK_BATCH_PATH,
            post(check_batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES)),
        )
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
    let (outcome, response) = match admit(&shim, &headers, body, MAX_BODY_BYTES) {
        Err((outcome, status, message)) => (outcome, error(status, message)),
        Ok((_permit, body)) => match serde_json::from_slice::<CheckRequest>(&body) {
            Err(e) => (
                RequestOutcome::Invalid,
                error(StatusCode::BAD_REQUEST, format!("invalid check request: {e}")),
            ),
            Ok(request) => match decide_request(&shim, &request).await {
                Ok(answer) => (answer_outcome(&answer), Json(answer).into_response()),
                Err((outcome, status, message)) => (outcome, error(status, message)),
            },
        },
    };
    shim.metrics.request(outcome, started.elapsed());
    response
}

/// Decides several requests' checks (see [`BatchCheckRequest`]): each is its own atomic
/// decision, run concurrently, so one call carries what a worker queued. Each request
/// is counted in the metrics as if it had come alone.
async fn check_batch(
    State(shim): State<Arc<Shim>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let (mut permit, body) = match admit(&shim, &headers, body, MAX_BATCH_BODY_BYTES) {
        Ok(admitted) => admitted,
        Err((outcome, status, message)) => {
            shim.metrics.request(outcome, started.elapsed());
            return error(status, message);
        }
    };
    let batch = match serde_json::from_slice::<BatchCheckRequest>(&body)
        .map_err(|e| format!("invalid batch: {e}"))
        .and_then(|batch| batch.validate().map(|()| batch).map_err(|e| e.to_string()))
    {
        Ok(batch) => batch,
        Err(message) => {
            shim.metrics.request(RequestOutcome::Invalid, started.elapsed());
            return error(StatusCode::BAD_REQUEST, message);
        }
    };
    // The permit taken on admission covers the first request; the others need theirs.
    // Those that find none are refused one by one, as if each had come alone, so a
    // bound below the batch size still decides what it can.
    while permit.num_permits() < batch.requests.len() {
        let Ok(more) = shim.permits.try_acquire() else {
            break;
        };
        permit.merge(more);
    }
    let (admitted, refused) = batch.requests.split_at(permit.num_permits());
    let decided = join_all(admitted.iter().map(|request| decide_request(&shim, request))).await;
    let elapsed = started.elapsed();
    let mut responses: Vec<BatchAnswer> = decided
        .into_iter()
        .map(|decision| match decision {
            Ok(answer) => {
                shim.metrics.request(answer_outcome(&answer), elapsed);
                BatchAnswer::Decided(answer)
            }
            Err((outcome, _, message)) => {
                shim.metrics.request(outcome, elapsed);
                BatchAnswer::Failed(message)
            }
        })
        .collect();
    for _ in refused {
        shim.metrics.request(RequestOutcome::Overloaded, elapsed);
        responses.push(BatchAnswer::Failed(OVERLOADED.into()));
    }
    Json(BatchCheckResponse { responses }).into_response()
}

fn answer_outcome(answer: &CheckResponse) -> RequestOutcome {
    if answer.allowed {
        RequestOutcome::Allowed
    } else {
        RequestOutcome::Denied
    }
}

const OVERLOADED: &str = "overloaded: too many checks in flight";

/// Why a check was not decided: how to count it, the HTTP status, and the message.
type Refusal = (RequestOutcome, StatusCode, String);

/// What every check call passes before its body is read: the in-flight bound, the
/// shared token and the body's size. The permit is held until the call is answered.
fn admit<'a>(
    shim: &'a Shim,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<(SemaphorePermit<'a>, Bytes), Refusal> {
    // Past the bound, answering at once keeps latency and memory bounded; Envoy's
    // failure mode decides what the request becomes.
    let Ok(permit) = shim.permits.try_acquire() else {
        return Err((
            RequestOutcome::Overloaded,
            StatusCode::SERVICE_UNAVAILABLE,
            OVERLOADED.into(),
        ));
    };
    if let Some(expected) = &shim.config.token {
        let presented = headers
            .get(TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !constant_time_eq(presented, expected.as_bytes()) {
            return Err((
                RequestOutcome::Unauthorized,
                StatusCode::UNAUTHORIZED,
                format!("missing or wrong {TOKEN_HEADER}"),
            ));
        }
    }
    match body {
        Ok(body) if body.len() <= max_body_bytes => Ok((permit, body)),
        Ok(_) => Err((
            RequestOutcome::Invalid,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body over {max_body_bytes} bytes"),
        )),
        Err(rejection) => Err((
            RequestOutcome::Invalid,
            rejection.status(),
            format!("body over {max_body_bytes} bytes or unreadable: {rejection}"),
        )),
    }
}

/// One request's checks, validated and decided in Redis.
async fn decide_request(shim: &Shim, request: &CheckRequest) -> Result<CheckResponse, Refusal> {
    let _in_flight = shim.metrics.in_flight();
    if let Err(invalid) = request.validate() {
        return Err((
            RequestOutcome::Invalid,
            StatusCode::BAD_REQUEST,
            invalid.to_string(),
        ));
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
            return Err((
                RequestOutcome::RedisError,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("redis: {}", failure.error),
            ));
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
    Ok(CheckResponse {
        allowed: decision.allowed,
        results: decision.results,
    })
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
