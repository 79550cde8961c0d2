//! `POST /v1/check`: one request's checks decided, and what the shim answers for a
//! decided request (or one that failed): its status, and the counting and logging of the
//! decision. A batch's requests are answered the same way ([`crate::check_batch`]).

use crate::decision::{self, DecideError, Decision};
use crate::endpoint::{error, Admitted, Refusal, Reply, Shim};
use crate::metrics::{CheckOutcome, Metrics, RequestOutcome};
use crate::refund::Refund;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use ratelimit_wire::{CheckRequest, CheckResponse};

pub async fn check(request: Admitted) -> Reply {
    let (outcome, response) = match serde_json::from_slice::<CheckRequest>(&request.body) {
        Err(e) => (
            RequestOutcome::Invalid,
            error(StatusCode::BAD_REQUEST, format!("invalid check request: {e}")),
        ),
        Ok(checks) => match decide_request(&request.shim, &checks).await {
            Ok(answer) => (answer_outcome(&answer), Json(answer).into_response()),
            Err(refusal) => (refusal.outcome, refusal.into_response()),
        },
    };
    Reply::counted(response, vec![outcome])
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

pub fn answer_outcome(answer: &CheckResponse) -> RequestOutcome {
    if answer.allowed {
        RequestOutcome::Allowed
    } else {
        RequestOutcome::Denied
    }
}

pub fn invalid_request(invalid: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        RequestOutcome::Invalid,
        StatusCode::BAD_REQUEST,
        invalid.to_string(),
    )
}

/// One request's decision (or failure), counted and logged, as the shim answers it.
pub fn respond(
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
                unsupported: Vec::new(),
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
