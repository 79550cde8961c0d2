//! The HTTP handlers: what each endpoint reads, the token and body checks, the status
//! codes, and the counting and logging of every decision (the edge of the shim: what
//! runs under it only returns what happened).

use crate::admission::{Admission, OVERLOADED};
use crate::body::{read_body, BodyError};
use crate::config::ShimConfig;
use crate::decision::{self, DecideError, Decision};
use crate::metrics::{CheckOutcome, ConnectionClose, Metrics, RequestOutcome};
use crate::redis_store::{RedisStore, SharedScript};
use crate::refund::Refund;
use crate::scripts::RequestChecks;
use crate::store::StoreError;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::join_all;
use ratelimit_wire::{
    BatchAnswer, BatchCheckRequest, BatchCheckResponse, CheckRequest, CheckResponse, MAX_BATCH, TOKEN_HEADER,
};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::SemaphorePermit;

/// Largest check request body accepted: 16 checks with the longest keys fit in 8 KiB.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Largest batch body accepted.
pub const MAX_BATCH_BODY_BYTES: usize = MAX_BATCH * MAX_BODY_BYTES;

/// What every handler shares.
pub struct Shim {
    pub store: RedisStore,
    pub config: ShimConfig,
    /// Shared with the connection cap, which counts the open connections.
    pub metrics: Arc<Metrics>,
    pub admission: Admission,
    /// Set once the shutdown signal came: the shim reports not ready.
    pub draining: AtomicBool,
}

impl Shim {
    pub fn new(store: RedisStore, config: ShimConfig, metrics: Arc<Metrics>) -> Shim {
        Shim {
            store,
            admission: Admission::new(config.max_in_flight),
            config,
            metrics,
            draining: AtomicBool::new(false),
        }
    }
}

/// Why a check call, or one request of a batch, was not decided: how it is counted, the
/// HTTP status, and the message.
struct Refusal {
    outcome: RequestOutcome,
    status: StatusCode,
    message: String,
    /// The body was left unread: the connection is closed after the answer rather than
    /// drained for a next request.
    close: bool,
}

impl Refusal {
    fn new(outcome: RequestOutcome, status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            outcome,
            status,
            message: message.into(),
            close: false,
        }
    }

    fn closing(self) -> Refusal {
        Refusal { close: true, ..self }
    }

    fn into_response(self) -> Response {
        let mut response = error(self.status, self.message);
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Compares in time independent of where the inputs differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn check(State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let (outcome, response) = match admit(&shim, &headers, body, MAX_BODY_BYTES).await {
        Err(refusal) => (refusal.outcome, refusal.into_response()),
        Ok((_permit, body)) => match serde_json::from_slice::<CheckRequest>(&body) {
            Err(e) => (
                RequestOutcome::Invalid,
                error(StatusCode::BAD_REQUEST, format!("invalid check request: {e}")),
            ),
            Ok(request) => match decide_request(&shim, &request).await {
                Ok(answer) => (answer_outcome(&answer), Json(answer).into_response()),
                Err(refusal) => (refusal.outcome, refusal.into_response()),
            },
        },
    };
    shim.metrics.request(outcome, started.elapsed());
    response
}

/// Decides several requests' checks (see [`BatchCheckRequest`]): each is its own atomic
/// decision, run concurrently, so one call carries what a worker queued. Each request
/// is counted in the metrics as if it had come alone.
pub async fn check_batch(State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let (mut permit, body) = match admit(&shim, &headers, body, MAX_BATCH_BODY_BYTES).await {
        Ok(admitted) => admitted,
        Err(refusal) => {
            shim.metrics.request(refusal.outcome, started.elapsed());
            return refusal.into_response();
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
    // Tokens given back and costs settled first, so the requests of this batch see them.
    if !batch.returns.is_empty() || !batch.settlements.is_empty() {
        let keys = shim.config.redis_keys(
            batch
                .returns
                .iter()
                .map(|back| back.key.as_str())
                .chain(batch.settlements.iter().map(|settled| settled.key.as_str())),
        );
        if let Err(error) =
            crate::adjustments::adjust_counters(&shim.store, &keys, &batch.returns, &batch.settlements).await
        {
            tracing::warn!(%error, keys = ?keys, "returning unspent tokens or settling real costs failed");
        }
    }
    // The requests that find no permit are refused one by one, as if each had come
    // alone, so a bound below the batch size still decides what it can.
    let admitted_count = shim
        .admission
        .admit_more(&mut permit, batch.requests.len())
        .min(batch.requests.len());
    let (admitted, refused) = batch.requests.split_at(admitted_count);
    let decided = decide_batch(&shim, admitted).await;
    let elapsed = started.elapsed();
    let mut responses: Vec<BatchAnswer> = decided
        .into_iter()
        .map(|decision| match decision {
            Ok(answer) => {
                shim.metrics.request(answer_outcome(&answer), elapsed);
                BatchAnswer::Decided(answer)
            }
            Err(refusal) => {
                shim.metrics.request(refusal.outcome, elapsed);
                BatchAnswer::Failed(refusal.message)
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

/// Whether the request carries the shim's token (always, when it has none).
fn token_presented(shim: &Shim, headers: &HeaderMap) -> bool {
    let Some(expected) = &shim.config.token else {
        return true;
    };
    let presented = headers
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    constant_time_eq(presented, expected.as_bytes())
}

/// For `/metrics` and `/readyz`: a refusal when they require the token and it is not there.
fn operator_refusal(shim: &Shim, headers: &HeaderMap) -> Option<Response> {
    (shim.config.token_for_operators && !token_presented(shim, headers)).then(|| {
        error(
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong {TOKEN_HEADER}"),
        )
    })
}

/// What every check call passes, in this order: the shared token (before anything else,
/// so a caller without it costs no permit and none of its body is read), the in-flight
/// bound, then the body, read within its size limit and the body timeout while the
/// permit is held (so the bytes buffered at once stay under the bound times the limit).
/// The permit is held until the call is answered.
async fn admit<'a>(
    shim: &'a Shim,
    headers: &HeaderMap,
    body: Body,
    max_body_bytes: usize,
) -> Result<(SemaphorePermit<'a>, Bytes), Refusal> {
    if !token_presented(shim, headers) {
        return Err(Refusal::new(
            RequestOutcome::Unauthorized,
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong {TOKEN_HEADER}"),
        )
        .closing());
    }
    let Some(permit) = shim.admission.try_admit() else {
        return Err(Refusal::new(
            RequestOutcome::Overloaded,
            StatusCode::SERVICE_UNAVAILABLE,
            OVERLOADED,
        ));
    };
    let timeout = shim.config.body_timeout;
    match read_body(headers, body, max_body_bytes, timeout).await {
        Ok(body) => Ok((permit, body)),
        Err(BodyError::TooLarge) => Err(Refusal::new(
            RequestOutcome::Invalid,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body over {max_body_bytes} bytes"),
        )),
        Err(BodyError::TimedOut) => {
            shim.metrics.connection_closed(ConnectionClose::BodyTimeout);
            Err(Refusal::new(
                RequestOutcome::Invalid,
                StatusCode::REQUEST_TIMEOUT,
                format!("body not received within {} ms", timeout.as_millis()),
            )
            .closing())
        }
        Err(BodyError::Unreadable(e)) => Err(Refusal::new(
            RequestOutcome::Invalid,
            StatusCode::BAD_REQUEST,
            format!("body unreadable: {e}"),
        )
        .closing()),
    }
}

/// One request's checks, validated, decided in Redis, counted and logged.
async fn decide_request(shim: &Shim, request: &CheckRequest) -> Result<CheckResponse, Refusal> {
    let _in_flight = shim.metrics.in_flight();
    request.validate().map_err(invalid_request)?;
    let keys = shim
        .config
        .redis_keys(request.checks.iter().map(|check| check.key.as_str()));
    let decision = decision::decide(&shim.store, &keys, &request.checks).await;
    respond(&shim.metrics, request, &keys, decision)
}

/// A batch's requests, each validated, decided all or nothing on its own, counted and
/// logged as [`decide_request`] does it alone, in as few scripts as their keys allow: on
/// a standalone Redis one for the whole batch; on a cluster one per slot for the requests
/// whose keys all lie in it, and slot by slot for each request whose keys span slots.
/// One script for ten requests costs Redis less than half the CPU per check of ten
/// scripts (`bench/RESULTS.md`).
async fn decide_batch(shim: &Shim, requests: &[CheckRequest]) -> Vec<Result<CheckResponse, Refusal>> {
    let _in_flight: Vec<_> = requests.iter().map(|_| shim.metrics.in_flight()).collect();
    let keys: Vec<Vec<String>> = requests
        .iter()
        .map(|request| {
            shim.config
                .redis_keys(request.checks.iter().map(|check| check.key.as_str()))
        })
        .collect();
    let validity: Vec<Result<(), Refusal>> = requests
        .iter()
        .map(|request| request.validate().map_err(invalid_request))
        .collect();
    // The valid requests by the script that can decide them together, and those that
    // need scripts of their own.
    let mut scripts: Vec<(SharedScript, Vec<usize>)> = Vec::new();
    let mut spanning_slots: Vec<usize> = Vec::new();
    for (index, keys) in keys.iter().enumerate() {
        if validity[index].is_err() {
            continue;
        }
        match shim.store.shared_script(keys) {
            Some(script) => match scripts.iter_mut().find(|(shared, _)| *shared == script) {
                Some((_, members)) => members.push(index),
                None => scripts.push((script, vec![index])),
            },
            None => spanning_slots.push(index),
        }
    }
    let together = join_all(scripts.iter().map(|(_, members)| {
        let requests: Vec<RequestChecks> = members
            .iter()
            .map(|&i| RequestChecks {
                keys: &keys[i],
                checks: &requests[i].checks,
            })
            .collect();
        async move {
            match shim.store.check_requests(&requests).await {
                Ok(rows) => rows
                    .into_iter()
                    .zip(&requests)
                    .map(|(rows, request)| decision::decided_in_batch(rows, request.checks))
                    .collect(),
                Err(error) => requests
                    .iter()
                    .map(|_| Err(DecideError::nothing_charged(error.duplicate())))
                    .collect::<Vec<_>>(),
            }
        }
    }));
    let alone = join_all(
        spanning_slots
            .iter()
            .map(|&i| decision::decide(&shim.store, &keys[i], &requests[i].checks)),
    );
    let (together, alone) = futures_util::future::join(together, alone).await;
    let mut decisions: Vec<Option<Result<Decision, DecideError>>> = requests.iter().map(|_| None).collect();
    let decided_members = scripts
        .iter()
        .zip(together)
        .flat_map(|((_, members), decided)| members.iter().copied().zip(decided));
    for (index, decision) in decided_members.chain(spanning_slots.iter().copied().zip(alone)) {
        decisions[index] = Some(decision);
    }
    requests
        .iter()
        .zip(&keys)
        .zip(validity)
        .zip(decisions)
        .map(|(((request, keys), validity), decision)| {
            validity?;
            let decision = decision.unwrap_or_else(|| {
                Err(DecideError::nothing_charged(StoreError::Malformed(
                    "no answer for a request".into(),
                )))
            });
            respond(&shim.metrics, request, keys, decision)
        })
        .collect()
}

fn invalid_request(invalid: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        RequestOutcome::Invalid,
        StatusCode::BAD_REQUEST,
        invalid.to_string(),
    )
}

/// One request's decision (or failure), counted and logged, as the shim answers it.
fn respond(
    metrics: &Metrics,
    request: &CheckRequest,
    keys: &[String],
    decision: Result<Decision, DecideError>,
) -> Result<CheckResponse, Refusal> {
    match decision {
        Ok(decision) => {
            record_decision(metrics, request, keys, &decision);
            Ok(CheckResponse {
                allowed: decision.allowed,
                results: decision.results,
            })
        }
        Err(failure) => {
            record_failure(metrics, &failure);
            Err(Refusal::new(
                RequestOutcome::RedisError,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("redis: {}", failure.error),
            ))
        }
    }
}

fn log_refund_failures(refund: &Refund) {
    for failure in &refund.failures {
        tracing::error!(error = %failure.error, keys = ?failure.keys, "refund failed");
    }
}

/// Counts a decided request's refund and checks, and logs each shadow check that would
/// have denied.
fn record_decision(metrics: &Metrics, request: &CheckRequest, keys: &[String], decision: &Decision) {
    if let Some(refund) = &decision.refund {
        log_refund_failures(refund);
        metrics.refund(refund.is_complete());
    }
    for ((check, result), key) in request.checks.iter().zip(&decision.results).zip(keys) {
        let outcome = match (result.allowed, check.shadow) {
            (true, _) => CheckOutcome::Allowed,
            (false, false) => CheckOutcome::Denied,
            (false, true) => {
                tracing::info!(key = %key, algorithm = check.algorithm.as_str(), limit = check.limit, "shadow check would deny");
                CheckOutcome::ShadowDenied
            }
        };
        metrics.check(check.algorithm, outcome);
    }
}

/// Counts and logs a store failure and the refund it required.
fn record_failure(metrics: &Metrics, failure: &DecideError) {
    for refund in [&failure.earlier_refund, &failure.refund].into_iter().flatten() {
        log_refund_failures(refund);
    }
    metrics.redis_error(failure.error.kind());
    if let Some(refund) = &failure.refund {
        metrics.refund(refund.is_complete());
    }
    let refund_complete = failure.refund.as_ref().is_none_or(Refund::is_complete);
    tracing::warn!(error = %failure.error, refund_complete, "redis check failed");
}

/// Liveness: 200 while the process serves, whatever Redis does (restarting the shim
/// would not bring Redis back).
pub async fn healthz() -> Response {
    (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response()
}

/// Readiness: 200 when Redis answers PING within the timeout and the shim is not
/// shutting down, 503 otherwise.
pub async fn readyz(State(shim): State<Arc<Shim>>, headers: HeaderMap) -> Response {
    if let Some(refusal) = operator_refusal(&shim, &headers) {
        return refusal;
    }
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

pub async fn metrics(State(shim): State<Arc<Shim>>, headers: HeaderMap) -> Response {
    if let Some(refusal) = operator_refusal(&shim, &headers) {
        return refusal;
    }
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
}
