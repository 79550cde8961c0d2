//! Which rules apply to a request and what each asks of the shim: the rule matches, the
//! request has every key part, the client's tier sets the limit, the route sets the cost.

use crate::attributes::RequestAttributes;
use crate::config::{FilterConfig, Rule, Tier, ValueTest};
use crate::keys::{counter_key, part_value};
use crate::wire::{Check, Rate};
use std::rc::Rc;

/// One rule's check for this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCheck {
    /// Index into `FilterConfig::rules`, which names the rule's stats.
    pub rule_index: usize,
    pub rule: Rc<Rule>,
    /// The rule's rate for this client (its tier's, if one applies).
    pub rate: Rate,
    /// What the shim is asked (`lease` 0: the local layer sets it).
    pub check: Check,
}

/// The checks this request needs, in rule order; empty when no rule applies.
pub fn plan(config: &FilterConfig, request: &impl RequestAttributes) -> Vec<PlannedCheck> {
    let hops = config.xff_num_trusted_hops;
    config
        .rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule.matcher.matches(request))
        .filter_map(|(rule_index, rule)| {
            let (rate, counter) = match tier_for(rule, request, hops) {
                Some(tier) => (tier.rate, &tier.counter),
                None => (rule.rate, &rule.counter),
            };
            let key = counter_key(counter, &rule.key, request, hops)?;
            let cost = rule
                .costs
                .iter()
                .find(|c| c.matcher.matches(request))
                .map_or(rule.cost, |c| c.cost);
            Some(PlannedCheck {
                rule_index,
                rule: Rc::clone(rule),
                rate,
                check: Check {
                    key,
                    algorithm: rule.algorithm,
                    limit: rate.limit(),
                    period_ms: rate.period_ms(),
                    cost,
                    shadow: rule.shadow,
                    lease: 0,
                    calendar: rule.calendar,
                    regions: rule.regions,
                },
            })
        })
        .collect()
}

/// The first tier whose condition this request meets.
pub fn tier_for<'a>(rule: &'a Rule, request: &impl RequestAttributes, hops: u32) -> Option<&'a Tier> {
    rule.tiers.iter().find(|tier| {
        part_value(&tier.when.source, request, hops).is_some_and(|value| match &tier.when.test {
            ValueTest::Equals(expected) => value == *expected,
            ValueTest::Prefix(prefix) => value.starts_with(prefix.as_str()),
        })
    })
}

/// Whether a planned rule reads its cost from the response body (this filter, or
/// Envoy's AI protocol manager): the request must then ask for the whole body,
/// uncompressed ([`READABLE_BODY_HEADERS`]).
pub fn reads_response_body(planned: &[PlannedCheck]) -> bool {
    planned.iter().any(|check| {
        check
            .rule
            .cost_from_response
            .as_ref()
            .is_some_and(|cost| cost.reads_body())
    })
}

/// What such a request is sent upstream with, so that nothing the client sends makes
/// its body unreadable, and so cheaper: an uncompressed body (`accept-encoding:
/// identity`, and `te` no transfer coding beyond trailers), all of it (no `range`).
/// `None` removes the header.
pub const READABLE_BODY_HEADERS: [(&str, Option<&str>); 4] = [
    ("accept-encoding", Some("identity")),
    ("te", Some("trailers")),
    ("range", None),
    ("if-range", None),
];

#[cfg(test)]
mod tests {
    use super::*;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    use crate::attributes::fake::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const LAYERED: &str = r#"{
        "shim_cluster": "shim",
        "rules": [
            {"name": "per-key", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m",
             "tiers": [
                {"name": "vip", "when": {"header": "x-api-key", "prefix": "vip:"}, "limit": 1000},
                {"name": "premium", "when": {"jwt_claim": "tier", "equals": "premium"}, "limit": 500, "period": "10s"}
             ],
             "costs": [{"match": {"path_prefix": "/export"}, "cost": 10}]},
            {"name": "per-ip", "key": ["client_ip"], "limit": 20, "period": "1s"},
            {"name": "search", "match": {"path_prefix": "/search"}, "key": ["client_ip"], "limit": 10, "period": "1m"},
            {"name": "trial", "key": [{"constant": "all"}], "limit": 5000, "period": "1s", "shadow": true}
        ]
    }"#;

    fn config() -> FilterConfig {
        FilterConfig::from_json(LAYERED.as_bytes()).unwrap()
    }

    fn names(config: &FilterConfig, planned: &[PlannedCheck]) -> Vec<String> {
        planned
            .iter()
            .map(|p| config.rules[p.rule_index].name.clone())
            .collect()
    }

    #[test]
    fn every_matching_rule_with_a_key_is_checked() {
        let config = config();
        let keyed = FakeRequest::get("/search?q=x").with_header("x-api-key", "k");
        assert_eq!(
            names(&config, &plan(&config, &keyed)),
            ["per-key", "per-ip", "search", "trial"]
        );
        let anonymous = FakeRequest::get("/home");
        assert_eq!(names(&config, &plan(&config, &anonymous)), ["per-ip", "trial"]);
        let trial = &plan(&config, &anonymous)[1].check;
        assert!(trial.shadow);
    }

    #[test]
    fn tiers_choose_the_limit() {
        let config = config();
        let limit_of = |request: &FakeRequest| {
            let check = plan(&config, request)
                .into_iter()
                .find(|p| p.rule_index == 0)
                .unwrap()
                .check;
            (check.limit, check.period_ms)
        };
        assert_eq!(
            limit_of(&FakeRequest::get("/").with_header("x-api-key", "free-1")),
            (100, 60_000)
        );
        assert_eq!(
            limit_of(&FakeRequest::get("/").with_header("x-api-key", "vip:1")),
            (1000, 60_000)
        );
        let premium = FakeRequest::get("/")
            .with_header("x-api-key", "p")
            .with_claim("tier", "premium");
        assert_eq!(limit_of(&premium), (500, 10_000));
    }

    #[test]
    fn routes_choose_the_cost() {
        let config = config();
        let cost_of = |path: &str| {
            plan(&config, &FakeRequest::get(path).with_header("x-api-key", "k"))[0]
                .check
                .cost
        };
        assert_eq!(cost_of("/export/all"), 10);
        assert_eq!(cost_of("/items"), 1);
    }
}
