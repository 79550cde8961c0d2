//! The compiled configuration: what the request path reads, every value already checked.

use super::header_dialects::Form;
pub use super::header_dialects::HeaderDialect;
use super::on_exceeded::OnExceeded;
use crate::keys::KeyPart;
use crate::matching::RequestMatch;
use crate::wire::{Algorithm, CalendarWindow, Period, Rate, Regions};
use serde::Deserialize;
use std::rc::Rc;
use std::time::Duration;

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

/// Longest this Envoy refuses a counter from its deny cache before asking the shim again,
/// however far the refusal's retry time: a counter reset by an operator, or a limit
/// raised, reaches every Envoy within this time, for one shim check per refused key per
/// Envoy per interval.
pub const DENY_RECHECK_MS: u64 = 1_000;

/// The compiled configuration of one filter instance.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConfig {
    pub shim: ShimSettings,
    /// Proxies in front of Envoy whose X-Forwarded-For entries are trusted.
    pub xff_num_trusted_hops: u32,
    /// Key of the verified JWT payload in `jwt_authn`'s dynamic metadata.
    pub jwt_payload_in_metadata: String,
    pub response: ResponseSettings,
    /// Slots of the shared-data table holding local state (buckets, deny cache, leases).
    pub local_slots: u32,
    /// Refuse a key locally until the time the shim said it may retry.
    pub deny_cache: bool,
    /// Bytes a worker may hold to read costs from response bodies, for all its
    /// responses together; a response past it is charged as unreported.
    pub cost_body_budget_bytes: usize,
    /// Shared with each request's plan, which holds the rules it checks.
    pub rules: Vec<Rc<Rule>>,
    /// What loads but deserves the operator's attention, logged at configure.
    pub warnings: Vec<String>,
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

impl ShimSettings {
    pub fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

/// What refused and allowed responses look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSettings {
    /// Status of a refusal (429 unless configured).
    pub status: u32,
    /// Every dialect its headers are written in, none writing a header another writes.
    pub dialects: Vec<HeaderDialect>,
    /// Every header those dialects write (the `X-RateLimit-*` ones under their
    /// configured, lower-case names), with its form, once each, in order.
    pub written_headers: Vec<(String, Form)>,
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
    /// The limit for clients no tier selects. With a calendar, its period is the unit's
    /// longest window.
    pub rate: Rate,
    /// A fixed window aligned to the calendar (every tier's too), instead of to
    /// multiples of the period.
    pub calendar: Option<CalendarWindow>,
    /// The name of its counters at that rate ([`counter_name`](crate::keys::counter_name)).
    pub counter: String,
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
    pub local: Option<Rate>,
    /// Take tokens from the shim in leases and spend them locally.
    pub lease: Option<Lease>,
    /// What this rule does when the shim cannot answer.
    pub on_failure: RuleFailureMode,
    /// Where the response says what the request really cost: the admission charges the
    /// estimate (`cost`), the end of the response settles the difference.
    pub cost_from_response: Option<CostFromResponse>,
    /// Where its counter lives when the shim serves several regions (docs/REGIONS.md);
    /// its tiers' too.
    pub regions: Regions,
    /// What a request over the limit gets: the refusal, or a spill-over.
    pub on_exceeded: OnExceeded,
}

/// A rule's cost read from its responses, and what a response that never reports it
/// is charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostFromResponse {
    pub source: CostSource,
    pub unreported: UnreportedCost,
}

impl CostFromResponse {
    /// Whether the cost is read from the response body, by this filter or by Envoy's
    /// AI protocol manager: either needs it whole and uncompressed.
    pub fn reads_body(&self) -> bool {
        matches!(self.source, CostSource::Body(_) | CostSource::TokenUsage(_))
    }
}

/// Where a response reports its request's real cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSource {
    /// A response header (lower-case name).
    Header(String),
    /// A response trailer (lower-case name), for streamed responses.
    Trailer(String),
    /// Numbers in a JSON body or in the JSON events of an event stream, each times its
    /// weight, summed.
    Body(Vec<CostField>),
    /// Counts of the typed `envoy.data.ai.v3.TokenUsage` that Envoy's
    /// `ai_protocol_manager` publishes in the stream's dynamic metadata, each times its
    /// weight, summed: read when the stream ends.
    TokenUsage(TokenUsageCost),
}

/// Where Envoy publishes a response's token usage, and which of its counts are charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUsageCost {
    /// The metadata namespace (`ai_protocol_manager`'s `metadata_namespace`).
    pub namespace: String,
    /// Paths into `TokenUsage` (`input_tokens`, `input_token_details.cached_tokens`).
    pub fields: Vec<CostField>,
}

/// One number of a body's reported cost: its path (object fields, or array indexes in
/// decimal) and what each unit of it costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostField {
    pub path: Vec<String>,
    pub weight: u64,
}

/// What a response whose cost never arrived is charged (the client went away, the body
/// was compressed or cut short, the upstream reported nothing usable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnreportedCost {
    /// The admission's estimate stays charged.
    Estimate,
    /// This many tokens (settled from the estimate).
    Tokens(u64),
}

/// The worker-wide budget for reading costs from bodies, unless configured: a reader
/// holds a few hundred bytes, so thousands of responses at once.
pub const DEFAULT_COST_BODY_BUDGET_BYTES: usize = 1024 * 1024;
pub const MIN_COST_BODY_BUDGET_BYTES: usize = 1024;
pub const MAX_COST_BODY_BUDGET_BYTES: usize = 64 * 1024 * 1024;

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

/// Tokens taken from the shim `size` at a time, valid for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub size: u64,
    pub ttl: Period,
}

/// A rule's failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleFailureMode {
    Open,
    Closed,
    /// Degrade to a local token bucket of this rate.
    Local(Rate),
}

/// A limit for the clients a condition selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub name: String,
    pub when: TierCondition,
    pub rate: Rate,
    /// The name of the rule's counters at this tier's rate.
    pub counter: String,
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

#[cfg(any(test, feature = "test-support"))]
#[allow(clippy::unwrap_used)] // Test support only: built for tests, never into the filter.
impl Rule {
    /// A global token bucket of 5 per minute keyed on `key`, for the pure layers' tests.
    pub fn for_tests(name: &str, key: Vec<KeyPart>) -> Rule {
        Rule {
            name: name.into(),
            key,
            matcher: RequestMatch::default(),
            algorithm: Algorithm::TokenBucket,
            rate: Rate {
                limit: crate::wire::Limit::try_from(5u64).unwrap(),
                period: Period::try_from(60_000u64).unwrap(),
            },
            calendar: None,
            counter: crate::keys::counter_name(name, Algorithm::TokenBucket, 60_000),
            tiers: vec![],
            cost: 1,
            costs: vec![],
            shadow: false,
            scope: Scope::Global,
            local: None,
            lease: None,
            on_failure: RuleFailureMode::Open,
            cost_from_response: None,
            regions: Regions::Independent,
            on_exceeded: OnExceeded::Refuse,
        }
    }
}
