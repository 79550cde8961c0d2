//! The admin endpoints behind `redis-shim counters` ([`crate::counters`]): the state of
//! some counters without charging them (check.lua's peek mode), and their reset (the
//! keys deleted).
//!
//! They read and reset any client's counters, so they always require a token: the
//! shim's `--admin-token`, else its `--token`. A shim started with neither refuses them
//! (403) rather than serve them open. A caller sends the counters as a [`CheckRequest`]
//! (keys as the filter sends them, without the shim's prefix), validated as a check is.

use crate::body::{read_body, BodyError};
use crate::handlers::{constant_time_eq, error, Shim, MAX_BODY_BYTES};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimit_wire::{CheckRequest, CheckResult, TOKEN_HEADER};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub const SHOW_PATH: &str = "/v1/admin/counters/show";
pub const RESET_PATH: &str = "/v1/admin/counters/reset";
pub const VARIANTS_PATH: &str = "/v1/admin/counters/variants";
/// Most keys of other variants reported per counter.
const MAX_VARIANTS: usize = 32;

/// `POST /v1/admin/counters/show` answer: each counter's state, in order, as a check
/// that charged nothing would report it (`granted` 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShowAnswer {
    pub results: Vec<CheckResult>,
}

/// `POST /v1/admin/counters/reset` answer: each counter's state just before the reset,
/// and whether its key was in Redis (a counter at its full limit has none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetAnswer {
    pub before: Vec<CheckResult>,
    pub deleted: Vec<bool>,
}

/// `POST /v1/admin/counters/variants` answer: for each counter asked about, the counters
/// in Redis of the same rule and client under another algorithm, period or calendar
/// (another variant of the rule: what an older configuration counted in), as keys without
/// the shim's prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantsAnswer {
    pub variants: Vec<Vec<String>>,
}

/// The counters asked about, with their Redis keys; or the refusal to answer.
async fn admitted(
    shim: &Shim,
    headers: &HeaderMap,
    body: Body,
) -> Result<(CheckRequest, Vec<String>), Response> {
    let Some(expected) = shim.config.admin_token.as_ref().or(shim.config.token.as_ref()) else {
        return Err(error(
            StatusCode::FORBIDDEN,
            "the admin endpoints are off: this shim has no token (start it with --admin-token or --token)",
        ));
    };
    let presented = headers
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !constant_time_eq(presented, expected.as_bytes()) {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong {TOKEN_HEADER}"),
        ));
    }
    let body = read_body(headers, body, MAX_BODY_BYTES, shim.config.body_timeout)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge => error(StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
            BodyError::TimedOut => error(StatusCode::REQUEST_TIMEOUT, "body too slow"),
            BodyError::Unreadable(e) => error(StatusCode::BAD_REQUEST, e),
        })?;
    let request = serde_json::from_slice::<CheckRequest>(&body)
        .map_err(|e| e.to_string())
        .and_then(|request| request.validate().map(|()| request).map_err(|e| e.to_string()))
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid counters: {e}")))?;
    let keys = shim
        .config
        .redis_keys(request.checks.iter().map(|check| check.key.as_str()));
    Ok((request, keys))
}

fn redis_failure(e: impl std::fmt::Display) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, format!("redis: {e}"))
}

pub async fn show(State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Body) -> Response {
    let (request, keys) = match admitted(&shim, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    match crate::peek::peek(&shim.store, &keys, &request.checks).await {
        Ok(results) => Json(ShowAnswer { results }).into_response(),
        Err(e) => redis_failure(e),
    }
}

/// Each algorithm keeps a counter in exactly one key (see the scripts' headers), so
/// deleting it is the whole reset; the client's next check starts from a full limit.
pub async fn reset(State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Body) -> Response {
    let (request, keys) = match admitted(&shim, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let before = match crate::peek::peek(&shim.store, &keys, &request.checks).await {
        Ok(before) => before,
        Err(e) => return redis_failure(e),
    };
    let mut deleted = Vec::with_capacity(keys.len());
    for key in &keys {
        match shim.store.delete(key).await {
            Ok(existed) => deleted.push(existed),
            Err(e) => return redis_failure(e),
        }
    }
    tracing::info!(keys = ?keys, "counters reset by an operator");
    Json(ResetAnswer { before, deleted }).into_response()
}

/// A counter key is `<rule>/<variant>:{<client hash>}`: the other variants of the same
/// rule and client share its rule and its hash tag, so they sit in its cluster slot.
pub async fn variants(State(shim): State<Arc<Shim>>, headers: HeaderMap, body: Body) -> Response {
    let (request, keys) = match admitted(&shim, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let prefix = &shim.config.key_prefix;
    let mut variants = Vec::with_capacity(keys.len());
    for (check, key) in request.checks.iter().zip(&keys) {
        let Some(pattern) = variant_pattern(prefix, &check.key) else {
            variants.push(vec![]);
            continue;
        };
        match shim.store.scan_near(key, &pattern, MAX_VARIANTS + 1).await {
            Ok(found) => variants.push(
                found
                    .into_iter()
                    .filter(|other| other != key)
                    .filter_map(|other| other.strip_prefix(prefix.as_str()).map(str::to_string))
                    .take(MAX_VARIANTS)
                    .collect(),
            ),
            Err(e) => return redis_failure(e),
        }
    }
    Json(VariantsAnswer { variants }).into_response()
}

/// The SCAN pattern of every variant of `key`'s rule for the same client.
fn variant_pattern(prefix: &str, key: &str) -> Option<String> {
    let (rule, _) = key.split_once('/')?;
    let tag = &key[key.rfind(":{")?..];
    Some(format!(
        "{}{}/*{}",
        glob_escape(prefix),
        glob_escape(rule),
        glob_escape(tag)
    ))
}

fn glob_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_pattern_keeps_the_rule_and_the_client_and_escapes_the_rest() {
        assert_eq!(
            variant_pattern("rl:", "per-key/tb60000:{0a1b}").as_deref(),
            Some("rl:per-key/*:{0a1b}")
        );
        assert_eq!(
            variant_pattern("t[1]*:", "quota/fw-month+0530:{ff}").as_deref(),
            Some("t\\[1\\]\\*:quota/*:{ff}")
        );
        assert_eq!(variant_pattern("rl:", "no-slash"), None);
    }
}
