//! The admin endpoints behind `redis-shim counters` ([`crate::ops::counters`]): the state of
//! some counters without charging them (check.lua's peek mode), and their reset (the
//! keys deleted).
//!
//! They read and reset any client's counters, so they always require a token: the
//! shim's `--admin-token`, else its `--token` ([`crate::transport::http::endpoint::Access::Admin`]). A
//! shim started with neither refuses them (403) rather than serve them open. Like a
//! check, each takes an in-flight permit and its body is read within the limits. A
//! caller sends the counters as a [`CheckRequest`]
//! (keys as the filter sends them, without the shim's prefix), validated as a check is.
//! Each call, refused ones included, counts in `rlshim_requests_total` under its own
//! `endpoint`, apart from the check traffic.

use crate::decide::peek::peek;
use crate::decide::regions::{components, crosses_regions, peek_across};
use crate::metrics::{CountedEndpoint, RequestOutcome};
use crate::store::StoreAdmin;
use crate::transport::http::endpoint::{
    Access, Admitted, Counting, Endpoint, Method, Refusal, Reply, MAX_BODY_BYTES,
};
use crate::transport::Shim;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimit_wire::{CheckRequest, CheckResult};
use serde::{Deserialize, Serialize};

/// The admin endpoints take the counters as a check request does.
const fn admin(path: &'static str, counted: CountedEndpoint) -> Endpoint {
    Endpoint {
        path,
        method: Method::Post {
            body_limit: MAX_BODY_BYTES,
        },
        access: Access::Admin,
        counting: Counting::Requests(counted),
    }
}

/// `POST /v1/admin/counters/show`: counters' state, charging nothing.
pub const COUNTERS_SHOW: Endpoint = admin("/v1/admin/counters/show", CountedEndpoint::CountersShow);
/// `POST /v1/admin/counters/reset`: counters deleted.
pub const COUNTERS_RESET: Endpoint = admin("/v1/admin/counters/reset", CountedEndpoint::CountersReset);
/// `POST /v1/admin/counters/variants`: the client's counters under other variants of
/// the same rules.
pub const COUNTERS_VARIANTS: Endpoint =
    admin("/v1/admin/counters/variants", CountedEndpoint::CountersVariants);

/// Most keys of other variants reported per counter.
const MAX_VARIANTS: usize = 32;

/// `POST /v1/admin/counters/show` answer: each counter's state, in order, as a check
/// that charged nothing would report it (`granted` 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShowAnswer {
    pub results: Vec<CheckResult>,
    /// Per check, each region's component of a replicated counter (docs/REGIONS.md),
    /// as this shim's region holds them; empty for other checks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<Vec<(String, u64)>>,
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

/// The counters asked about, validated as a check is, with their Redis keys; or why
/// they are invalid.
fn counters_asked(shim: &Shim, body: &[u8]) -> Result<(CheckRequest, Vec<String>), Refusal> {
    let request = serde_json::from_slice::<CheckRequest>(body)
        .map_err(|e| e.to_string())
        .and_then(|request| request.validate().map(|()| request).map_err(|e| e.to_string()))
        .map_err(|e| {
            Refusal::new(
                RequestOutcome::Invalid,
                StatusCode::BAD_REQUEST,
                format!("invalid counters: {e}"),
            )
        })?;
    let keys = shim
        .config
        .redis_keys(request.checks.iter().map(|check| check.key.as_str()));
    Ok((request, keys))
}

fn redis_failure(e: impl std::fmt::Display) -> Refusal {
    Refusal::new(
        RequestOutcome::RedisError,
        StatusCode::SERVICE_UNAVAILABLE,
        format!("redis: {e}"),
    )
}

/// An admin call's answer, counted: 200, or why not.
fn counted(answer: Result<Response, Refusal>) -> Reply {
    match answer {
        Ok(response) => Reply::counted(response, vec![RequestOutcome::Answered]),
        Err(refusal) => {
            let outcome = refusal.outcome;
            Reply::counted(refusal.into_response(), vec![outcome])
        }
    }
}

pub async fn show(request: Admitted) -> Reply {
    counted(show_counters(&request).await)
}

async fn show_counters(request: &Admitted) -> Result<Response, Refusal> {
    let shim = &request.shim;
    let (counters, keys) = counters_asked(shim, &request.body)?;
    let results = match shim.regions.as_deref() {
        Some(regions) if crosses_regions(&counters.checks) => {
            peek_across(&shim.store, regions, &keys, &counters.checks).await
        }
        _ => peek(&shim.store, &keys, &counters.checks).await,
    }
    .map_err(redis_failure)?;
    let mut components = components(&shim.store, &keys, &counters.checks)
        .await
        .map_err(redis_failure)?;
    if components.iter().all(Vec::is_empty) {
        components.clear();
    }
    Ok(Json(ShowAnswer { results, components }).into_response())
}

/// Each algorithm keeps a counter in exactly one key (see the scripts' headers), so
/// deleting it is the whole reset; the client's next check starts from a full limit.
pub async fn reset(request: Admitted) -> Reply {
    counted(reset_counters(&request).await)
}

async fn reset_counters(request: &Admitted) -> Result<Response, Refusal> {
    let shim = &request.shim;
    let (counters, keys) = counters_asked(shim, &request.body)?;
    let before = peek(&shim.store, &keys, &counters.checks)
        .await
        .map_err(redis_failure)?;
    let mut deleted = Vec::with_capacity(keys.len());
    for key in &keys {
        deleted.push(shim.store.delete(key).await.map_err(redis_failure)?);
    }
    tracing::info!(keys = ?keys, "counters reset by an operator");
    Ok(Json(ResetAnswer { before, deleted }).into_response())
}

/// A counter key is `<rule>/<variant>:{<client hash>}`: the other variants of the same
/// rule and client share its rule and its hash tag, so they sit in its cluster slot.
pub async fn variants(request: Admitted) -> Reply {
    counted(list_variants(&request).await)
}

async fn list_variants(request: &Admitted) -> Result<Response, Refusal> {
    let shim = &request.shim;
    let (counters, keys) = counters_asked(shim, &request.body)?;
    let prefix = &shim.config.key_prefix;
    let mut variants = Vec::with_capacity(keys.len());
    for (check, key) in counters.checks.iter().zip(&keys) {
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
            Err(e) => return Err(redis_failure(e)),
        }
    }
    Ok(Json(VariantsAnswer { variants }).into_response())
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
