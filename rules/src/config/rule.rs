//! Compiling one rule: its name, key, match, window (a period, or a calendar), rate,
//! tiers, costs, local bucket, lease, failure mode and regions, each checked against the
//! others (a cost must fit every limit the rule can apply, a lease must hold the largest
//! cost, a calendar quota is a global fixed window).

use super::model::{
    FailureMode, Lease, Rule, RuleFailureMode, Scope, Tier, TierCondition, ValueTest, WeightedCost,
};
use super::on_exceeded::compile_on_exceeded;
use super::raw::{RawCost, RawLease, RawLocalLimit, RawRule, RawRuleFailureMode, RawTier};
use super::regions::check_regions;
use super::window::{check_whole_seconds, compile_period, compile_window, window_counter_name, Window};
use super::ConfigError;
use crate::keys::KeyPart;
use crate::matching::{RawMatch, RequestMatch};
use crate::wire::{Algorithm, CalendarWindow, Limit, Period, Rate};

/// Longest rule name; names are part of every counter key.
pub const MAX_RULE_NAME_LEN: usize = 64;

fn is_rule_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RULE_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn check_name(field: String, name: &str) -> Result<(), ConfigError> {
    if !is_rule_name(name) {
        return Err(ConfigError::new(
            field,
            format!("must be 1..={MAX_RULE_NAME_LEN} characters of A-Z a-z 0-9 - _ ."),
        ));
    }
    Ok(())
}

fn compile_limit(field: String, limit: i64, algorithm: Algorithm) -> Result<Limit, ConfigError> {
    let value = u64::try_from(limit).unwrap_or(0);
    Limit::for_algorithm(value, algorithm).map_err(|bounds| ConfigError::new(field, bounds.0))
}

fn compile_match(field: &str, raw: RawMatch) -> Result<RequestMatch, ConfigError> {
    raw.compile()
        .map_err(|(inner, reason)| ConfigError::new(format!("{field}.{inner}"), reason))
}

/// A local bucket (in front of the shim, or as a failure fallback) that the largest
/// cost fits.
fn compile_local(field: String, raw: RawLocalLimit, largest_cost: u64) -> Result<Rate, ConfigError> {
    let limit = compile_limit(format!("{field}.limit"), raw.limit, Algorithm::TokenBucket)?;
    if largest_cost > limit.get() {
        return Err(ConfigError::new(
            format!("{field}.limit"),
            format!("{} is below the cost {largest_cost}", limit.get()),
        ));
    }
    Ok(Rate {
        limit,
        period: compile_period(format!("{field}.period"), &raw.period)?,
    })
}

/// What a concurrency rule cannot take: a slot is one request, held until it ends, so
/// costs, leases and local buckets (all counted in tokens over time) mean nothing there.
fn check_concurrency_rule(at: &str, raw: &RawRule) -> Result<(), ConfigError> {
    let refuse = |field: String, reason: &str| Err(ConfigError::new(field, reason));
    if raw.cost.is_some_and(|cost| cost != 1) {
        return refuse(
            format!("{at}.cost"),
            "a concurrency rule takes one slot per request: cost must be 1",
        );
    }
    if let Some(i) = raw.costs.iter().position(|weighted| weighted.cost != 1) {
        return refuse(
            format!("{at}.costs[{i}].cost"),
            "a concurrency rule takes one slot per request: cost must be 1",
        );
    }
    if raw.lease.is_some() {
        return refuse(
            format!("{at}.lease"),
            "a concurrency rule takes no lease: each slot is held by one request",
        );
    }
    if raw.local.is_some() {
        return refuse(
            format!("{at}.local"),
            "a concurrency rule takes no local bucket (a bucket counts a rate); use scope \"local\" for a per-Envoy limit",
        );
    }
    if raw.fallback.is_some() || raw.failure_mode == Some(RawRuleFailureMode::Local) {
        return refuse(
            format!("{at}.failure_mode"),
            "a concurrency rule fails open or closed: a local fallback bucket counts a rate, not requests in flight",
        );
    }
    if let Some(i) = raw.tiers.iter().position(|tier| tier.period.is_some()) {
        return refuse(
            format!("{at}.tiers[{i}].period"),
            "a concurrency tier sets only its limit (slots last the rule's max_duration)",
        );
    }
    Ok(())
}

/// The rule's default cost and its route-dependent costs, each of which must fit the
/// smallest limit the rule can apply, or some client could never pass.
fn compile_costs(
    at: &str,
    cost: Option<i64>,
    raw_costs: Vec<RawCost>,
    smallest_limit: u64,
) -> Result<(u64, Vec<WeightedCost>), ConfigError> {
    let check_cost = |field: String, cost: i64| -> Result<u64, ConfigError> {
        let Ok(cost) = u64::try_from(cost) else {
            return Err(ConfigError::new(field, "must be at least 1"));
        };
        if cost == 0 {
            return Err(ConfigError::new(field, "must be at least 1"));
        }
        if cost > smallest_limit {
            return Err(ConfigError::new(
                field,
                format!("{cost} exceeds the limit {smallest_limit}: no request could ever pass"),
            ));
        }
        Ok(cost)
    };
    let cost = check_cost(format!("{at}.cost"), cost.unwrap_or(1))?;
    let costs = raw_costs
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            Ok(WeightedCost {
                matcher: compile_match(&format!("{at}.costs[{i}].match"), raw.matcher)?,
                cost: check_cost(format!("{at}.costs[{i}].cost"), raw.cost)?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok((cost, costs))
}

fn compile_lease(
    at: &str,
    raw: RawLease,
    largest_cost: u64,
    smallest_limit: u64,
) -> Result<Lease, ConfigError> {
    let size = u64::try_from(raw.size).unwrap_or(0);
    if size < largest_cost || size > smallest_limit {
        return Err(ConfigError::new(
            format!("{at}.lease.size"),
            format!("must be between the largest cost {largest_cost} and the limit {smallest_limit}"),
        ));
    }
    Ok(Lease {
        size,
        ttl: compile_period(format!("{at}.lease.ttl"), &raw.ttl)?,
    })
}

fn compile_failure_mode(
    at: &str,
    mode: Option<RawRuleFailureMode>,
    fallback: Option<RawLocalLimit>,
    default_mode: FailureMode,
    largest_cost: u64,
) -> Result<RuleFailureMode, ConfigError> {
    Ok(match (mode, fallback) {
        (Some(RawRuleFailureMode::Local), Some(raw)) => {
            RuleFailureMode::Local(compile_local(format!("{at}.fallback"), raw, largest_cost)?)
        }
        (Some(RawRuleFailureMode::Local), None) => {
            return Err(ConfigError::new(
                format!("{at}.fallback"),
                "failure_mode \"local\" needs a fallback limit",
            ))
        }
        (_, Some(_)) => {
            return Err(ConfigError::new(
                format!("{at}.fallback"),
                "only applies with failure_mode \"local\"",
            ))
        }
        (Some(RawRuleFailureMode::Open), None) => RuleFailureMode::Open,
        (Some(RawRuleFailureMode::Closed), None) => RuleFailureMode::Closed,
        (None, None) => match default_mode {
            FailureMode::Open => RuleFailureMode::Open,
            FailureMode::Closed => RuleFailureMode::Closed,
        },
    })
}

impl RawRule {
    pub(super) fn compile(
        self,
        at: &str,
        default_failure_mode: FailureMode,
        whole_seconds: bool,
        warnings: &mut Vec<String>,
    ) -> Result<Rule, ConfigError> {
        let field = |name: &str| format!("{at}.{name}");
        check_name(field("name"), &self.name)?;
        if self.key.is_empty() {
            return Err(ConfigError::new(field("key"), "must name at least one key part"));
        }
        let concurrency = self.algorithm.is_some_and(|a| a.traits().counts_in_flight);
        if concurrency {
            check_concurrency_rule(at, &self)?;
        }
        let key = self
            .key
            .into_iter()
            .enumerate()
            .map(|(i, part)| {
                part.compile()
                    .map_err(|(within, reason)| ConfigError::new(format!("{at}.key[{i}]{within}"), reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let matcher = compile_match(&field("match"), self.matcher)?;
        let Window {
            algorithm,
            period,
            calendar,
        } = compile_window(
            at,
            self.algorithm,
            self.period.as_deref(),
            self.max_duration.as_deref(),
            self.calendar,
            self.utc_offset.as_deref(),
        )?;
        check_regions(
            at,
            self.regions,
            algorithm,
            self.scope,
            self.lease.is_some(),
            self.cost_from_response.is_some(),
        )?;
        let rate = Rate {
            limit: compile_limit(field("limit"), self.limit, algorithm)?,
            period,
        };
        // A concurrency policy announces no window `w`.
        check_whole_seconds(field("period"), rate.period, whole_seconds && !concurrency)?;
        let tiers = self
            .tiers
            .into_iter()
            .enumerate()
            .map(|(i, raw)| {
                let at = format!("{at}.tiers[{i}]");
                let tier = raw.compile(&at, &self.name, algorithm, rate.period, calendar)?;
                check_whole_seconds(
                    format!("{at}.period"),
                    tier.rate.period,
                    whole_seconds && !concurrency,
                )?;
                Ok(tier)
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let smallest_limit = tiers.iter().map(|t| t.rate.limit()).fold(rate.limit(), u64::min);
        let (cost, costs) = compile_costs(at, self.cost, self.costs, smallest_limit)?;
        let largest_cost = costs.iter().map(|c| c.cost).fold(cost, u64::max);
        if self.scope == Scope::Local && calendar.is_some() {
            return Err(ConfigError::new(
                field("scope"),
                "a local rule is a per-Envoy token bucket that starts afresh with Envoy: a calendar quota is counted by the shim",
            ));
        }
        if self.scope == Scope::Local && (self.local.is_some() || self.lease.is_some()) {
            return Err(ConfigError::new(
                field("scope"),
                "a local rule is its own local bucket: it takes no `local` nor `lease`",
            ));
        }
        if self.scope == Scope::Local && !algorithm.traits().runs_locally {
            return Err(ConfigError::new(
                field("algorithm"),
                "a local rule is a token bucket or a concurrency limit",
            ));
        }
        let local = self
            .local
            .map(|raw| compile_local(field("local"), raw, largest_cost))
            .transpose()?;
        let lease = self
            .lease
            .map(|raw| compile_lease(at, raw, largest_cost, smallest_limit))
            .transpose()?;
        let on_failure = compile_failure_mode(
            at,
            self.failure_mode,
            self.fallback,
            default_failure_mode,
            largest_cost,
        )?;
        let cost_from_response = self
            .cost_from_response
            .map(|raw| raw.compile(at, algorithm, self.scope, lease.is_some(), warnings))
            .transpose()?;
        let on_exceeded = compile_on_exceeded(at, self.on_exceeded, self.shadow)?;
        Ok(Rule {
            counter: window_counter_name(&self.name, algorithm, rate.period, calendar),
            name: self.name,
            key,
            matcher,
            algorithm,
            rate,
            calendar,
            tiers,
            cost,
            costs,
            shadow: self.shadow,
            scope: self.scope,
            local,
            lease,
            on_failure,
            cost_from_response,
            regions: self.regions,
            on_exceeded,
        })
    }
}

impl RawTier {
    fn compile(
        self,
        at: &str,
        rule_name: &str,
        algorithm: Algorithm,
        rule_period: Period,
        calendar: Option<CalendarWindow>,
    ) -> Result<Tier, ConfigError> {
        check_name(format!("{at}.name"), &self.name)?;
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
            .map_err(|(_, reason)| ConfigError::new(format!("{at}.when"), reason))?;
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
        if calendar.is_some() && self.period.is_some() {
            return Err(ConfigError::new(
                format!("{at}.period"),
                "a tier of a calendar rule keeps the rule's calendar",
            ));
        }
        let period = match &self.period {
            Some(period) => compile_period(format!("{at}.period"), period)?,
            None => rule_period,
        };
        // Window counters are aligned to the period: a tier with another period would
        // read the client's counter as a different window and count from zero.
        if algorithm.traits().aligned_windows && period != rule_period {
            return Err(ConfigError::new(
                format!("{at}.period"),
                format!("a {} tier keeps the rule's period", algorithm.as_str()),
            ));
        }
        Ok(Tier {
            name: self.name,
            when: TierCondition { source, test },
            counter: window_counter_name(rule_name, algorithm, period, calendar),
            rate: Rate {
                limit: compile_limit(format!("{at}.limit"), self.limit, algorithm)?,
                period,
            },
        })
    }
}
