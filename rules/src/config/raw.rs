//! The configuration as users write it: serde structs that refuse unknown fields, with
//! their defaults. [`compile`](super::compile) turns them into the [`model`](super::model).

use super::header_dialects::RawHeaders;
use super::model::{FailureMode, Scope};
use crate::keys::KeyPart;
use crate::matching::RawMatch;
use crate::wire::{Algorithm, CalendarUnit, Regions};
use serde::Deserialize;

const DEFAULT_SHIM_CALLS_IN_FLIGHT: u32 = 4;

fn default_shim_calls_in_flight() -> u32 {
    DEFAULT_SHIM_CALLS_IN_FLIGHT
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) shim_cluster: String,
    #[serde(default)]
    pub(super) shim_authority: Option<String>,
    #[serde(default)]
    pub(super) shim_token: Option<String>,
    #[serde(default)]
    pub(super) timeout: Option<String>,
    #[serde(default = "default_shim_calls_in_flight")]
    pub(super) shim_calls_in_flight: u32,
    #[serde(default)]
    pub(super) failure_mode: FailureMode,
    #[serde(default)]
    pub(super) xff_num_trusted_hops: u32,
    #[serde(default)]
    pub(super) jwt_payload_in_metadata: Option<String>,
    #[serde(default)]
    pub(super) response: RawResponse,
    #[serde(default)]
    pub(super) local_slots: Option<u32>,
    #[serde(default = "enabled")]
    pub(super) deny_cache: bool,
    #[serde(default)]
    pub(super) cost_body_budget_bytes: Option<i64>,
    pub(super) rules: Vec<RawRule>,
}

fn enabled() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResponse {
    #[serde(default)]
    pub(super) status: Option<u32>,
    #[serde(default)]
    pub(super) headers: RawHeaders,
    #[serde(default)]
    pub(super) header_names: RawHeaderNames,
    #[serde(default)]
    pub(super) body: Option<String>,
    #[serde(default)]
    pub(super) content_type: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaderNames {
    #[serde(default)]
    pub(super) limit: Option<String>,
    #[serde(default)]
    pub(super) remaining: Option<String>,
    #[serde(default)]
    pub(super) reset: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: String,
    pub(super) key: Vec<KeyPart>,
    #[serde(default, rename = "match")]
    pub(super) matcher: RawMatch,
    /// None: a token bucket, or with `calendar` a fixed window.
    #[serde(default)]
    pub(super) algorithm: Option<Algorithm>,
    pub(super) limit: i64,
    /// Either `period` or `calendar` (with an optional `utc_offset`); a concurrency rule
    /// takes `max_duration` instead.
    #[serde(default)]
    pub(super) period: Option<String>,
    #[serde(default)]
    pub(super) calendar: Option<CalendarUnit>,
    #[serde(default)]
    pub(super) utc_offset: Option<String>,
    /// How long a concurrency slot whose release was lost stays taken.
    #[serde(default)]
    pub(super) max_duration: Option<String>,
    #[serde(default)]
    pub(super) tiers: Vec<RawTier>,
    #[serde(default)]
    pub(super) cost: Option<i64>,
    #[serde(default)]
    pub(super) costs: Vec<RawCost>,
    #[serde(default)]
    pub(super) shadow: bool,
    #[serde(default)]
    pub(super) scope: Scope,
    #[serde(default)]
    pub(super) local: Option<RawLocalLimit>,
    #[serde(default)]
    pub(super) lease: Option<RawLease>,
    #[serde(default)]
    pub(super) failure_mode: Option<RawRuleFailureMode>,
    #[serde(default)]
    pub(super) fallback: Option<RawLocalLimit>,
    #[serde(default)]
    pub(super) cost_from_response: Option<RawCostFromResponse>,
    #[serde(default)]
    pub(super) regions: Regions,
    /// Read by hand (`on_exceeded`), for messages that name the field.
    #[serde(default)]
    pub(super) on_exceeded: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCostFromResponse {
    #[serde(default)]
    pub(super) header: Option<String>,
    #[serde(default)]
    pub(super) trailer: Option<String>,
    #[serde(default)]
    pub(super) json_field: Option<String>,
    #[serde(default)]
    pub(super) json_fields: Option<Vec<RawCostField>>,
    #[serde(default)]
    pub(super) token_usage: Option<RawTokenUsage>,
    /// Accepted from older configurations; nothing of a body is kept any more.
    #[serde(default)]
    pub(super) max_body_bytes: Option<i64>,
    #[serde(default)]
    pub(super) unreported_cost: Option<RawUnreportedCost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTokenUsage {
    pub(super) fields: Vec<RawCostField>,
    #[serde(default)]
    pub(super) namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCostField {
    pub(super) path: String,
    #[serde(default)]
    pub(super) weight: Option<i64>,
}

/// `"estimate"` or a number of tokens.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawUnreportedCost {
    Tokens(i64),
    Named(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLocalLimit {
    pub(super) limit: i64,
    pub(super) period: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    pub(super) size: i64,
    pub(super) ttl: String,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawRuleFailureMode {
    Open,
    Closed,
    Local,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTier {
    pub(super) name: String,
    pub(super) when: RawTierCondition,
    pub(super) limit: i64,
    #[serde(default)]
    pub(super) period: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTierCondition {
    #[serde(default)]
    pub(super) header: Option<String>,
    #[serde(default)]
    pub(super) jwt_claim: Option<String>,
    #[serde(default)]
    pub(super) equals: Option<String>,
    #[serde(default)]
    pub(super) prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCost {
    #[serde(rename = "match")]
    pub(super) matcher: RawMatch,
    pub(super) cost: i64,
}
