//! Plugin configuration: the JSON users write, checked and compiled once in
//! `on_configure` into the form the request path uses.
//!
//! Parsing happens in two steps: serde reads the raw structs (unknown fields refused),
//! then [`FilterConfig::from_json`] validates every value and reports the first problem
//! as a [`ConfigError`] naming the field, e.g. `rules[1].period: must be greater than
//! zero`. A config that compiles cannot hold an invalid rule.

use crate::keys::KeyPart;
use crate::wire::{Algorithm, MAX_LIMIT, MAX_PERIOD_MS};
use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

/// Longest rule name; names are part of every counter key.
pub const MAX_RULE_NAME_LEN: usize = 64;
/// Most rules one filter may hold.
pub const MAX_RULES: usize = crate::wire::MAX_CHECKS;
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

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

/// What the filter does when the shim cannot give an answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Let the request through (Envoy's own rate-limit filter's default).
    #[default]
    Open,
    /// Refuse the request with 503: protection over availability.
    Closed,
}

/// The compiled configuration of one filter instance.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConfig {
    pub shim: ShimSettings,
    pub failure_mode: FailureMode,
    pub rules: Vec<Rule>,
}

/// How the filter reaches the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShimSettings {
    /// Envoy cluster name passed to `dispatch_http_call`.
    pub cluster: String,
    /// `:authority` of the call.
    pub authority: String,
    /// Shared token sent in `x-ratelimit-token`, if the shim requires one.
    pub token: Option<String>,
    /// Longest the request stays paused waiting for the shim.
    pub timeout: Duration,
}

/// One compiled rule: who it counts (`key`) and how much it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub key: Vec<KeyPart>,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    pub cost: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    shim_cluster: String,
    #[serde(default)]
    shim_authority: Option<String>,
    #[serde(default)]
    shim_token: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    failure_mode: FailureMode,
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    key: Vec<KeyPart>,
    #[serde(default)]
    algorithm: Algorithm,
    limit: i64,
    period: String,
    #[serde(default)]
    cost: Option<i64>,
}

impl FilterConfig {
    /// Parses and validates the plugin configuration.
    pub fn from_json(bytes: &[u8]) -> Result<FilterConfig, ConfigError> {
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "config".to_string() } else { path };
            ConfigError::new(field, e.into_inner().to_string())
        })?;
        raw.compile()
    }
}

impl RawConfig {
    fn compile(self) -> Result<FilterConfig, ConfigError> {
        if self.shim_cluster.trim().is_empty() {
            return Err(ConfigError::new("shim_cluster", "must not be empty"));
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
        if self.rules.is_empty() {
            return Err(ConfigError::new("rules", "at least one rule is required"));
        }
        if self.rules.len() > MAX_RULES {
            return Err(ConfigError::new("rules", format!("at most {MAX_RULES} rules")));
        }
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(self.rules.len());
        for (index, raw) in self.rules.into_iter().enumerate() {
            let rule = raw.compile(index)?;
            if !names.insert(rule.name.clone()) {
                return Err(ConfigError::new(
                    format!("rules[{index}].name"),
                    format!("duplicate rule name {:?}", rule.name),
                ));
            }
            rules.push(rule);
        }
        Ok(FilterConfig {
            shim: ShimSettings {
                authority: self.shim_authority.unwrap_or_else(|| self.shim_cluster.clone()),
                cluster: self.shim_cluster,
                token: self.shim_token,
                timeout,
            },
            failure_mode: self.failure_mode,
            rules,
        })
    }
}

impl RawRule {
    fn compile(self, index: usize) -> Result<Rule, ConfigError> {
        let field = |name: &str| format!("rules[{index}].{name}");
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_RULE_NAME_LEN
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !name_ok {
            return Err(ConfigError::new(
                field("name"),
                format!("must be 1..={MAX_RULE_NAME_LEN} characters of A-Z a-z 0-9 - _ ."),
            ));
        }
        if self.key.is_empty() {
            return Err(ConfigError::new(field("key"), "must name at least one key part"));
        }
        let key = self
            .key
            .into_iter()
            .enumerate()
            .map(|(part_index, part)| {
                part.compile()
                    .map_err(|reason| ConfigError::new(format!("{}[{part_index}]", field("key")), reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.limit <= 0 || self.limit as u64 > MAX_LIMIT {
            return Err(ConfigError::new(
                field("limit"),
                format!("must be between 1 and {MAX_LIMIT}"),
            ));
        }
        let limit = self.limit as u64;
        let period =
            parse_duration(&self.period).map_err(|reason| ConfigError::new(field("period"), reason))?;
        let period_ms = period.as_millis() as u64;
        if period_ms == 0 || period_ms > MAX_PERIOD_MS {
            return Err(ConfigError::new(field("period"), "must be between 1ms and 366d"));
        }
        let cost = self.cost.unwrap_or(1);
        if cost <= 0 {
            return Err(ConfigError::new(field("cost"), "must be at least 1"));
        }
        if cost as u64 > limit {
            return Err(ConfigError::new(
                field("cost"),
                format!("{cost} exceeds the limit {limit}: no request could ever pass"),
            ));
        }
        Ok(Rule {
            name: self.name,
            key,
            algorithm: self.algorithm,
            limit,
            period_ms,
            cost: cost as u64,
        })
    }
}

/// Parses `"250ms"`, `"10s"`, `"1m"`, `"1h"` or `"1d"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let usage = || format!("{text:?} is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\" or \"1d\"");
    let amount: u64 = digits.parse().map_err(|_| usage())?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(usage()),
    };
    amount
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{
        "shim_cluster": "ratelimit_shim",
        "timeout": "250ms",
        "failure_mode": "closed",
        "rules": [
            {"name": "per-api-key", "key": [{"header": "X-Api-Key"}], "limit": 5, "period": "1m"},
            {"name": "per-ip", "key": ["client_ip"], "limit": 100, "period": "10s", "cost": 2}
        ]
    }"#;

    #[test]
    fn compiles_a_valid_config() {
        let config = FilterConfig::from_json(VALID.as_bytes()).unwrap();
        assert_eq!(config.shim.cluster, "ratelimit_shim");
        assert_eq!(config.shim.authority, "ratelimit_shim");
        assert_eq!(config.shim.timeout, Duration::from_millis(250));
        assert_eq!(config.failure_mode, FailureMode::Closed);
        assert_eq!(config.rules[0].key, vec![KeyPart::Header("x-api-key".into())]);
        assert_eq!(config.rules[0].period_ms, 60_000);
        assert_eq!(config.rules[0].cost, 1);
        assert_eq!(config.rules[1].key, vec![KeyPart::ClientIp]);
        assert_eq!(config.rules[1].cost, 2);
    }

    fn error_for(json: &str) -> ConfigError {
        FilterConfig::from_json(json.as_bytes()).expect_err(json)
    }

    fn with_rule(rule: &str) -> String {
        format!(r#"{{"shim_cluster": "c", "rules": [{rule}]}}"#)
    }

    #[test]
    fn each_bad_config_names_its_field() {
        let rule = |extra: &str| with_rule(&format!(r#"{{"name": "r", "key": ["client_ip"], {extra}}}"#));
        let cases = [
            ("not json".to_string(), "config"),
            (r#"{"rules": []}"#.to_string(), "config"),
            (
                r#"{"shim_cluster": "c", "rules": [], "colour": 1}"#.to_string(),
                "colour",
            ),
            (r#"{"shim_cluster": "", "rules": []}"#.to_string(), "shim_cluster"),
            (r#"{"shim_cluster": "c", "rules": []}"#.to_string(), "rules"),
            (
                r#"{"shim_cluster": "c", "timeout": "0ms", "rules": []}"#.to_string(),
                "timeout",
            ),
            (
                r#"{"shim_cluster": "c", "timeout": "fast", "rules": []}"#.to_string(),
                "timeout",
            ),
            (
                r#"{"shim_cluster": "c", "failure_mode": "maybe", "rules": []}"#.to_string(),
                "failure_mode",
            ),
            (rule(r#""limit": 5"#), "rules[0]"),
            (rule(r#""limit": 0, "period": "1s""#), "rules[0].limit"),
            (rule(r#""limit": -3, "period": "1s""#), "rules[0].limit"),
            (rule(r#""limit": 5, "period": "0s""#), "rules[0].period"),
            (rule(r#""limit": 5, "period": "-1s""#), "rules[0].period"),
            (rule(r#""limit": 5, "period": "1s", "cost": 6"#), "rules[0].cost"),
            (
                rule(r#""limit": 5, "period": "1s", "algorithm": "magic""#),
                "rules[0].algorithm",
            ),
            (rule(r#""limit": 5, "period": "1s", "burst": 3"#), "rules[0]"),
            (
                with_rule(r#"{"name": "bad name", "key": ["client_ip"], "limit": 1, "period": "1s"}"#),
                "rules[0].name",
            ),
            (
                with_rule(r#"{"name": "r", "key": [], "limit": 1, "period": "1s"}"#),
                "rules[0].key",
            ),
            (
                with_rule(r#"{"name": "r", "key": [{"header": ""}], "limit": 1, "period": "1s"}"#),
                "rules[0].key[0]",
            ),
            (
                with_rule(r#"{"name": "r", "key": ["shoe_size"], "limit": 1, "period": "1s"}"#),
                "rules[0].key[0]",
            ),
        ];
        for (json, field) in cases {
            let err = error_for(&json);
            assert!(
                err.field.starts_with(field),
                "{json}: got {err}, expected field {field}"
            );
        }
        let dup = format!(
            r#"{{"shim_cluster": "c", "rules": [{0}, {0}]}}"#,
            r#"{"name": "r", "key": ["client_ip"], "limit": 1, "period": "1s"}"#
        );
        assert_eq!(error_for(&dup).field, "rules[1].name");
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "10 parsecs",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
