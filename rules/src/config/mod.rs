//! Plugin configuration: the JSON users write, checked and compiled once in
//! `on_configure` into the form the request path uses.
//!
//! Two steps: serde reads the raw structs ([`raw`], unknown fields refused), then
//! [`FilterConfig::from_json`] validates every value ([`compile`] for the filter-wide
//! settings, [`rule`] for rules and their tiers) and reports the first problem as a
//! [`ConfigError`] naming the field, e.g. `rules[1].period: must be between 1ms and
//! 366d`. Limits and periods become checked [`Rate`](crate::wire::Rate)s, so a config
//! that compiles cannot hold an invalid rule. The compiled form is in [`model`].

mod compile;
mod cost_from_response;
mod duration;
mod header_dialects;
mod model;
mod on_exceeded;
mod raw;
mod regions;
mod rule;
#[cfg(test)]
mod tests;
mod window;

pub use cost_from_response::{parse_cost, MAX_PATHS};
pub use duration::parse_duration;
pub use header_dialects::{
    written_headers, Form, POLICY_HEADER, RATELIMIT_HEADER, RETRY_AFTER_HEADER, RETRY_AFTER_MS_HEADER,
};
pub use model::*;
pub use on_exceeded::{OnExceeded, SpillHeader};
use std::fmt;

/// A configuration problem, naming the field (as a JSON path) and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl FilterConfig {
    /// Parses and validates the plugin configuration.
    pub fn from_json(bytes: &[u8]) -> Result<FilterConfig, ConfigError> {
        // serde reads a struct from an array too (fields by position): only objects are
        // configurations, and rules.
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| ConfigError::new("config", format!("not one JSON document: {e}")))?;
        if !value.is_object() {
            return Err(ConfigError::new("config", "must be a JSON object"));
        }
        if let Some(rules) = value.get("rules").and_then(|rules| rules.as_array()) {
            if let Some(index) = rules.iter().position(|rule| !rule.is_object()) {
                return Err(ConfigError::new(
                    format!("rules[{index}]"),
                    "must be a JSON object",
                ));
            }
        }
        let raw: raw::RawConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "config".to_string() } else { path };
            ConfigError::new(field, e.into_inner().to_string())
        })?;
        raw.compile()
    }
}
