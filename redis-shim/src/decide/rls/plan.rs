//! One `ShouldRateLimit` request, without I/O: which limit each descriptor falls under
//! ([`plan`]: matching, `replaces`, `unlimited`, the request's own limit override and
//! hits) and the checks that go to Redis. A check refuses the request only when its
//! limit enforces: one in shadow or quota mode (its own, or the service's
//! [`Settings`]) is charged when it admits and never refuses by itself; the answer
//! ([`super::response`]) decides what quota mode refuses.

use super::config::{Limit, Rate, RlsConfig, Unit};
use super::counter_key::counter_key;
use super::matching::find;
use super::settings::Settings;
use super::shared::SharedCounter;
use crate::envoy_api::messages::protobuf::Struct;
use crate::envoy_api::messages::ratelimit::{RateLimit, RateLimitRequest, Unit as PbUnit};
use ratelimit_wire::{Algorithm, Check, MAX_LIMIT};
use std::collections::HashSet;
use std::sync::Arc;

/// What a request's descriptors come to.
#[derive(Debug)]
pub struct Plan {
    pub descriptors: Vec<Planned>,
    /// The checks for Redis, one per [`Planned::Counted`], all decided together.
    pub checks: Vec<Check>,
}

/// What one descriptor comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Planned {
    /// No configured limit matches: `OK`, no current limit.
    NoLimit,
    /// Its limit is `unlimited`: `OK`, remaining the largest value.
    Unlimited,
    /// Its limit is named in another matched limit's `replaces`: `OK`, not counted.
    Replaced,
    /// Counted by `checks[check]`.
    Counted { limit: Applied, check: usize },
    /// Its hits exceed its whole limit (or the limit is 0): over the limit without asking
    /// Redis, and nothing of the request is charged (`counter` is its counter, with a
    /// cost of the whole limit, for upstream counting to fill).
    Exceeds { limit: Applied, counter: Check },
}

/// The limit a descriptor is counted against.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub name: String,
    pub rate: Rate,
    /// The limit's own `shadow_mode`: its descriptor is answered `OK`.
    pub shadow_mode: bool,
    /// Its own `quota_mode`, or the service's.
    pub quota_mode: bool,
    /// Its descriptor's `metadata`.
    pub metadata: Option<Arc<Struct>>,
    /// Counted on a filter rule's counter instead of its own.
    pub shared: Option<SharedCounter>,
}

impl Applied {
    pub fn period_ms(&self) -> u64 {
        self.rate.unit.seconds() * 1000
    }

    pub fn current_limit(&self) -> RateLimit {
        RateLimit {
            name: self.name.clone(),
            requests_per_unit: self.rate.requests_per_unit,
            unit: pb_unit(self.rate.unit) as i32,
        }
    }
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn unit_of(unit: PbUnit) -> Option<Unit> {
    Some(match unit {
        PbUnit::Unknown => return None,
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
    })
}

/// What a descriptor matched before `replaces` is applied.
enum Matched<'a, 'e> {
    None,
    /// A configured limit, and the entries its counter is keyed by.
    Configured(&'a Limit, Vec<(&'e str, &'e str)>),
    /// The request's own `limit` (envoyproxy/ratelimit honours it in a known domain).
    Override(Rate),
}

/// Plans `request` against `config`; an error is the request's fault (INVALID_ARGUMENT).
pub fn plan(config: &RlsConfig, request: &RateLimitRequest, settings: &Settings) -> Result<Plan, String> {
    if request.domain.is_empty() {
        return Err("domain: must not be empty".into());
    }
    if request.descriptors.is_empty() {
        return Err("descriptors: at least one is required".into());
    }
    let known_domain = config.domains.contains_key(&request.domain);
    let mut matched = Vec::with_capacity(request.descriptors.len());
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.is_negative_hits {
            return Err(format!("descriptors[{i}].is_negative_hits: not supported"));
        }
        let entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()))
            .collect();
        matched.push(match &descriptor.limit {
            Some(limit) if known_domain => {
                let unit = PbUnit::try_from(limit.unit)
                    .ok()
                    .and_then(unit_of)
                    .ok_or_else(|| format!("descriptors[{i}].limit.unit: unknown unit {}", limit.unit))?;
                if u64::from(limit.requests_per_unit) > MAX_LIMIT {
                    return Err(format!(
                        "descriptors[{i}].limit.requests_per_unit: at most {MAX_LIMIT}"
                    ));
                }
                Matched::Override(Rate {
                    requests_per_unit: limit.requests_per_unit,
                    unit,
                    algorithm: Algorithm::FixedWindow,
                })
            }
            _ => match find(config, &request.domain, &entries) {
                Some(found) => Matched::Configured(found.limit, found.counted),
                None => Matched::None,
            },
        });
    }
    let replaced: HashSet<&str> = matched
        .iter()
        .filter_map(|m| match m {
            Matched::Configured(limit, _) => Some(limit.replaces.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    let mut plan = Plan {
        descriptors: Vec::with_capacity(matched.len()),
        checks: Vec::new(),
    };
    for (i, (descriptor, matched)) in request.descriptors.iter().zip(matched).enumerate() {
        let own_entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()))
            .collect();
        let (applied, entries) = match matched {
            Matched::None => {
                plan.descriptors.push(Planned::NoLimit);
                continue;
            }
            // The request's own limit is never in shadow or quota mode (as upstream).
            Matched::Override(rate) => (
                Applied {
                    name: String::new(),
                    rate,
                    shadow_mode: false,
                    quota_mode: settings.quota_mode,
                    metadata: None,
                    shared: None,
                },
                own_entries,
            ),
            Matched::Configured(limit, counted) => match limit.rate {
                None => {
                    plan.descriptors.push(Planned::Unlimited);
                    continue;
                }
                Some(_) if !limit.name.is_empty() && replaced.contains(limit.name.as_str()) => {
                    plan.descriptors.push(Planned::Replaced);
                    continue;
                }
                Some(rate) => (
                    Applied {
                        name: limit.name.clone(),
                        rate,
                        shadow_mode: limit.shadow_mode,
                        quota_mode: limit.quota_mode || settings.quota_mode,
                        metadata: limit.metadata.clone(),
                        shared: limit.shared.clone(),
                    },
                    counted,
                ),
            },
        };
        let hits = match &descriptor.hits_addend {
            Some(hits) if hits.value == 0 => {
                return Err(format!(
                    "descriptors[{i}].hits_addend: 0 (a check without a charge) is not supported"
                ))
            }
            Some(hits) => hits.value,
            None => u64::from(request.hits_addend.max(1)),
        };
        // A value the filter would not count (empty, or not an IP) keeps its own counter.
        let shared_key = applied
            .shared
            .as_ref()
            .zip(entries.last())
            .and_then(|(shared, (_, value))| shared.counter_key(value));
        let key = shared_key.unwrap_or_else(|| {
            counter_key(
                &request.domain,
                &entries,
                applied.rate.algorithm,
                applied.period_ms(),
            )
        });
        let limit = u64::from(applied.rate.requests_per_unit);
        let check = Check {
            key,
            algorithm: applied.rate.algorithm,
            limit,
            period_ms: applied.period_ms(),
            cost: hits.min(limit),
            shadow: applied.shadow_mode || applied.quota_mode || settings.shadow_mode,
            lease: 0,
            calendar: None,
            regions: Default::default(),
        };
        if hits > limit {
            plan.descriptors.push(Planned::Exceeds {
                limit: applied,
                counter: check,
            });
            continue;
        }
        plan.checks.push(check);
        plan.descriptors.push(Planned::Counted {
            limit: applied,
            check: plan.checks.len() - 1,
        });
    }
    Ok(plan)
}

impl Plan {
    /// Whether an enforcing descriptor is over its limit before Redis is asked: then
    /// nothing may be charged, and the checks are only peeked at.
    pub fn refused_beforehand(&self) -> bool {
        self.descriptors
            .iter()
            .any(|planned| matches!(planned, Planned::Exceeds { counter, .. } if !counter.shadow))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy_api::messages::protobuf::UInt64Value;
    use crate::envoy_api::messages::ratelimit::{
        Code, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitResponse,
    };
    use ratelimit_wire::CheckResult;

    fn plan(config: &RlsConfig, request: &RateLimitRequest) -> Result<Plan, String> {
        super::plan(config, request, &Settings::default())
    }

    fn answer(plan: &Plan, results: &[CheckResult], now_ms: u64) -> RateLimitResponse {
        let request = RateLimitRequest::default();
        super::super::response::answer(&request, plan, results, now_ms, &Settings::default())
    }

    fn config() -> RlsConfig {
        RlsConfig::from_yaml(
            r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: { unit: minute, requests_per_unit: 10, name: per-key, replaces: [{ name: global }] }
  - key: generic_key
    value: global
    rate_limit: { unit: hour, requests_per_unit: 100, name: global }
  - key: generic_key
    value: trial
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: internal
    rate_limit: { unlimited: true }
"#,
        )
    }

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    fn result(allowed: bool, remaining: u64, reset_ms: u64) -> CheckResult {
        CheckResult {
            allowed,
            remaining,
            reset_ms,
            ..Default::default()
        }
    }

    #[test]
    fn replaces_unlimited_and_no_match_are_answered_without_counting() {
        let config = config();
        let plan = plan(
            &config,
            &request(vec![
                descriptor(&[("api_key", "k1")]),
                descriptor(&[("generic_key", "global")]),
                descriptor(&[("internal", "x")]),
                descriptor(&[("unknown", "x")]),
            ]),
        )
        .unwrap();
        assert_eq!(plan.checks.len(), 1, "only the API key is counted");
        assert_eq!(plan.descriptors[1], Planned::Replaced);
        assert_eq!(plan.descriptors[2], Planned::Unlimited);
        assert_eq!(plan.descriptors[3], Planned::NoLimit);
        let check = &plan.checks[0];
        assert_eq!((check.limit, check.period_ms, check.cost), (10, 60_000, 1));
        assert_eq!(check.algorithm, Algorithm::FixedWindow);

        let response = answer(&plan, &[result(true, 9, 30_000)], 0);
        assert_eq!(response.overall_code, Code::Ok as i32);
        let counted = &response.statuses[0];
        assert_eq!(counted.limit_remaining, 9);
        assert_eq!(counted.current_limit.as_ref().unwrap().name, "per-key");
        assert_eq!(counted.duration_until_reset.unwrap().seconds, 30);
        assert_eq!(response.statuses[2].limit_remaining, u32::MAX);
        assert!(response.statuses[3].current_limit.is_none());
    }

    #[test]
    fn a_shadow_limit_never_refuses_and_an_enforcing_one_does() {
        let config = config();
        let plan = plan(
            &config,
            &request(vec![
                descriptor(&[("generic_key", "trial")]),
                descriptor(&[("api_key", "k1")]),
            ]),
        )
        .unwrap();
        assert!(plan.checks[0].shadow && !plan.checks[1].shadow);
        let response = answer(&plan, &[result(false, 0, 400), result(true, 3, 1_000)], 0);
        assert_eq!(response.statuses[0].code, Code::Ok as i32, "shadow");
        assert_eq!(response.overall_code, Code::Ok as i32);
        let response = answer(&plan, &[result(true, 0, 400), result(false, 0, 1_000)], 0);
        assert_eq!(response.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(response.statuses[1].limit_remaining, 0);
        assert_eq!(response.overall_code, Code::OverLimit as i32);
    }

    #[test]
    fn hits_overrides_and_what_no_counter_can_admit() {
        let config = config();
        let mut heavy = descriptor(&[("api_key", "k1")]);
        heavy.hits_addend = Some(UInt64Value { value: 4 });
        let mut request_hits = request(vec![heavy, descriptor(&[("generic_key", "global")])]);
        request_hits.hits_addend = 7;
        let planned = plan(&config, &request_hits).unwrap();
        assert_eq!(planned.checks[0].cost, 4, "the descriptor's own hits");
        // The API key replaces "global" here too; without it the request's hits count.
        let global_only = RateLimitRequest {
            hits_addend: 7,
            ..request(vec![descriptor(&[("generic_key", "global")])])
        };
        assert_eq!(plan(&config, &global_only).unwrap().checks[0].cost, 7);

        let mut too_heavy = descriptor(&[("api_key", "k1")]);
        too_heavy.hits_addend = Some(UInt64Value { value: 11 });
        let planned = plan(&config, &request(vec![too_heavy])).unwrap();
        assert!(planned.checks.is_empty() && planned.refused_beforehand());
        let response = answer(&planned, &[], 45_000);
        assert_eq!(response.overall_code, Code::OverLimit as i32);
        assert_eq!(response.statuses[0].duration_until_reset.unwrap().seconds, 15);

        let mut overridden = descriptor(&[("anything", "x")]);
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: PbUnit::Day as i32,
        });
        let planned = plan(&config, &request(vec![overridden])).unwrap();
        assert_eq!(
            (planned.checks[0].limit, planned.checks[0].period_ms),
            (5, 86_400_000)
        );

        let mut zero = descriptor(&[("api_key", "k1")]);
        zero.hits_addend = Some(UInt64Value { value: 0 });
        assert!(plan(&config, &request(vec![zero]))
            .unwrap_err()
            .contains("descriptors[0].hits_addend"));
        assert!(plan(&config, &request(vec![]))
            .unwrap_err()
            .contains("descriptors"));
        let mut negative = descriptor(&[("api_key", "k1")]);
        negative.is_negative_hits = true;
        assert!(plan(&config, &request(vec![negative]))
            .unwrap_err()
            .contains("is_negative_hits"));
    }

    #[test]
    fn a_shared_threshold_keys_every_matching_value_on_one_counter() {
        let config = RlsConfig::from_yaml(
            r#"
domain: edge
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: apart
    value: apart/*
    rate_limit: { unit: hour, requests_per_unit: 10 }
"#,
        );
        let key = |key: &str, value: &str| {
            plan(&config, &request(vec![descriptor(&[(key, value)])]))
                .unwrap()
                .checks[0]
                .key
                .clone()
        };
        assert_eq!(key("files", "files/a.pdf"), key("files", "files/b.csv"));
        assert_ne!(key("apart", "apart/a.pdf"), key("apart", "apart/b.csv"));
    }
}
