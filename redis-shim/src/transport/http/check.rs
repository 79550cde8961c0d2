//! `POST /v1/check`: one request's checks decided, and its HTTP answer: the response and
//! how it is counted. The decision is counted and logged as every service's is
//! ([`crate::decide::answer`]); a batch's requests are answered the same way
//! ([`super::check_batch`]).

use super::endpoint::{error, Admitted, Refusal, Reply};
use crate::decide::answer::respond;
use crate::decide::decision::{self, DecideError, Decision};
use crate::decide::regions::{crosses_regions, decide_across, note_without_peers, refused_across};
use crate::metrics::RequestOutcome;
use crate::transport::shim::Shim;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use ratelimit_wire::{Check, CheckRequest, CheckResponse};

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
    validate(shim, request)?;
    let keys = shim
        .config
        .redis_keys(request.checks.iter().map(|check| check.key.as_str()));
    let decision = decide_alone(shim, &keys, &request.checks).await;
    respond(&shim.metrics, request, &keys, decision).map_err(redis_failed)
}

/// Refuses a request the shim must not decide: out of the wire's bounds, or, across
/// regions, with a replicated cost no share holds.
pub fn validate(shim: &Shim, request: &CheckRequest) -> Result<(), Refusal> {
    request.validate().map_err(invalid_request)?;
    match shim
        .regions
        .as_deref()
        .and_then(|regions| refused_across(regions, &request.checks))
    {
        Some(refused) => Err(invalid_request(refused)),
        None => Ok(()),
    }
}

/// Decides `checks` (Redis keys `keys`) in a decision of their own: across the regions
/// when some of them count beyond this one, else as any request.
pub async fn decide_alone(shim: &Shim, keys: &[String], checks: &[Check]) -> Result<Decision, DecideError> {
    match shim.regions.as_deref() {
        Some(regions) if crosses_regions(checks) => decide_across(&shim.store, regions, keys, checks).await,
        _ => {
            note_without_peers(checks);
            decision::decide(&shim.store, keys, checks).await
        }
    }
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

/// A request Redis could not decide, as `POST /v1/check` answers it.
pub fn redis_failed(message: String) -> Refusal {
    Refusal::new(
        RequestOutcome::RedisError,
        StatusCode::SERVICE_UNAVAILABLE,
        message,
    )
}
