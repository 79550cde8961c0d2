//! Plugin configuration: the JSON users write, checked and compiled once in
//! `on_configure` into the form the request path uses.
//!
//! Parsing happens in two steps: serde reads the raw structs (unknown fields refused),
//! then [`FilterConfig::from_json`] validates every value and reports the first problem
//! as a [`ConfigError`] naming the field, e.g. `rules[1].period: must be greater than
//! zero`. A config that compiles cannot hold an invalid rule.

use crate::keys::KeyPart;
use crate::matching::{is_header_name, RawMatch, RequestMatch};
use crate::wire::{Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, MAX_PERIOD_MS};
use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

/// Longest rule name; names are part of every counter key.
pub const MAX_RULE_NAME_LEN: usize = 64;
/// Most rules one filter may hold.
pub const MAX_RULES: usize = crate::wire::MAX_CHECKS;
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_LOCAL_SLOTS: u32 = 8192;
/// Envoy keeps every slot for the life of the VM: bound it.
pub const MAX_LOCAL_SLOTS: u32 = 1 << 20;
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SHIM_CALLS_IN_FLIGHT: u32 = 4;
const MAX_SHIM_CALLS_IN_FLIGHT: u32 = 64;

fn default_shim_calls_in_flight() -> u32 {
    DEFAULT_SHIM_CALLS_IN_FLIGHT
}

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

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (a Unix time) for the tightest rule.
    #[default]
    #[serde(rename = "x-ratelimit")]
    XRateLimit,
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit-Policy` and `RateLimit`, one
    /// list item per rule.
    #[serde(rename = "ietf-draft")]
    IetfDraft,
    /// Both of the above.
    #[serde(rename = "both")]
    Both,
    /// No rate-limit headers (`Retry-After` is still sent on refusals).
    #[serde(rename = "none")]
    None,
}

/// The compiled configuration of one filter instance.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConfig {
    pub shim: ShimSettings,
    pub failure_mode: FailureMode,
    /// Proxies in front of Envoy whose X-Forwarded-For entries are trusted.
    pub xff_num_trusted_hops: u32,
    /// Key of the verified JWT payload in `jwt_authn`'s dynamic metadata.
    pub jwt_payload_in_metadata: String,
    pub response: ResponseSettings,
    /// Slots of the shared-data table holding local state (buckets, deny cache, leases).
    pub local_slots: u32,
    /// Refuse a key locally until the time the shim said it may retry.
    pub deny_cache: bool,
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
    /// Most calls to the shim one worker keeps in flight; requests arriving past it wait
    /// for a call to finish and then go together in one batch.
    pub calls_in_flight: u32,
}

/// What refused and allowed responses look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSettings {
    /// Status of a refusal (429 unless configured).
    pub status: u32,
    pub header_style: HeaderStyle,
    /// Lower-case names of the `X-RateLimit-*` style headers.
    pub limit_header: String,
    pub remaining_header: String,
    pub reset_header: String,
    /// A custom refusal body replacing the RFC 9457 problem document.
    pub body: Option<CustomBody>,
}

/// A configured refusal body: `{rule}`, `{limit}` and `{retry_after}` are filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomBody {
    pub content_type: String,
    pub template: String,
}

/// One compiled rule: which requests it applies to, who it counts, how much it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub key: Vec<KeyPart>,
    pub matcher: RequestMatch,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    /// Client-dependent limits; the first tier whose condition holds wins.
    pub tiers: Vec<Tier>,
    pub cost: u64,
    /// Route-dependent costs; the first that matches wins, else `cost`.
    pub costs: Vec<WeightedCost>,
    /// Counts and logs, never refuses.
    pub shadow: bool,
    /// Where the rule's own limit is enforced.
    pub scope: Scope,
    /// A per-Envoy bucket in front of the global check: requests over it are refused
    /// without a shim call.
    pub local: Option<LocalLimit>,
    /// Take tokens from the shim in leases and spend them locally.
    pub lease: Option<Lease>,
    /// What this rule does when the shim cannot answer.
    pub on_failure: RuleFailureMode,
}

/// Where a rule's limit is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// By the shim, across every Envoy sharing its Redis.
    #[default]
    Global,
    /// In this Envoy's shared data only, shared by its worker threads; no shim call.
    Local,
}

/// A token bucket kept in Envoy shared data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLimit {
    pub limit: u64,
    pub period_ms: u64,
}

/// Tokens taken from the shim `size` at a time, valid for `ttl_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub size: u64,
    pub ttl_ms: u64,
}

/// A rule's failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleFailureMode {
    Open,
    Closed,
    /// Degrade to a local bucket with this limit.
    Local(LocalLimit),
}

/// A limit for the clients a condition selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub name: String,
    pub when: TierCondition,
    pub limit: u64,
    pub period_ms: u64,
}

/// Selects a tier from a header or a verified JWT claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierCondition {
    pub source: KeyPart,
    pub test: ValueTest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueTest {
    Equals(String),
    Prefix(String),
}

/// Charges `cost` tokens to requests that `matcher` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedCost {
    pub matcher: RequestMatch,
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
    #[serde(default = "default_shim_calls_in_flight")]
    shim_calls_in_flight: u32,
    #[serde(default)]
    failure_mode: FailureMode,
    #[serde(default)]
    xff_num_trusted_hops: u32,
    #[serde(default)]
    jwt_payload_in_metadata: Option<String>,
    #[serde(default)]
    response: RawResponse,
    #[serde(default)]
    local_slots: Option<u32>,
    #[serde(default = "enabled")]
    deny_cache: bool,
    rules: Vec<RawRule>,
}

fn enabled() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawResponse {
    #[serde(default)]
    status: Option<u32>,
    #[serde(default)]
    headers: HeaderStyle,
    #[serde(default)]
    header_names: RawHeaderNames,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHeaderNames {
    #[serde(default)]
    limit: Option<String>,
    #[serde(default)]
    remaining: Option<String>,
    #[serde(default)]
    reset: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    key: Vec<KeyPart>,
    #[serde(default, rename = "match")]
    matcher: RawMatch,
    #[serde(default)]
    algorithm: Algorithm,
    limit: i64,
    period: String,
    #[serde(default)]
    tiers: Vec<RawTier>,
    #[serde(default)]
    cost: Option<i64>,
    #[serde(default)]
    costs: Vec<RawCost>,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    scope: Scope,
    #[serde(default)]
    local: Option<RawLocalLimit>,
    #[serde(default)]
    lease: Option<RawLease>,
    #[serde(default)]
    failure_mode: Option<RawRuleFailureMode>,
    #[serde(default)]
    fallback: Option<RawLocalLimit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLocalLimit {
    limit: i64,
    period: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    size: i64,
    ttl: String,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum RawRuleFailureMode {
    Open,
    Closed,
    Local,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    name: String,
    when: RawTierCondition,
    limit: i64,
    #[serde(default)]
    period: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTierCondition {
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    jwt_claim: Option<String>,
    #[serde(default)]
    equals: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCost {
    #[serde(rename = "match")]
    matcher: RawMatch,
    cost: i64,
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

fn header_name(field: &str, name: Option<String>, default: &str) -> Result<String, ConfigError> {
    match name {
        None => Ok(default.to_string()),
        Some(name) if is_header_name(&name) => Ok(name.to_ascii_lowercase()),
        Some(name) => Err(ConfigError::new(field, format!("{name:?} is not a header name"))),
    }
}

impl RawResponse {
    fn compile(self) -> Result<ResponseSettings, ConfigError> {
        let status = self.status.unwrap_or(429);
        if !(400..=599).contains(&status) {
            return Err(ConfigError::new(
                "response.status",
                "must be an error status, 400..=599",
            ));
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
        Ok(ResponseSettings {
            status,
            header_style: self.headers,
            limit_header: header_name("response.header_names.limit", names.limit, "x-ratelimit-limit")?,
            remaining_header: header_name(
                "response.header_names.remaining",
                names.remaining,
                "x-ratelimit-remaining",
            )?,
            reset_header: header_name("response.header_names.reset", names.reset, "x-ratelimit-reset")?,
            body,
        })
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
        let response = self.response.compile()?;
        // The draft's `w` is whole seconds: a period of 250 ms would announce 1 s.
        let whole_seconds = matches!(response.header_style, HeaderStyle::IetfDraft | HeaderStyle::Both);
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
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(self.rules.len());
        for (index, raw) in self.rules.into_iter().enumerate() {
            let rule = raw.compile(&format!("rules[{index}]"), self.failure_mode, whole_seconds)?;
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
                calls_in_flight: self.shim_calls_in_flight,
            },
            failure_mode: self.failure_mode,
            xff_num_trusted_hops: self.xff_num_trusted_hops,
            jwt_payload_in_metadata,
            response,
            local_slots,
            deny_cache: self.deny_cache,
            rules,
        })
    }
}

fn is_rule_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RULE_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn compile_limit(field: String, limit: i64, algorithm: Algorithm) -> Result<u64, ConfigError> {
    let max = if algorithm == Algorithm::SlidingWindowLog {
        MAX_LOG_LIMIT
    } else {
        MAX_LIMIT
    };
    if limit <= 0 || limit as u64 > max {
        return Err(ConfigError::new(field, format!("must be between 1 and {max}")));
    }
    Ok(limit as u64)
}

fn compile_period(field: String, period: &str) -> Result<u64, ConfigError> {
    let period = parse_duration(period).map_err(|reason| ConfigError::new(field.clone(), reason))?;
    let period_ms = period.as_millis() as u64;
    if period_ms == 0 || period_ms > MAX_PERIOD_MS {
        return Err(ConfigError::new(field, "must be between 1ms and 366d"));
    }
    Ok(period_ms)
}

fn compile_match(field: &str, raw: RawMatch) -> Result<RequestMatch, ConfigError> {
    raw.compile()
        .map_err(|(inner, reason)| ConfigError::new(format!("{field}.{inner}"), reason))
}

fn compile_local(field: String, raw: RawLocalLimit, cost: u64) -> Result<LocalLimit, ConfigError> {
    let limit = compile_limit(format!("{field}.limit"), raw.limit, Algorithm::TokenBucket)?;
    if cost > limit {
        return Err(ConfigError::new(
            format!("{field}.limit"),
            format!("{limit} is below the cost {cost}"),
        ));
    }
    Ok(LocalLimit {
        limit,
        period_ms: compile_period(format!("{field}.period"), &raw.period)?,
    })
}

impl RawRule {
    fn compile(
        self,
        at: &str,
        default_failure_mode: FailureMode,
        whole_seconds: bool,
    ) -> Result<Rule, ConfigError> {
        let field = |name: &str| format!("{at}.{name}");
        if !is_rule_name(&self.name) {
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
            .map(|(i, part)| {
                part.compile()
                    .map_err(|reason| ConfigError::new(format!("{at}.key[{i}]"), reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let matcher = compile_match(&field("match"), self.matcher)?;
        let limit = compile_limit(field("limit"), self.limit, self.algorithm)?;
        let period_ms = compile_period(field("period"), &self.period)?;
        let check_whole = |field: String, period_ms: u64| {
            if whole_seconds && !period_ms.is_multiple_of(1000) {
                return Err(ConfigError::new(
                    field,
                    "must be whole seconds with ietf-draft headers (their window `w` is in seconds)",
                ));
            }
            Ok(())
        };
        check_whole(field("period"), period_ms)?;

        let mut tiers = Vec::with_capacity(self.tiers.len());
        for (i, raw) in self.tiers.into_iter().enumerate() {
            let tier = raw.compile(&format!("{at}.tiers[{i}]"), self.algorithm, period_ms)?;
            check_whole(format!("{at}.tiers[{i}].period"), tier.period_ms)?;
            tiers.push(tier);
        }
        // A cost must fit every limit the rule can apply, or some client could never pass.
        let smallest_limit = tiers
            .iter()
            .map(|t| t.limit)
            .chain([limit])
            .min()
            .unwrap_or(limit);
        let check_cost = |field: String, cost: i64| -> Result<u64, ConfigError> {
            if cost <= 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
            if cost as u64 > smallest_limit {
                return Err(ConfigError::new(
                    field,
                    format!("{cost} exceeds the limit {smallest_limit}: no request could ever pass"),
                ));
            }
            Ok(cost as u64)
        };
        let cost = check_cost(field("cost"), self.cost.unwrap_or(1))?;
        let mut costs = Vec::with_capacity(self.costs.len());
        for (i, raw) in self.costs.into_iter().enumerate() {
            costs.push(WeightedCost {
                matcher: compile_match(&format!("{at}.costs[{i}].match"), raw.matcher)?,
                cost: check_cost(format!("{at}.costs[{i}].cost"), raw.cost)?,
            });
        }
        let largest_cost = costs.iter().map(|c| c.cost).chain([cost]).max().unwrap_or(cost);
        if self.scope == Scope::Local && (self.local.is_some() || self.lease.is_some()) {
            return Err(ConfigError::new(
                field("scope"),
                "a local rule is its own local bucket: it takes no `local` nor `lease`",
            ));
        }
        if self.scope == Scope::Local && self.algorithm != Algorithm::TokenBucket {
            return Err(ConfigError::new(
                field("algorithm"),
                "a local rule is a token bucket",
            ));
        }
        let local = self
            .local
            .map(|raw| compile_local(field("local"), raw, largest_cost))
            .transpose()?;
        let lease = match self.lease {
            None => None,
            Some(raw) => {
                if raw.size < largest_cost as i64 || raw.size as u64 > smallest_limit {
                    return Err(ConfigError::new(
                        format!("{at}.lease.size"),
                        format!(
                            "must be between the largest cost {largest_cost} and the limit {smallest_limit}"
                        ),
                    ));
                }
                let ttl_ms = compile_period(format!("{at}.lease.ttl"), &raw.ttl)?;
                Some(Lease {
                    size: raw.size as u64,
                    ttl_ms,
                })
            }
        };
        let on_failure = match (self.failure_mode, self.fallback) {
            (Some(RawRuleFailureMode::Local), Some(raw)) => {
                RuleFailureMode::Local(compile_local(field("fallback"), raw, largest_cost)?)
            }
            (Some(RawRuleFailureMode::Local), None) => {
                return Err(ConfigError::new(
                    field("fallback"),
                    "failure_mode \"local\" needs a fallback limit",
                ))
            }
            (_, Some(_)) => {
                return Err(ConfigError::new(
                    field("fallback"),
                    "only applies with failure_mode \"local\"",
                ))
            }
            (Some(RawRuleFailureMode::Open), None) => RuleFailureMode::Open,
            (Some(RawRuleFailureMode::Closed), None) => RuleFailureMode::Closed,
            (None, None) => match default_failure_mode {
                FailureMode::Open => RuleFailureMode::Open,
                FailureMode::Closed => RuleFailureMode::Closed,
            },
        };
        Ok(Rule {
            name: self.name,
            key,
            matcher,
            algorithm: self.algorithm,
            limit,
            period_ms,
            tiers,
            cost,
            costs,
            shadow: self.shadow,
            scope: self.scope,
            local,
            lease,
            on_failure,
        })
    }
}

impl RawTier {
    fn compile(self, at: &str, algorithm: Algorithm, rule_period_ms: u64) -> Result<Tier, ConfigError> {
        if !is_rule_name(&self.name) {
            return Err(ConfigError::new(
                format!("{at}.name"),
                "must be 1..=64 characters of A-Z a-z 0-9 - _ .",
            ));
        }
        let when = self.when;
        let source = match (when.header, when.jwt_claim) {
            (Some(header), None) => KeyPart::Header(header),
            (None, Some(claim)) => KeyPart::JwtClaim(claim),
            _ => {
                return Err(ConfigError::new(
                    format!("{at}.when"),
                    "give exactly one of header or jwt_claim",
                ))
            }
        };
        let source = source
            .compile()
            .map_err(|reason| ConfigError::new(format!("{at}.when"), reason))?;
        let test = match (when.equals, when.prefix) {
            (Some(value), None) => ValueTest::Equals(value),
            (None, Some(prefix)) if !prefix.is_empty() => ValueTest::Prefix(prefix),
            _ => {
                return Err(ConfigError::new(
                    format!("{at}.when"),
                    "give exactly one of equals or a non-empty prefix",
                ))
            }
        };
        let period_ms = match &self.period {
            Some(period) => compile_period(format!("{at}.period"), period)?,
            None => rule_period_ms,
        };
        // Window counters are aligned to the period: a tier with another period would
        // read the client's counter as a different window and count from zero.
        let windowed = matches!(
            algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
        );
        if windowed && period_ms != rule_period_ms {
            return Err(ConfigError::new(
                format!("{at}.period"),
                format!("a {} tier keeps the rule's period", algorithm.as_str()),
            ));
        }
        Ok(Tier {
            name: self.name,
            when: TierCondition { source, test },
            limit: compile_limit(format!("{at}.limit"), self.limit, algorithm)?,
            period_ms,
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
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const VALID: &str = r#"{
        "shim_cluster": "ratelimit_shim",
        "timeout": "250ms",
        "failure_mode": "closed",
        "xff_num_trusted_hops": 1,
        "response": {"headers": "both", "status": 420, "header_names": {"limit": "X-Quota"}},
        "rules": [
            {"name": "per-api-key", "key": [{"header": "X-Api-Key"}], "limit": 5, "period": "1m",
             "tiers": [{"name": "vip", "when": {"header": "x-api-key", "prefix": "vip:"}, "limit": 50}],
             "costs": [{"match": {"path_prefix": "/export"}, "cost": 5}]},
            {"name": "search", "match": {"path_prefix": "/search", "methods": ["GET"]}, "key": ["client_ip"],
             "algorithm": "sliding_window_log", "limit": 100, "period": "10s", "cost": 2, "shadow": true}
        ]
    }"#;

    #[test]
    fn compiles_a_valid_config() {
        let config = FilterConfig::from_json(VALID.as_bytes()).unwrap();
        assert_eq!(config.shim.cluster, "ratelimit_shim");
        assert_eq!(config.shim.authority, "ratelimit_shim");
        assert_eq!(config.shim.timeout, Duration::from_millis(250));
        assert_eq!(config.shim.calls_in_flight, 4);
        assert_eq!(config.failure_mode, FailureMode::Closed);
        assert_eq!(config.xff_num_trusted_hops, 1);
        assert_eq!(config.jwt_payload_in_metadata, "jwt_payload");
        assert_eq!(config.response.status, 420);
        assert_eq!(config.response.header_style, HeaderStyle::Both);
        assert_eq!(config.response.limit_header, "x-quota");
        assert_eq!(config.response.remaining_header, "x-ratelimit-remaining");
        let (key_rule, search) = (&config.rules[0], &config.rules[1]);
        assert_eq!(key_rule.key, vec![KeyPart::Header("x-api-key".into())]);
        assert_eq!(key_rule.period_ms, 60_000);
        assert_eq!(key_rule.cost, 1);
        assert_eq!(key_rule.tiers[0].limit, 50);
        assert_eq!(key_rule.tiers[0].period_ms, 60_000);
        assert_eq!(key_rule.tiers[0].when.test, ValueTest::Prefix("vip:".into()));
        assert_eq!(key_rule.costs[0].cost, 5);
        assert!(!key_rule.shadow);
        assert_eq!(search.key, vec![KeyPart::ClientIp]);
        assert_eq!(search.algorithm, Algorithm::SlidingWindowLog);
        assert_eq!(search.cost, 2);
        assert!(search.shadow);
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
        let valid = r#""limit": 5, "period": "1s""#;
        let cases = [
            ("not json".to_string(), "config"),
            (r#"{"rules": []}"#.to_string(), "config"),
            (
                r#"{"shim_cluster": "c", "rules": [], "colour": 1}"#.to_string(),
                "colour",
            ),
            (r#"{"shim_cluster": "", "rules": []}"#.to_string(), "shim_cluster"),
            (
                r#"{"shim_cluster": "c", "shim_calls_in_flight": 0, "rules": []}"#.to_string(),
                "shim_calls_in_flight",
            ),
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
            (
                r#"{"shim_cluster": "c", "xff_num_trusted_hops": -1, "rules": []}"#.to_string(),
                "xff_num_trusted_hops",
            ),
            (
                r#"{"shim_cluster": "c", "response": {"status": 200}, "rules": []}"#.to_string(),
                "response.status",
            ),
            (
                r#"{"shim_cluster": "c", "response": {"headers": "fancy"}, "rules": []}"#.to_string(),
                "response.headers",
            ),
            (
                r#"{"shim_cluster": "c", "response": {"header_names": {"limit": "a b"}}, "rules": []}"#
                    .to_string(),
                "response.header_names.limit",
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
            (
                rule(r#""limit": 20000, "period": "1s", "algorithm": "sliding_window_log""#),
                "rules[0].limit",
            ),
            (rule(r#""limit": 5, "period": "1s", "burst": 3"#), "rules[0]"),
            (
                rule(&format!(r#"{valid}, "match": {{"path": "search"}}"#)),
                "rules[0].match.path",
            ),
            (
                rule(&format!(r#"{valid}, "match": {{"methods": ["G T"]}}"#)),
                "rules[0].match.methods[0]",
            ),
            (
                rule(&format!(r#"{valid}, "costs": [{{"match": {{}}, "cost": 9}}]"#)),
                "rules[0].costs[0].cost",
            ),
            (
                rule(&format!(
                    r#"{valid}, "costs": [{{"match": {{"path_prefix": "x"}}, "cost": 1}}]"#
                )),
                "rules[0].costs[0].match",
            ),
            (
                rule(&format!(
                    r#"{valid}, "tiers": [{{"name": "t", "when": {{"header": "x", "equals": "y"}}, "limit": 0}}]"#
                )),
                "rules[0].tiers[0].limit",
            ),
            (
                rule(&format!(
                    r#"{valid}, "tiers": [{{"name": "t", "when": {{"equals": "y"}}, "limit": 1}}]"#
                )),
                "rules[0].tiers[0].when",
            ),
            (
                rule(&format!(
                    r#"{valid}, "tiers": [{{"name": "t", "when": {{"header": "x"}}, "limit": 1}}]"#
                )),
                "rules[0].tiers[0].when",
            ),
            (
                rule(
                    r#""limit": 5, "period": "1s", "cost": 3, "tiers": [{"name": "t", "when": {"header": "x", "equals": "y"}, "limit": 2}]"#,
                ),
                "rules[0].cost",
            ),
            (
                r#"{"shim_cluster": "c", "response": {"headers": "ietf-draft"}, "rules": [{"name": "r", "key": ["client_ip"], "limit": 5, "period": "250ms"}]}"#.to_string(),
                "rules[0].period",
            ),
            (
                rule(r#""limit": 5, "period": "1m", "algorithm": "fixed_window", "tiers": [{"name": "t", "when": {"header": "x", "equals": "y"}, "limit": 9, "period": "10s"}]"#),
                "rules[0].tiers[0].period",
            ),
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
                with_rule(r#"{"name": "r", "key": [{"jwt_claim": "a b"}], "limit": 1, "period": "1s"}"#),
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
