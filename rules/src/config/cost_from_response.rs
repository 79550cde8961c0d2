//! Compiling a rule's `cost_from_response`: where the response reports the real cost (a
//! header, a trailer, weighted numbers in a JSON or event-stream body, or weighted
//! counts of the token usage Envoy publishes) and what a response that never reports it
//! is charged (`unreported_cost`).

use super::model::{CostField, CostFromResponse, CostSource, Scope, TokenUsageCost, UnreportedCost};
use super::raw::{RawCostField, RawCostFromResponse, RawTokenUsage, RawUnreportedCost};
use super::ConfigError;
use crate::wire::{Algorithm, MAX_LIMIT};

/// Most paths one rule reads from a body (the body scanner follows each with a bit of a
/// mask).
pub const MAX_PATHS: usize = 16;
/// Deepest path of a reported cost.
const MAX_PATH_DEPTH: usize = 8;
/// Longest segment of a path (a field name).
const MAX_SEGMENT_LEN: usize = 64;
/// Most one unit of a field may cost.
const MAX_WEIGHT: u64 = 1_000_000;
/// Where `ai_protocol_manager` publishes token usage unless told otherwise.
pub const TOKEN_USAGE_NAMESPACE: &str = "envoy.ai.token_usage";
/// The counts of `envoy.data.ai.v3.TokenUsage` (Envoy 1.40), every one a `UInt64Value`.
const TOKEN_USAGE_COUNTS: [&str; 8] = [
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "provider_total_tokens",
    "input_token_details.cached_tokens",
    "input_token_details.cache_creation_tokens",
    "input_token_details.tool_use_tokens",
    "output_token_details.reasoning_tokens",
];

impl RawCostFromResponse {
    /// For an algorithm that can settle it: one that keeps a count (a sliding window log
    /// keeps one entry per token), through the shim (a local rule and a lease spend
    /// tokens this Envoy holds).
    pub(super) fn compile(
        self,
        at: &str,
        algorithm: Algorithm,
        scope: Scope,
        has_lease: bool,
        warnings: &mut Vec<String>,
    ) -> Result<CostFromResponse, ConfigError> {
        let field = format!("{at}.cost_from_response");
        if !algorithm.traits().settles {
            return Err(ConfigError::new(
                format!("{at}.algorithm"),
                format!(
                    "a {} cannot be settled from the response (one entry per token, or a slot per request): use token_bucket, fixed_window or sliding_window_counter",
                    algorithm.as_str()
                ),
            ));
        }
        if scope == Scope::Local {
            return Err(ConfigError::new(
                format!("{at}.scope"),
                "a cost from the response is settled through the shim: the rule must be global",
            ));
        }
        if has_lease {
            return Err(ConfigError::new(
                format!("{at}.lease"),
                "leased tokens are spent without the shim: a rule with cost_from_response takes no lease",
            ));
        }
        let reads_body = self.json_field.is_some() || self.json_fields.is_some();
        if let Some(bytes) = self.max_body_bytes {
            if !reads_body {
                return Err(ConfigError::new(
                    format!("{field}.max_body_bytes"),
                    "only applies with json_field",
                ));
            }
            warnings.push(format!(
                "{field}.max_body_bytes ({bytes}) has no effect: the body is read as it streams and nothing of it is kept; remove it"
            ));
        }
        let source = match (
            self.header,
            self.trailer,
            self.json_field,
            self.json_fields,
            self.token_usage,
        ) {
            (Some(header), None, None, None, None) => {
                CostSource::Header(compile_field_name(format!("{field}.header"), &header)?)
            }
            (None, Some(trailer), None, None, None) => {
                CostSource::Trailer(compile_field_name(format!("{field}.trailer"), &trailer)?)
            }
            (None, None, Some(path), None, None) => CostSource::Body(vec![CostField {
                path: compile_path(&format!("{field}.json_field"), &path)?,
                weight: 1,
            }]),
            (None, None, None, Some(fields), None) => {
                CostSource::Body(compile_fields(&format!("{field}.json_fields"), fields)?)
            }
            (None, None, None, None, Some(usage)) => {
                CostSource::TokenUsage(compile_token_usage(&format!("{field}.token_usage"), usage)?)
            }
            _ => {
                return Err(ConfigError::new(
                    field,
                    "give exactly one of header, trailer, json_field, json_fields or token_usage",
                ))
            }
        };
        let unreported = match self.unreported_cost {
            None => {
                warnings.push(format!(
                    "{field}.unreported_cost is not set: a response whose cost never arrives (a client that aborts, a body cut short) is charged only the estimate; set it to the most a response may cost"
                ));
                UnreportedCost::Estimate
            }
            Some(RawUnreportedCost::Named(name)) if name == "estimate" => UnreportedCost::Estimate,
            Some(RawUnreportedCost::Tokens(tokens)) => u64::try_from(tokens)
                .ok()
                .filter(|tokens| *tokens <= MAX_LIMIT)
                .map(UnreportedCost::Tokens)
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("{field}.unreported_cost"),
                        format!("must be \"estimate\" or 0..={MAX_LIMIT} tokens"),
                    )
                })?,
            Some(RawUnreportedCost::Named(_)) => {
                return Err(ConfigError::new(
                    format!("{field}.unreported_cost"),
                    format!("must be \"estimate\" or 0..={MAX_LIMIT} tokens"),
                ))
            }
        };
        Ok(CostFromResponse { source, unreported })
    }
}

/// A token usage source: its namespace, and counts of `TokenUsage` that exist.
fn compile_token_usage(field: &str, raw: RawTokenUsage) -> Result<TokenUsageCost, ConfigError> {
    let namespace = raw.namespace.unwrap_or_else(|| TOKEN_USAGE_NAMESPACE.to_string());
    let valid =
        !namespace.is_empty() && namespace.len() <= 128 && namespace.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(ConfigError::new(
            format!("{field}.namespace"),
            "must be a metadata namespace: 1..=128 printable characters, no spaces",
        ));
    }
    let fields = compile_fields(&format!("{field}.fields"), raw.fields)?;
    for (index, cost_field) in fields.iter().enumerate() {
        let path = cost_field.path.join(".");
        if !TOKEN_USAGE_COUNTS.contains(&path.as_str()) {
            return Err(ConfigError::new(
                format!("{field}.fields[{index}].path"),
                format!(
                    "{path:?} is not a count of Envoy's TokenUsage: one of {}",
                    TOKEN_USAGE_COUNTS.join(", ")
                ),
            ));
        }
    }
    Ok(TokenUsageCost { namespace, fields })
}

/// Weighted paths, `field` naming the list.
fn compile_fields(field: &str, raw: Vec<RawCostField>) -> Result<Vec<CostField>, ConfigError> {
    if raw.is_empty() || raw.len() > MAX_PATHS {
        return Err(ConfigError::new(
            field,
            format!("must list 1..={MAX_PATHS} fields"),
        ));
    }
    let mut fields: Vec<CostField> = Vec::with_capacity(raw.len());
    for (index, raw) in raw.into_iter().enumerate() {
        let at = format!("{field}[{index}]");
        let path = compile_path(&format!("{at}.path"), &raw.path)?;
        if fields.iter().any(|other| other.path == path) {
            return Err(ConfigError::new(
                format!("{at}.path"),
                format!("{:?} is listed twice", raw.path),
            ));
        }
        let weight = match raw.weight {
            None => 1,
            Some(weight) => u64::try_from(weight)
                .ok()
                .filter(|weight| (1..=MAX_WEIGHT).contains(weight))
                .ok_or_else(|| {
                    ConfigError::new(format!("{at}.weight"), format!("must be 1..={MAX_WEIGHT}"))
                })?,
        };
        fields.push(CostField { path, weight });
    }
    Ok(fields)
}

/// A header or trailer name as Envoy stores it: lower-case token characters.
fn compile_field_name(field: String, name: &str) -> Result<String, ConfigError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !valid {
        return Err(ConfigError::new(
            field,
            "must be a header name (token characters, no ':')",
        ));
    }
    Ok(name.to_ascii_lowercase())
}

/// A dot-separated path: object fields, and array indexes written in decimal.
fn compile_path(field: &str, text: &str) -> Result<Vec<String>, ConfigError> {
    let path: Vec<String> = text.split('.').map(str::to_string).collect();
    let valid = path.len() <= MAX_PATH_DEPTH
        && path.iter().all(|segment| {
            !segment.is_empty()
                && segment.len() <= MAX_SEGMENT_LEN
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        });
    if !valid {
        return Err(ConfigError::new(
            field,
            format!(
                "must be 1..={MAX_PATH_DEPTH} field names or array indexes joined by '.', e.g. usage.total_tokens or choices.0.usage.total_tokens (each at most {MAX_SEGMENT_LEN} characters, no spaces, quotes or backslashes)"
            ),
        ));
    }
    Ok(path)
}

/// A reported cost: a decimal integer, capped at the largest limit (a counter's debt
/// is bounded again by the shim).
pub fn parse_cost(text: &str) -> Option<u64> {
    let digits = text.trim();
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        digits
            .parse::<u64>()
            .map_or(MAX_LIMIT, |cost| cost.min(MAX_LIMIT)),
    )
}
