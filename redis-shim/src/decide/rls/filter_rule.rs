//! Mixed fleets: a descriptor's limit that shares its counter with a rule of the Wasm
//! filter (`rate_limit.filter_rule: <rule name>`, with the filter's plugin configuration
//! given by `--rls-filter-config`), so that while part of a fleet runs the native
//! rate-limit filter and part the Wasm filter, a client meets one limit, not one per path.
//!
//! A share is refused at start unless both sides would count alike: the rule keys on one
//! part (a header, or `client_ip`) that the descriptor's last entry supplies, with the
//! same algorithm, limit, period and shadow mode, one token per request, one global
//! counter (no tiers, no calendar), and no other value of that entry limited apart. The
//! counter key is then computed by the filter's own code ([`ratelimit_rules::keys`]) from
//! the entry's value, as the filter computes it for a request carrying that value.

use super::config::{self, Limit, RlsConfig};
use super::shared::{Position, SharedCounter};
use ratelimit_rules::config::{FilterConfig, Rule, Scope};
use ratelimit_rules::keys::KeyPart;
use ratelimit_wire::Algorithm;
use std::collections::HashMap;
use std::path::Path;

/// The descriptor entry Envoy's `remote_address` action writes: the client's IP.
pub const REMOTE_ADDRESS: &str = "remote_address";

/// `--rls-config` ([`config::load`]) with its `filter_rule`s linked to `filter`'s rules:
/// every error found, each naming its file (or the files together, for a rule shared
/// twice); a domain in several files merged when `merge_domains`.
pub fn load(
    path: &Path,
    filter: Option<&FilterConfig>,
    merge_domains: bool,
) -> Result<RlsConfig, Vec<String>> {
    let config = match filter {
        Some(filter) => config::load(
            path,
            &|rule, limit, position, at| share(filter, rule, limit, position, at),
            merge_domains,
        )?,
        None => config::load(path, &config::no_filter_config, merge_domains)?,
    };
    check_each_rule_shared_once(&config).map_err(|e| vec![e])?;
    Ok(config)
}

/// Adds one file to `config` ([`RlsConfig::add_file`]) with its `filter_rule`s linked to
/// `filter`'s rules.
pub fn add_file(config: &mut RlsConfig, text: &str, filter: &FilterConfig) -> Result<(), String> {
    config
        .add_file_sharing(text, &|rule, limit, position, at| {
            share(filter, rule, limit, position, at)
        })
        .map_err(|errors| errors.join("; "))
}

/// `--rls-filter-config`: the filter's plugin configuration, parsed and checked by the
/// filter's own code.
pub fn load_filter_config(path: &Path) -> Result<FilterConfig, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    FilterConfig::from_json(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Links `limit` (configured at `at`, its `rate_limit`) to the filter rule `rule_name`,
/// or says why the two would not count alike.
pub fn share(
    filter: &FilterConfig,
    rule_name: &str,
    limit: &Limit,
    position: &Position,
    at: &str,
) -> Result<SharedCounter, String> {
    let field = format!("{at}.filter_rule");
    let Some(rule) = filter.rules.iter().find(|rule| rule.name == rule_name) else {
        let names: Vec<&str> = filter.rules.iter().map(|rule| rule.name.as_str()).collect();
        return Err(format!(
            "{field}: no rule {rule_name:?} in --rls-filter-config (its rules: {names:?})"
        ));
    };
    let refuse = |reason: String| Err(format!("{field}: rule {rule_name:?} {reason}"));
    let Some(rate) = limit.rate else {
        return refuse("cannot be shared by an unlimited rate_limit".into());
    };
    let part = match rule.key.as_slice() {
        [part @ (KeyPart::Header(_) | KeyPart::ClientIp)] => part.clone(),
        _ => return refuse(
            "must be keyed on exactly one part, a header or client_ip, which the descriptor's entry supplies"
                .into(),
        ),
    };
    match (&part, position.key == REMOTE_ADDRESS) {
        (KeyPart::ClientIp, false) => {
            return refuse(format!(
                "is keyed on client_ip: only a `{REMOTE_ADDRESS}` descriptor (Envoy's remote_address action) supplies it, not {:?}",
                position.key
            ))
        }
        (KeyPart::Header(name), true) => {
            return refuse(format!(
                "is keyed on the header {name:?}, but a `{REMOTE_ADDRESS}` descriptor holds the client's IP"
            ))
        }
        _ => {}
    }
    if position.has_value || !position.above_all_valued {
        return Err(format!(
            "{field}: only a descriptor without a value, under descriptors that all have one, can share a rule's counter: its entry's value is the client the rule counts"
        ));
    }
    if let Some(reason) = counts_differently(rule) {
        return refuse(reason);
    }
    if rule.algorithm != rate.algorithm {
        let remedy = match rule.algorithm {
            Algorithm::FixedWindow | Algorithm::TokenBucket => {
                format!(
                    "set `algorithm: {}` to share its counter",
                    rule.algorithm.as_str()
                )
            }
            _ => "which no descriptor counts".to_string(),
        };
        return Err(format!(
            "{at}.algorithm: {} here, but rule {rule_name:?} is a {}: {remedy}",
            rate.algorithm.as_str(),
            rule.algorithm.as_str(),
        ));
    }
    if u64::from(rate.requests_per_unit) != rule.rate.limit() {
        return Err(format!(
            "{at}.requests_per_unit: {} here, but rule {rule_name:?} allows {}: they must be equal to share a counter",
            rate.requests_per_unit,
            rule.rate.limit()
        ));
    }
    if rate.unit.seconds() * 1000 != rule.rate.period_ms() {
        return Err(format!(
            "{at}.unit: {} s here, but rule {rule_name:?}'s period is {} ms: they must be equal to share a counter",
            rate.unit.seconds(),
            rule.rate.period_ms()
        ));
    }
    if limit.shadow_mode != rule.shadow {
        return refuse(format!(
            "has shadow {}, this descriptor shadow_mode {}: one path would refuse what the other only logs",
            rule.shadow, limit.shadow_mode
        ));
    }
    Ok(SharedCounter {
        rule: rule_name.to_string(),
        counter: rule.counter.clone(),
        part,
    })
}

/// What of the rule's own, beyond its rate, would count a request otherwise than a
/// descriptor does (one hit, on one global counter per client).
fn counts_differently(rule: &Rule) -> Option<String> {
    if rule.scope == Scope::Local {
        return Some("has scope local: it keeps no counter in Redis to share".into());
    }
    if !rule.tiers.is_empty() {
        return Some(
            "has tiers: the descriptor's one limit cannot follow a tier's other limit and counter".into(),
        );
    }
    if rule.calendar.is_some() {
        return Some("is a calendar quota: its windows are not the descriptor's unit windows".into());
    }
    if rule.cost != 1 || !rule.costs.is_empty() || rule.cost_from_response.is_some() {
        return Some(
            "charges a request other than 1 (cost, costs or cost_from_response), a descriptor 1 per hit"
                .into(),
        );
    }
    None
}

/// Refuses a rule shared by two limits: a request carrying both descriptors would be
/// charged twice on the one counter the filter charges once.
pub fn check_each_rule_shared_once(config: &RlsConfig) -> Result<(), String> {
    let mut sharing: HashMap<&str, &str> = HashMap::new();
    let mut limits = config.limits();
    limits.sort_by(|a, b| a.path.cmp(&b.path));
    for limit in limits {
        let Some(shared) = &limit.shared else { continue };
        if let Some(first) = sharing.insert(&shared.rule, &limit.path) {
            return Err(format!(
                "filter_rule: rule {:?} is shared by both {first} and {}; share a rule from one descriptor",
                shared.rule, limit.path
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::rls::plan::plan;
    use crate::envoy_api::messages::ratelimit::{Entry, RateLimitDescriptor, RateLimitRequest};
    use ratelimit_rules::attributes::GivenRequest;
    use ratelimit_wire::Check;

    /// The filter's plugin configuration: one rule per key part a descriptor supplies.
    fn filter() -> FilterConfig {
        FilterConfig::from_json(
            br#"{
                "shim_cluster": "shim",
                "xff_num_trusted_hops": 1,
                "rules": [
                    {"name": "per-key", "key": [{"header": "X-Api-Key"}], "limit": 5, "period": "1m"},
                    {"name": "per-ip", "key": ["client_ip"], "algorithm": "fixed_window", "limit": 10, "period": "1s",
                     "match": {"path_prefix": "/ip"}},
                    {"name": "tiered", "key": [{"header": "x-user"}], "limit": 5, "period": "1m",
                     "tiers": [{"name": "vip", "when": {"header": "x-user", "prefix": "vip"}, "limit": 50}]},
                    {"name": "pair", "key": [{"header": "x-user"}, "client_ip"], "limit": 5, "period": "1m"},
                    {"name": "costly", "key": [{"header": "x-user"}], "limit": 5, "period": "1m", "cost": 2},
                    {"name": "calendar", "key": [{"header": "x-user"}], "limit": 5, "calendar": "day"},
                    {"name": "local", "key": [{"header": "x-user"}], "limit": 5, "period": "1m", "scope": "local"},
                    {"name": "shadow", "key": [{"header": "x-user"}], "limit": 5, "period": "1m", "shadow": true},
                    {"name": "sliding", "key": [{"header": "x-user"}], "algorithm": "sliding_window_log", "limit": 5, "period": "1m"}
                ]
            }"#,
        )
        .unwrap()
    }

    const SHARED: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10, filter_rule: per-ip }
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket }
"#;

    fn load(yaml: &str) -> Result<RlsConfig, String> {
        let mut config = RlsConfig::default();
        add_file(&mut config, yaml, &filter())?;
        check_each_rule_shared_once(&config)?;
        Ok(config)
    }

    fn rls_check(config: &RlsConfig, key: &str, value: &str) -> Check {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: value.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let mut planned = plan(config, &request, &Default::default()).unwrap();
        assert_eq!(planned.checks.len(), 1);
        planned.checks.remove(0)
    }

    /// The check the filter itself plans for `request` under `rule`.
    fn filter_check(rule: &str, request: &GivenRequest) -> Check {
        let filter = filter();
        ratelimit_rules::plan::plan(&filter, request)
            .into_iter()
            .find(|planned| planned.rule.name == rule)
            .unwrap()
            .check
    }

    #[test]
    fn a_header_descriptor_is_the_filters_own_check_of_that_header() {
        let config = load(SHARED).unwrap();
        let request = GivenRequest {
            headers: vec![("x-api-key".into(), "alice".into()), (":path".into(), "/".into())],
            ..Default::default()
        };
        let filters = filter_check("per-key", &request);
        assert_eq!(rls_check(&config, "api_key", "alice"), filters);
        assert!(filters.key.starts_with("per-key/tb60000:{"), "{}", filters.key);
        assert_ne!(rls_check(&config, "api_key", "bob").key, filters.key);
    }

    #[test]
    fn an_address_descriptor_is_the_filters_own_check_of_that_client_ip() {
        let config = load(SHARED).unwrap();
        // The filter trusts one hop of X-Forwarded-For; Envoy's remote_address action
        // gives the address its connection manager resolved the same way.
        let via_proxy = GivenRequest {
            headers: vec![
                ("x-forwarded-for".into(), "6.6.6.6, 203.0.113.5".into()),
                (":path".into(), "/ip".into()),
            ],
            source_address: Some("10.0.0.9:443".into()),
            ..Default::default()
        };
        let filters = filter_check("per-ip", &via_proxy);
        assert_eq!(rls_check(&config, "remote_address", "203.0.113.5"), filters);
        let v6 = GivenRequest {
            headers: vec![(":path".into(), "/ip".into())],
            source_address: Some("[2001:db8::1]:80".into()),
            ..Default::default()
        };
        assert_eq!(
            rls_check(&config, "remote_address", "2001:db8::1"),
            filter_check("per-ip", &v6)
        );
    }

    #[test]
    fn a_value_the_filter_would_not_count_keeps_its_own_counter() {
        let config = load(SHARED).unwrap();
        for (key, value) in [("remote_address", "not-an-ip"), ("api_key", "")] {
            let check = rls_check(&config, key, value);
            assert!(check.key.starts_with("rls/"), "{key}={value:?}: {}", check.key);
        }
        // A limit naming no rule keeps its own counter too.
        assert!(rls_check(&config, "tenant", "t").key.starts_with("rls/tb60000:{"));
    }

    #[test]
    fn a_share_that_would_count_otherwise_is_refused_naming_the_field() {
        let one = |rate_limit: &str| {
            format!("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {rate_limit}\n")
        };
        let cases = [
            (one("{ unit: minute, requests_per_unit: 5, filter_rule: nope }"), "descriptors[0].rate_limit.filter_rule: no rule \"nope\""),
            (one("{ unlimited: true, filter_rule: per-key }"), "unlimited"),
            (one("{ unit: minute, requests_per_unit: 5, filter_rule: 7 }"), "filter_rule: must be a rule's name"),
            (one("{ unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: pair }"), "exactly one part"),
            (one("{ unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: tiered }"), "tiers"),
            (one("{ unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: costly }"), "charges a request other than 1"),
            (one("{ unit: day, requests_per_unit: 5, filter_rule: calendar }"), "is a calendar quota"),
            (one("{ unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: local }"), "scope local"),
            (one("{ unit: second, requests_per_unit: 10, filter_rule: per-ip }"), "only a `remote_address` descriptor"),
            (one("{ unit: minute, requests_per_unit: 5, filter_rule: per-key }"), "descriptors[0].rate_limit.algorithm: fixed_window here, but rule \"per-key\" is a token_bucket"),
            (one("{ unit: minute, requests_per_unit: 5, filter_rule: sliding }"), "is a sliding_window_log: which no descriptor counts"),
            (one("{ unit: minute, requests_per_unit: 6, algorithm: token_bucket, filter_rule: per-key }"), "descriptors[0].rate_limit.requests_per_unit: 6 here"),
            (one("{ unit: hour, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }"), "descriptors[0].rate_limit.unit"),
            (one("{ unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: shadow }"), "has shadow true, this descriptor shadow_mode false"),
            (
                "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n".into(),
                "holds the client's IP",
            ),
            (
                "domain: edge\ndescriptors:\n  - key: user\n    value: u1\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n".into(),
                "only a descriptor without a value",
            ),
            (
                "domain: edge\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: user\n        rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n".into(),
                "descriptors[0].descriptors[0].rate_limit.filter_rule: only a descriptor without a value, under descriptors that all have one",
            ),
            (
                "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n  - key: user\n    value: partner\n    rate_limit: { unit: minute, requests_per_unit: 500 }\n".into(),
                "descriptors[0].rate_limit.filter_rule: another descriptor counts a value of \"user\" apart",
            ),
            (
                "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n  - key: key2\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n".into(),
                "rule \"per-key\" is shared by both edge.key2 and edge.user",
            ),
        ];
        for (yaml, expected) in cases {
            let message = load(&yaml).unwrap_err();
            assert!(
                message.contains(expected),
                "{yaml}\n{message}\nshould name {expected}"
            );
        }
        // A value left unlimited beside it is allowed: the filter only narrows it.
        assert!(load("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n  - key: user\n    value: internal\n    rate_limit: { unlimited: true }\n").is_ok());
        // Under a descriptor with a value, the share is allowed: that value is a constant.
        assert!(load("domain: edge\ndescriptors:\n  - key: generic_key\n    value: api\n    descriptors:\n      - key: user\n        rate_limit: { unit: minute, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-key }\n").is_ok());
        let without_filter = RlsConfig::default().add_file(&one(
            "{ unit: minute, requests_per_unit: 5, filter_rule: per-key }",
        ));
        assert!(without_filter.unwrap_err().contains("needs --rls-filter-config"));
    }
}
