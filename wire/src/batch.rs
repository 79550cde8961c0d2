//! `POST /v1/check-batch`: several requests' checks in one call, each decided on its own,
//! with the leased tokens given back and the settlements of earlier requests' real costs
//! that ride along, and the answer per request.

use crate::{
    check_counter, is_zero_i64, Algorithm, CalendarWindow, CheckRequest, CheckResponse, InvalidRequest,
    MAX_BATCH, MAX_DEBT_LIMITS, MAX_LIMIT,
};
use serde::{Deserialize, Serialize};

/// `POST /v1/check-batch` body: several requests' checks, each decided on its own (all or
/// nothing within a request, independently across requests), and leased tokens an Envoy
/// gives back unspent and settlements of earlier requests' real costs, applied first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchCheckRequest {
    pub requests: Vec<CheckRequest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returns: Vec<TokenReturn>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settlements: Vec<Settlement>,
}

/// The real cost of an admitted request, read from its response: the counter `key` it
/// was charged `charged` tokens to (where `stamp` says: the result's `stamp`) is
/// adjusted to `actual`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settlement {
    pub key: String,
    #[serde(default)]
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    pub charged: u64,
    pub actual: u64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub stamp: i64,
    /// The counter's calendar, as in its [`Check`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<CalendarWindow>,
}

impl Settlement {
    /// Tokens to charge beyond the estimate (positive, at most [`MAX_DEBT_LIMITS`]
    /// limits) or to give back (negative).
    pub fn difference(&self) -> i64 {
        let extra = self
            .actual
            .saturating_sub(self.charged)
            .min(self.limit.saturating_mul(MAX_DEBT_LIMITS));
        let back = self.charged.saturating_sub(self.actual);
        i64::try_from(extra).unwrap_or(i64::MAX) - i64::try_from(back).unwrap_or(i64::MAX)
    }
}

/// Tokens given back to the counter `key`: `amount` tokens charged where `stamp` says
/// (the `stamp` of the grant). Leased tokens left unspent, or a concurrency slot released
/// when its request's stream ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenReturn {
    pub key: String,
    #[serde(default)]
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    pub amount: u64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub stamp: i64,
    /// The counter's calendar, as in its [`Check`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<CalendarWindow>,
}

/// `POST /v1/check-batch` answer: one answer per request, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCheckResponse {
    pub responses: Vec<BatchAnswer>,
    /// Returns and settlements this shim did not apply, for fields it does not know
    /// (`settlements[I]: FIELD`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<String>,
}

/// One request's answer within a batch: decided, or why it could not be (an invalid
/// request, Redis failing); the filter applies its failure mode to that request only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchAnswer {
    Decided(CheckResponse),
    Failed(String),
}

impl BatchCheckRequest {
    /// Checks the batch's own bounds; each request is validated on its own.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        let fail = |msg: String| Err(InvalidRequest(msg));
        let adjusts = !self.returns.is_empty() || !self.settlements.is_empty();
        if self.requests.len() > MAX_BATCH || (self.requests.is_empty() && !adjusts) {
            return fail(format!(
                "requests: must contain 1..={MAX_BATCH} requests (or none, with returns or settlements)"
            ));
        }
        if self.returns.len() > MAX_BATCH {
            return fail(format!("returns: at most {MAX_BATCH}"));
        }
        for (i, back) in self.returns.iter().enumerate() {
            check_counter(
                &format!("returns[{i}]"),
                &back.key,
                back.algorithm,
                back.limit,
                back.period_ms,
                back.calendar,
            )?;
            if back.amount == 0 || back.amount > back.limit {
                return fail(format!("returns[{i}].amount: must be 1..=limit"));
            }
            if back.algorithm.traits().counts_in_flight && back.amount != 1 {
                return fail(format!(
                    "returns[{i}].amount: a concurrency slot is given back alone (1)"
                ));
            }
        }
        if self.settlements.len() > MAX_BATCH {
            return fail(format!("settlements: at most {MAX_BATCH}"));
        }
        for (i, settled) in self.settlements.iter().enumerate() {
            let at = format!("settlements[{i}]");
            check_counter(
                &at,
                &settled.key,
                settled.algorithm,
                settled.limit,
                settled.period_ms,
                settled.calendar,
            )?;
            if matches!(
                settled.algorithm,
                Algorithm::SlidingWindowLog | Algorithm::Concurrency
            ) {
                return fail(format!(
                    "{at}.algorithm: a {} cannot be settled",
                    settled.algorithm.as_str()
                ));
            }
            if settled.charged == 0 || settled.charged > settled.limit {
                return fail(format!("{at}.charged: must be 1..=limit"));
            }
            if settled.actual > MAX_LIMIT {
                return fail(format!("{at}.actual: at most {MAX_LIMIT}"));
            }
        }
        Ok(())
    }
}
