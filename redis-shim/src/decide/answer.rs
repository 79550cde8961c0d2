//! What every service makes of a decided request (`POST /v1/check`, a batch's requests,
//! `ShouldRateLimit`): its answer, its checks and refund counted, the
//! shadow checks that would have denied logged; or, when Redis failed, the failure and
//! its refund counted and logged.

use super::decision::{DecideError, Decision};
use super::refund::Refund;
use crate::metrics::{CheckOutcome, Metrics};
use ratelimit_wire::{CheckRequest, CheckResponse};

/// One request's decision counted and logged, and its answer; or, when Redis failed,
/// what the caller is told.
pub fn respond(
    metrics: &Metrics,
    request: &CheckRequest,
    keys: &[String],
    decision: Result<Decision, DecideError>,
) -> Result<CheckResponse, String> {
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
            Err(format!("redis: {}", failure.error))
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
