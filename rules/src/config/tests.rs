//! The configuration's compile checks: what is accepted, and every refusal naming its field.

use super::*;
use crate::keys::KeyPart;
use crate::wire::Algorithm;
use std::time::Duration;
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
    // The filter-wide failure mode is every rule's default.
    assert_eq!(config.rules[0].on_failure, RuleFailureMode::Closed);
    assert_eq!(config.xff_num_trusted_hops, 1);
    assert_eq!(config.jwt_payload_in_metadata, "jwt_payload");
    assert_eq!(config.response.status, 420);
    assert_eq!(
        config.response.dialects,
        [HeaderDialect::XRateLimit, HeaderDialect::Draft10]
    );
    let written = &config.response.written_headers;
    assert!(written.contains(&("x-quota".into(), Form::Limit)), "{written:?}");
    assert!(
        written.contains(&("x-ratelimit-remaining".into(), Form::Remaining)),
        "{written:?}"
    );
    let (key_rule, search) = (&config.rules[0], &config.rules[1]);
    assert_eq!(key_rule.key, vec![KeyPart::Header("x-api-key".into())]);
    assert_eq!(key_rule.rate.period_ms(), 60_000);
    assert_eq!(key_rule.cost, 1);
    assert_eq!(key_rule.tiers[0].rate.limit(), 50);
    assert_eq!(key_rule.tiers[0].rate.period_ms(), 60_000);
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
        " 10s",
        "10s ",
        "10 s",
        "10S",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

// Regression: each of these was accepted, and then disabled limiting or injected a header.
#[test]
fn refuses_what_would_pass_validation_and_then_misbehave() {
    let valid_rule = r#"{"name": "r", "key": ["client_ip"], "limit": 1, "period": "1s"}"#;
    let cases = [
        (
            format!(r#"{{"shim_cluster": "c", "rules": [{valid_rule}]}} trailing"#),
            "config",
        ),
        (
            format!(r#"["c", null, null, null, 4, "open", 0, null, {{}}, null, true, [{valid_rule}]]"#),
            "config",
        ),
        (
            r#"{"shim_cluster": "c", "rules": [["r", ["client_ip"]]]}"#.to_string(),
            "rules[0]",
        ),
        (
            format!(r#"{{"shim_cluster": "c", "shim_authority": "", "rules": [{valid_rule}]}}"#),
            "shim_authority",
        ),
        (
            format!(r#"{{"shim_cluster": "c", "shim_authority": "shim\u0000", "rules": [{valid_rule}]}}"#),
            "shim_authority",
        ),
        (
            format!(r#"{{"shim_cluster": "c\n", "rules": [{valid_rule}]}}"#),
            "shim_cluster",
        ),
        (
            format!(
                r#"{{"shim_cluster": "c", "response": {{"body": "no", "content_type": "text/plain\r\nx-injected: 1"}}, "rules": [{valid_rule}]}}"#
            ),
            "response.content_type",
        ),
    ];
    for (json, field) in cases {
        assert_eq!(error_for(&json).field, field, "{json}");
    }
}

#[test]
fn cost_from_response_names_where_the_cost_is_read() {
    let rule = |extra: &str| {
        with_rule(&format!(
            r#"{{"name": "r", "key": ["client_ip"], "limit": 1000, "period": "1m", "cost": 100, {extra}}}"#
        ))
    };
    let compiled = |extra: &str| FilterConfig::from_json(rule(extra).as_bytes()).unwrap();
    let source = |extra: &str| {
        compiled(extra).rules[0]
            .cost_from_response
            .clone()
            .map(|cost| (cost.source, cost.unreported))
    };
    let path = |text: &str| text.split('.').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        source(r#""cost_from_response": {"header": "X-Usage-Tokens"}"#),
        Some((
            CostSource::Header("x-usage-tokens".into()),
            UnreportedCost::Estimate
        ))
    );
    assert_eq!(
        source(r#""cost_from_response": {"trailer": "x-usage-tokens", "unreported_cost": 4000}"#),
        Some((
            CostSource::Trailer("x-usage-tokens".into()),
            UnreportedCost::Tokens(4000)
        ))
    );
    assert_eq!(
        source(
            r#""cost_from_response": {"json_field": "choices.0.usage.total_tokens", "unreported_cost": "estimate"}"#
        ),
        Some((
            CostSource::Body(vec![CostField {
                path: path("choices.0.usage.total_tokens"),
                weight: 1
            }]),
            UnreportedCost::Estimate
        ))
    );
    assert_eq!(
        source(
            r#""cost_from_response": {"json_fields": [{"path": "usage.prompt_tokens"},
                {"path": "usage.completion_tokens", "weight": 4}], "unreported_cost": 0}"#
        ),
        Some((
            CostSource::Body(vec![
                CostField {
                    path: path("usage.prompt_tokens"),
                    weight: 1
                },
                CostField {
                    path: path("usage.completion_tokens"),
                    weight: 4
                },
            ]),
            UnreportedCost::Tokens(0)
        ))
    );
    assert_eq!(
        source(
            r#""cost_from_response": {"token_usage": {"fields": [{"path": "input_tokens"},
                {"path": "output_token_details.reasoning_tokens", "weight": 3}]}, "unreported_cost": 7}"#
        ),
        Some((
            CostSource::TokenUsage(TokenUsageCost {
                namespace: "envoy.ai.token_usage".into(),
                fields: vec![
                    CostField {
                        path: path("input_tokens"),
                        weight: 1
                    },
                    CostField {
                        path: path("output_token_details.reasoning_tokens"),
                        weight: 3
                    },
                ],
            }),
            UnreportedCost::Tokens(7)
        ))
    );
    assert_eq!(
        source(
            r#""cost_from_response": {"token_usage": {"namespace": "llm.usage", "fields": [{"path": "total_tokens"}]}}"#
        )
        .map(|(source, _)| source),
        Some(CostSource::TokenUsage(TokenUsageCost {
            namespace: "llm.usage".into(),
            fields: vec![CostField {
                path: path("total_tokens"),
                weight: 1
            }],
        }))
    );
    assert_eq!(source(r#""shadow": false"#), None);
    // Loud, not refused: no unreported_cost (aborting costs only the estimate), and the
    // max_body_bytes of older configurations (nothing of a body is kept any more).
    let warnings = compiled(r#""cost_from_response": {"json_field": "n", "max_body_bytes": 10}"#).warnings;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("rules[0].cost_from_response.max_body_bytes"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("rules[0].cost_from_response.unreported_cost"),
        "{warnings:?}"
    );
    assert!(
        compiled(r#""cost_from_response": {"header": "x", "unreported_cost": 9}"#)
            .warnings
            .is_empty()
    );
    let cases = [
        (r#""cost_from_response": {}"#, "rules[0].cost_from_response"),
        (
            r#""cost_from_response": {"header": "a", "trailer": "b"}"#,
            "rules[0].cost_from_response",
        ),
        (
            r#""cost_from_response": {"header": "x usage"}"#,
            "rules[0].cost_from_response.header",
        ),
        (
            r#""cost_from_response": {"trailer": ":status"}"#,
            "rules[0].cost_from_response.trailer",
        ),
        (
            r#""cost_from_response": {"json_field": "usage..tokens"}"#,
            "rules[0].cost_from_response.json_field",
        ),
        (
            r#""cost_from_response": {"json_field": "usage. tokens"}"#,
            "rules[0].cost_from_response.json_field",
        ),
        (
            r#""cost_from_response": {"json_field": "a", "json_fields": [{"path": "b"}]}"#,
            "rules[0].cost_from_response",
        ),
        (
            r#""cost_from_response": {"json_fields": []}"#,
            "rules[0].cost_from_response.json_fields",
        ),
        (
            r#""cost_from_response": {"json_fields": [{"path": "a"}, {"path": "a", "weight": 2}]}"#,
            "rules[0].cost_from_response.json_fields[1].path",
        ),
        (
            r#""cost_from_response": {"json_fields": [{"path": "a", "weight": 0}]}"#,
            "rules[0].cost_from_response.json_fields[0].weight",
        ),
        (
            r#""cost_from_response": {"json_fields": [{"path": "a", "price": 2}]}"#,
            "price",
        ),
        (
            r#""cost_from_response": {"token_usage": {"fields": [{"path": "usage.prompt_tokens"}]}}"#,
            "rules[0].cost_from_response.token_usage.fields[0].path",
        ),
        (
            r#""cost_from_response": {"token_usage": {"fields": []}}"#,
            "rules[0].cost_from_response.token_usage.fields",
        ),
        (
            r#""cost_from_response": {"token_usage": {"namespace": "a b", "fields": [{"path": "input_tokens"}]}}"#,
            "rules[0].cost_from_response.token_usage.namespace",
        ),
        (
            r#""cost_from_response": {"header": "x", "token_usage": {"fields": [{"path": "input_tokens"}]}}"#,
            "rules[0].cost_from_response",
        ),
        (
            r#""cost_from_response": {"token_usage": {"fields": [{"path": "input_tokens", "weight": 0}]}}"#,
            "rules[0].cost_from_response.token_usage.fields[0].weight",
        ),
        (
            r#""cost_from_response": {"header": "x", "unreported_cost": "maximum"}"#,
            "rules[0].cost_from_response.unreported_cost",
        ),
        (
            r#""cost_from_response": {"header": "x", "unreported_cost": -1}"#,
            "rules[0].cost_from_response.unreported_cost",
        ),
        (
            r#""cost_from_response": {"header": "x", "unreported_cost": 1.5}"#,
            "rules[0].cost_from_response.unreported_cost",
        ),
        (
            r#""cost_from_response": {"header": "x", "max_body_bytes": 10}"#,
            "rules[0].cost_from_response.max_body_bytes",
        ),
        (r#""cost_from_response": {"header": "x", "colour": 1}"#, "colour"),
        (
            r#""cost_from_response": {"header": "x"}, "algorithm": "sliding_window_log""#,
            "rules[0].algorithm",
        ),
        (
            r#""cost_from_response": {"header": "x"}, "algorithm": "concurrency""#,
            "rules[0]",
        ),
        (
            r#""cost_from_response": {"header": "x"}, "scope": "local""#,
            "rules[0].scope",
        ),
        (
            r#""cost_from_response": {"header": "x"}, "lease": {"size": 200, "ttl": "1s"}"#,
            "rules[0].lease",
        ),
    ];
    for (extra, field) in cases {
        let err = error_for(&rule(extra));
        assert!(err.to_string().contains(field), "{err} should name {field}");
    }
}

#[test]
fn a_concurrency_rule_takes_a_limit_and_a_max_duration_instead_of_a_period() {
    let conc = |extra: &str| {
        with_rule(&format!(
            r#"{{"name": "c", "algorithm": "concurrency", "key": ["client_ip"], "limit": 3{extra}}}"#
        ))
    };
    let config = FilterConfig::from_json(conc("").as_bytes()).unwrap();
    let rule = &config.rules[0];
    assert_eq!((rule.algorithm, rule.rate.limit()), (Algorithm::Concurrency, 3));
    assert_eq!(rule.rate.period_ms(), 60_000, "max_duration defaults to 60s");
    assert_eq!(rule.counter, "c/cc60000");
    let tiered = conc(
        r#", "max_duration": "2s", "shadow": true, "tiers": [{"name": "vip", "when": {"header": "x", "equals": "y"}, "limit": 9}]"#,
    );
    let config = FilterConfig::from_json(tiered.as_bytes()).unwrap();
    assert_eq!(config.rules[0].rate.period_ms(), 2_000);
    assert_eq!(config.rules[0].tiers[0].rate.limit(), 9);
    // No window `w` to announce: a max_duration of any length goes with draft headers.
    let draft = r#"{"shim_cluster": "c", "response": {"headers": "ietf-draft"}, "rules": [{"name": "c", "algorithm": "concurrency", "key": ["client_ip"], "limit": 3, "max_duration": "1500ms"}]}"#;
    assert!(FilterConfig::from_json(draft.as_bytes()).is_ok());

    let refused = [
        (conc(r#", "period": "1s""#), "rules[0].period"),
        (conc(r#", "max_duration": "0s""#), "rules[0].max_duration"),
        (conc(r#", "max_duration": "soon""#), "rules[0].max_duration"),
        (conc(r#", "cost": 2"#), "rules[0].cost"),
        (
            conc(r#", "costs": [{"match": {"path_prefix": "/x"}, "cost": 2}]"#),
            "rules[0].costs[0].cost",
        ),
        (conc(r#", "lease": {"size": 2, "ttl": "1s"}"#), "rules[0].lease"),
        (
            conc(r#", "local": {"limit": 2, "period": "1s"}"#),
            "rules[0].local",
        ),
        (
            conc(r#", "failure_mode": "local", "fallback": {"limit": 2, "period": "1s"}"#),
            "rules[0].failure_mode",
        ),
        (
            conc(
                r#", "tiers": [{"name": "t", "when": {"header": "x", "equals": "y"}, "limit": 2, "period": "1s"}]"#,
            ),
            "rules[0].tiers[0].period",
        ),
        (
            conc(r#", "limit": 100001"#).replace(r#""limit": 3, "#, ""),
            "rules[0].limit",
        ),
        (
            with_rule(
                r#"{"name": "r", "key": ["client_ip"], "limit": 1, "period": "1s", "max_duration": "5s"}"#,
            ),
            "rules[0].max_duration",
        ),
        (
            with_rule(r#"{"name": "r", "key": ["client_ip"], "limit": 1}"#),
            "rules[0].period",
        ),
    ];
    for (json, field) in refused {
        let err = error_for(&json);
        assert_eq!(err.field, field, "{json}: got {err}");
    }
    // A cost of 1, said explicitly, is what a slot is.
    assert!(FilterConfig::from_json(conc(r#", "cost": 1"#).as_bytes()).is_ok());
}

#[test]
fn calendar_rules_are_fixed_windows_aligned_to_the_calendar() {
    use crate::wire::{CalendarUnit, CalendarWindow};
    let config = FilterConfig::from_json(
        with_rule(
            r#"{"name": "quota", "key": [{"header": "x-api-key"}], "limit": 10000,
                "calendar": "month", "utc_offset": "-03:30", "lease": {"size": 10, "ttl": "5s"},
                "tiers": [{"name": "pro", "when": {"header": "x-plan", "equals": "pro"}, "limit": 50000}]}"#,
        )
        .as_bytes(),
    )
    .unwrap();
    let rule = &config.rules[0];
    let month = CalendarWindow {
        unit: CalendarUnit::Month,
        offset_minutes: -210,
    };
    assert_eq!(rule.algorithm, Algorithm::FixedWindow);
    assert_eq!(rule.calendar, Some(month));
    assert_eq!(rule.rate.period_ms(), 31 * 86_400_000);
    assert_eq!(rule.counter, "quota/fw-month-0330");
    assert_eq!(rule.tiers[0].rate.limit(), 50_000);
    assert_eq!(rule.tiers[0].counter, "quota/fw-month-0330");
    assert_eq!(rule.lease.map(|l| l.size), Some(10));
    // The offset defaults to UTC; fixed_window may be said explicitly.
    let daily = FilterConfig::from_json(
        with_rule(r#"{"name": "d", "key": ["client_ip"], "limit": 5, "calendar": "day", "algorithm": "fixed_window"}"#)
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        daily.rules[0].calendar,
        Some(CalendarWindow {
            unit: CalendarUnit::Day,
            offset_minutes: 0
        })
    );
    // A period rule is unchanged: no calendar, a token bucket by default.
    let period = FilterConfig::from_json(
        with_rule(r#"{"name": "p", "key": ["client_ip"], "limit": 5, "period": "1m"}"#).as_bytes(),
    )
    .unwrap();
    assert_eq!(period.rules[0].calendar, None);
    assert_eq!(period.rules[0].algorithm, Algorithm::TokenBucket);
}

#[test]
fn each_bad_calendar_names_its_field() {
    let rule = |extra: &str| {
        with_rule(&format!(
            r#"{{"name": "r", "key": ["client_ip"], "limit": 5, {extra}}}"#
        ))
    };
    let tier =
        r#""tiers": [{"name": "t", "when": {"header": "x", "equals": "y"}, "limit": 9, "period": "1d"}]"#;
    let cases = [
        (rule(r#""calendar": "day", "period": "1d""#), "rules[0].calendar"),
        (rule(r#""cost": 1"#), "rules[0].period"),
        (rule(r#""calendar": "year""#), "rules[0].calendar"),
        (
            rule(r#""calendar": "day", "utc_offset": "+5:30""#),
            "rules[0].utc_offset",
        ),
        (
            rule(r#""calendar": "day", "utc_offset": "+05:60""#),
            "rules[0].utc_offset",
        ),
        (
            rule(r#""calendar": "day", "utc_offset": "+14:30""#),
            "rules[0].utc_offset",
        ),
        (
            rule(r#""calendar": "day", "utc_offset": "-13:00""#),
            "rules[0].utc_offset",
        ),
        (
            rule(r#""calendar": "day", "utc_offset": 330"#),
            "rules[0].utc_offset",
        ),
        (
            rule(r#""period": "1d", "utc_offset": "+01:00""#),
            "rules[0].utc_offset",
        ),
        (
            rule(r#""calendar": "week", "algorithm": "token_bucket""#),
            "rules[0].algorithm",
        ),
        (
            rule(r#""calendar": "week", "algorithm": "sliding_window_counter""#),
            "rules[0].algorithm",
        ),
        (
            rule(&format!(r#""calendar": "month", {tier}"#)),
            "rules[0].tiers[0].period",
        ),
        (rule(r#""calendar": "day", "scope": "local""#), "rules[0].scope"),
        (
            rule(r#""calendar": "day", "lease": {"size": 6, "ttl": "1s"}"#),
            "rules[0].lease.size",
        ),
    ];
    for (json, field) in cases {
        let err = error_for(&json);
        assert_eq!(err.field, field, "{json}: got {err}");
    }
}

#[test]
fn header_dialects_are_listed_by_name_and_clashing_ones_refused() {
    let rule = r#"[{"name": "r", "key": ["client_ip"], "limit": 5, "period": "1m"}]"#;
    let config = |headers: &str| {
        FilterConfig::from_json(
            format!(r#"{{"shim_cluster": "c", "response": {{"headers": {headers}}}, "rules": {rule}}}"#)
                .as_bytes(),
        )
    };
    let listed = config(r#"["x-ratelimit", "draft-6", "draft-7", "retry-after-ms", "draft-6"]"#).unwrap();
    assert_eq!(
        listed.response.dialects,
        [
            HeaderDialect::XRateLimit,
            HeaderDialect::Draft6,
            HeaderDialect::Draft7,
            HeaderDialect::RetryAfterMs
        ]
    );
    assert!(listed.warnings.is_empty(), "{:?}", listed.warnings);
    assert_eq!(config(r#""none""#).unwrap().response.dialects, []);
    // The old names still load, and say what they mean.
    let both = config(r#""both""#).unwrap();
    assert_eq!(
        both.response.dialects,
        [HeaderDialect::XRateLimit, HeaderDialect::Draft10]
    );
    assert!(
        both.warnings
            .iter()
            .any(|w| w.contains("ratelimit-header-parser")),
        "{:?}",
        both.warnings
    );
    for (clash, reason) in [
        (
            r#"["draft-7", "draft-10"]"#,
            "draft-7 and draft-10 both write ratelimit ",
        ),
        (
            r#"["x-ratelimit", "x-ratelimit-seconds"]"#,
            "both write x-ratelimit-reset",
        ),
        (r#"["draft-6", "draft-11"]"#, "both write ratelimit-policy"),
        (
            r#"["x-ratelimit", "envoy-draft-03"]"#,
            "both write x-ratelimit-limit",
        ),
    ] {
        let error = config(clash).unwrap_err();
        assert_eq!(error.field, "response.headers", "{clash}");
        assert!(error.reason.contains(reason), "{clash}: {}", error.reason);
    }
    let renamed = FilterConfig::from_json(
        format!(r#"{{"shim_cluster": "c", "response": {{"headers": ["x-ratelimit", "draft-6"], "header_names": {{"reset": "RateLimit-Reset"}}}}, "rules": {rule}}}"#).as_bytes(),
    )
    .unwrap_err();
    assert!(renamed.reason.contains("ratelimit-reset"), "{}", renamed.reason);
}

#[test]
fn regions_reach_the_planned_check_and_tiers_inherit_them() {
    use crate::attributes::fake::FakeRequest;
    use crate::plan::plan;
    use crate::wire::Regions;
    let config = FilterConfig::from_json(
        r#"{"shim_cluster": "c", "rules": [
            {"name": "home", "key": [{"header": "x-api-key"}], "limit": 5, "period": "1m",
             "algorithm": "sliding_window_log", "regions": "home"},
            {"name": "replicated", "key": [{"header": "x-api-key"}], "limit": 5, "period": "1m",
             "algorithm": "fixed_window", "regions": "replicated",
             "tiers": [{"name": "vip", "when": {"header": "x-plan", "equals": "vip"}, "limit": 50}]},
            {"name": "counter", "key": [{"header": "x-api-key"}], "limit": 5, "period": "1m",
             "algorithm": "sliding_window_counter", "regions": "replicated", "local": {"limit": 5, "period": "1s"}},
            {"name": "monthly", "key": [{"header": "x-api-key"}], "limit": 5, "calendar": "month",
             "regions": "replicated"},
            {"name": "in-flight", "key": [{"header": "x-api-key"}], "limit": 5, "algorithm": "concurrency",
             "regions": "independent"},
            {"name": "plain", "key": [{"header": "x-api-key"}], "limit": 5, "period": "1m",
             "lease": {"size": 2, "ttl": "1s"}}
        ]}"#
        .as_bytes(),
    )
    .unwrap();
    let regions: Vec<Regions> = config.rules.iter().map(|rule| rule.regions).collect();
    assert_eq!(
        regions,
        [
            Regions::Home,
            Regions::Replicated,
            Regions::Replicated,
            Regions::Replicated,
            Regions::Independent,
            Regions::Independent
        ]
    );
    let json_of = |request: &FakeRequest, rule: &str| -> serde_json::Value {
        let planned = plan(&config, request);
        let check = &planned
            .iter()
            .find(|planned| planned.rule.name == rule)
            .unwrap()
            .check;
        serde_json::to_value(check).unwrap()
    };
    let request = FakeRequest::get("/").with_header("x-api-key", "k");
    assert_eq!(json_of(&request, "home")["regions"], "home");
    assert_eq!(json_of(&request, "replicated")["regions"], "replicated");
    assert_eq!(json_of(&request, "counter")["regions"], "replicated");
    assert_eq!(json_of(&request, "monthly")["regions"], "replicated");
    let vip = request.clone().with_header("x-plan", "vip");
    let tiered = json_of(&vip, "replicated");
    assert_eq!(
        (tiered["limit"].as_u64(), &tiered["regions"]),
        (Some(50), &"replicated".into())
    );
    // An independent check's JSON is what it was before regions: old shims read it.
    for rule in ["in-flight", "plain"] {
        let json = json_of(&request, rule);
        assert!(json.get("regions").is_none(), "{rule}: {json}");
    }
    let text = serde_json::to_string(&plan(&config, &request)[0].check).unwrap();
    assert!(text.contains(r#""regions":"home""#), "{text}");
}

#[test]
fn each_bad_regions_names_its_field() {
    // Two valid rules before it: the field names the third.
    let rule = |extra: &str| {
        format!(
            r#"{{"shim_cluster": "c", "rules": [
                {{"name": "a", "key": ["client_ip"], "limit": 5, "period": "1s"}},
                {{"name": "b", "key": ["client_ip"], "limit": 5, "period": "1s", "regions": "home"}},
                {{"name": "r", "key": [{{"header": "x-api-key"}}], "limit": 100, {extra}}}
            ]}}"#
        )
    };
    let cases = [
        (
            r#""period": "1m", "regions": "everywhere""#,
            "rules[2].regions",
            "unknown variant `everywhere`, expected one of `independent`, `home`, `replicated`",
        ),
        (r#""period": "1m", "regions": "Home""#, "rules[2].regions", "unknown variant `Home`"),
        (r#""period": "1m", "regions": true"#, "rules[2].regions", "expected"),
        (
            r#""period": "1m", "algorithm": "sliding_window_log", "regions": "replicated""#,
            "rules[2].regions",
            "replicated serves a count that adds across regions (fixed_window, sliding_window_counter), not sliding_window_log",
        ),
        (
            r#""period": "1m", "regions": "replicated""#,
            "rules[2].regions",
            "not token_bucket",
        ),
        (
            r#""algorithm": "concurrency", "regions": "replicated""#,
            "rules[2].regions",
            "not concurrency",
        ),
        (
            r#""algorithm": "concurrency", "regions": "home""#,
            "rules[2].regions",
            "home does not serve concurrency (a slot's release would reach the wrong region)",
        ),
        (
            r#""period": "1m", "regions": "home", "lease": {"size": 10, "ttl": "1s"}"#,
            "rules[2].lease",
            "a lease is not served on a home counter (its unspent tokens would come back to the wrong region)",
        ),
        (
            r#""calendar": "day", "regions": "replicated", "lease": {"size": 10, "ttl": "1s"}"#,
            "rules[2].lease",
            "a lease is not served on a replicated counter",
        ),
        (
            r#""period": "1m", "regions": "home", "cost_from_response": {"header": "x-cost", "unreported_cost": 10}"#,
            "rules[2].cost_from_response",
            "a settlement is not served on a home counter (the difference would reach the wrong region): a rule with cost_from_response keeps regions \"independent\"",
        ),
        (
            r#""period": "1m", "algorithm": "sliding_window_counter", "regions": "replicated", "cost_from_response": {"header": "x-cost"}"#,
            "rules[2].cost_from_response",
            "a settlement is not served on a replicated counter",
        ),
        (
            r#""period": "1m", "regions": "home", "scope": "local""#,
            "rules[2].regions",
            "a local rule has no shim (it counts in this Envoy alone): it cannot be home",
        ),
        (
            r#""algorithm": "concurrency", "regions": "replicated", "scope": "local""#,
            "rules[2].regions",
            "a local rule has no shim",
        ),
        (
            r#""period": "1m", "algorithm": "fixed_window", "regions": "home", "tiers": [{"name": "t", "when": {"header": "x", "equals": "y"}, "limit": 9, "regions": "independent"}]"#,
            "rules[2].tiers[0].regions",
            "unknown field `regions`",
        ),
    ];
    for (extra, field, reason) in cases {
        let err = error_for(&rule(extra));
        assert_eq!(err.field, field, "{extra}: got {err}");
        assert!(err.reason.contains(reason), "{extra}: got {err}");
    }
    // Independent, said explicitly, is what every rule was: it takes all of these.
    for extra in [
        r#""period": "1m", "regions": "independent", "lease": {"size": 10, "ttl": "1s"}"#,
        r#""period": "1m", "regions": "independent", "cost_from_response": {"header": "x-cost"}"#,
        r#""period": "1m", "regions": "independent", "scope": "local""#,
        r#""period": "1m", "algorithm": "sliding_window_log", "regions": "independent""#,
    ] {
        assert!(FilterConfig::from_json(rule(extra).as_bytes()).is_ok(), "{extra}");
    }
}
