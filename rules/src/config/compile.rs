//! Compiling the filter-wide settings: the shim, the response, the local table, and
//! every rule (each compiled by [`rule`](super::rule)), with names unique.

use super::header_dialects;
use super::model::{
    CustomBody, FilterConfig, ResponseSettings, ShimSettings, DEFAULT_COST_BODY_BUDGET_BYTES,
    MAX_COST_BODY_BUDGET_BYTES, MIN_COST_BODY_BUDGET_BYTES,
};
use super::raw::{RawConfig, RawResponse};
use super::{parse_duration, ConfigError};
use crate::attributes::is_header_name;
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

/// Most rules one filter may hold: one check each, in one request to the shim.
pub const MAX_RULES: usize = crate::wire::MAX_CHECKS;
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_LOCAL_SLOTS: u32 = 8192;
/// Envoy keeps every slot for the life of the VM: bound it.
pub const MAX_LOCAL_SLOTS: u32 = 1 << 20;
const MAX_SHIM_CALLS_IN_FLIGHT: u32 = 64;

fn header_name(field: &str, name: Option<String>, default: &str) -> Result<String, ConfigError> {
    match name {
        None => Ok(default.to_string()),
        Some(name) if is_header_name(&name) => Ok(name.to_ascii_lowercase()),
        Some(name) => Err(ConfigError::new(field, format!("{name:?} is not a header name"))),
    }
}

impl RawResponse {
    fn compile(self, warnings: &mut Vec<String>) -> Result<ResponseSettings, ConfigError> {
        let status = self.status.unwrap_or(429);
        if !(400..=599).contains(&status) {
            return Err(ConfigError::new(
                "response.status",
                "must be an error status, 400..=599",
            ));
        }
        if let Some(content_type) = &self.content_type {
            // It becomes a header of every refusal: no line break may smuggle another.
            let header_value = content_type
                .bytes()
                .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic());
            if content_type.trim().is_empty() || !header_value {
                return Err(ConfigError::new(
                    "response.content_type",
                    "must be a header value: printable ASCII, no line breaks",
                ));
            }
        }
        let body = match (self.body, self.content_type) {
            (Some(template), content_type) => Some(CustomBody {
                content_type: content_type.unwrap_or_else(|| "text/plain".into()),
                template,
            }),
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    "response.content_type",
                    "only applies with a custom response.body",
                ))
            }
            (None, None) => None,
        };
        let names = self.header_names;
        let limit_header = header_name("response.header_names.limit", names.limit, "x-ratelimit-limit")?;
        let remaining_header = header_name(
            "response.header_names.remaining",
            names.remaining,
            "x-ratelimit-remaining",
        )?;
        let reset_header = header_name("response.header_names.reset", names.reset, "x-ratelimit-reset")?;
        let x_names = [
            limit_header.as_str(),
            remaining_header.as_str(),
            reset_header.as_str(),
        ];
        let dialects = header_dialects::compile(self.headers, x_names, warnings)?;
        let written_headers = header_dialects::written_headers(&dialects, x_names);
        Ok(ResponseSettings {
            status,
            dialects,
            written_headers,
            body,
        })
    }
}

impl RawConfig {
    pub(super) fn compile(self) -> Result<FilterConfig, ConfigError> {
        if self.shim_cluster.trim().is_empty() || self.shim_cluster.chars().any(char::is_control) {
            return Err(ConfigError::new(
                "shim_cluster",
                "must be a cluster name: not empty, no control characters",
            ));
        }
        if let Some(authority) = &self.shim_authority {
            if authority.is_empty() || !authority.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::new(
                    "shim_authority",
                    "must be a host[:port]: non-empty printable ASCII without spaces",
                ));
            }
        }
        let timeout = match &self.timeout {
            None => DEFAULT_TIMEOUT,
            Some(text) => parse_duration(text).map_err(|reason| ConfigError::new("timeout", reason))?,
        };
        if timeout.is_zero() || timeout > MAX_TIMEOUT {
            return Err(ConfigError::new("timeout", "must be between 1ms and 60s"));
        }
        if let Some(token) = &self.shim_token {
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::new(
                    "shim_token",
                    "must be non-empty printable ASCII",
                ));
            }
        }
        if !(1..=MAX_SHIM_CALLS_IN_FLIGHT).contains(&self.shim_calls_in_flight) {
            return Err(ConfigError::new(
                "shim_calls_in_flight",
                format!("must be between 1 and {MAX_SHIM_CALLS_IN_FLIGHT}"),
            ));
        }
        if self.xff_num_trusted_hops > 16 {
            return Err(ConfigError::new(
                "xff_num_trusted_hops",
                "at most 16 trusted proxy hops",
            ));
        }
        let jwt_payload_in_metadata = self
            .jwt_payload_in_metadata
            .unwrap_or_else(|| "jwt_payload".into());
        if jwt_payload_in_metadata.is_empty()
            || !jwt_payload_in_metadata.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ConfigError::new(
                "jwt_payload_in_metadata",
                "must be a non-empty metadata key",
            ));
        }
        let mut warnings = Vec::new();
        let response = self.response.compile(&mut warnings)?;
        // The drafts' `w` is whole seconds: a period of 250 ms would announce 1 s.
        let whole_seconds = header_dialects::announces_windows(&response.dialects);
        if self.rules.is_empty() {
            return Err(ConfigError::new("rules", "at least one rule is required"));
        }
        if self.rules.len() > MAX_RULES {
            return Err(ConfigError::new("rules", format!("at most {MAX_RULES} rules")));
        }
        let local_slots = self.local_slots.unwrap_or(DEFAULT_LOCAL_SLOTS);
        if !(1..=MAX_LOCAL_SLOTS).contains(&local_slots) {
            return Err(ConfigError::new(
                "local_slots",
                format!("must be between 1 and {MAX_LOCAL_SLOTS}"),
            ));
        }
        let cost_body_budget_bytes = match self.cost_body_budget_bytes {
            None => DEFAULT_COST_BODY_BUDGET_BYTES,
            Some(bytes) => usize::try_from(bytes)
                .ok()
                .filter(|bytes| (MIN_COST_BODY_BUDGET_BYTES..=MAX_COST_BODY_BUDGET_BYTES).contains(bytes))
                .ok_or_else(|| {
                    ConfigError::new(
                        "cost_body_budget_bytes",
                        format!("must be {MIN_COST_BODY_BUDGET_BYTES}..={MAX_COST_BODY_BUDGET_BYTES}"),
                    )
                })?,
        };
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(self.rules.len());
        for (index, raw) in self.rules.into_iter().enumerate() {
            let rule = raw.compile(
                &format!("rules[{index}]"),
                self.failure_mode,
                whole_seconds,
                &mut warnings,
            )?;
            if !names.insert(rule.name.clone()) {
                return Err(ConfigError::new(
                    format!("rules[{index}].name"),
                    format!("duplicate rule name {:?}", rule.name),
                ));
            }
            rules.push(Rc::new(rule));
        }
        Ok(FilterConfig {
            shim: ShimSettings {
                authority: self.shim_authority.unwrap_or_else(|| self.shim_cluster.clone()),
                cluster: self.shim_cluster,
                token: self.shim_token,
                timeout,
                calls_in_flight: self.shim_calls_in_flight,
            },
            xff_num_trusted_hops: self.xff_num_trusted_hops,
            jwt_payload_in_metadata,
            response,
            local_slots,
            deny_cache: self.deny_cache,
            cost_body_budget_bytes,
            rules,
            warnings,
        })
    }
}
