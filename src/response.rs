//! The client-facing contract: what the filter does with the shim's answer.
//!
//! [`decide`] turns the per-rule results into either rate-limit headers for an allowed
//! response or a complete refusal; [`unavailable`] is the reply when a rule fails closed.
//! Both are pure: the host layer only applies the [`Outcome`]. Shadow rules never refuse
//! and never appear in client-facing headers.

use crate::config::ResponseSettings;
use crate::judged::{Headers, Judged};
use crate::rate_headers::{self, retry_after_seconds, RETRY_AFTER_HEADER};
use crate::spill::Spill;
use crate::wire::calendar::UtcOffset;
use crate::wire::Check;
use serde_json::json;

const PROBLEM_JSON: &str = "application/problem+json";
/// The draft's problem types (draft-ietf-httpapi-ratelimit-headers, "Problem Types").
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// What the host layer must do with the paused request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Resume the request and add these headers to its response.
    Allow { headers: Headers },
    /// Answer locally with this reply.
    Reply(LocalReply),
    /// Set these request headers, plan the request again and check it (`spill`).
    Spill(Spill),
}

/// A response the filter sends itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Headers,
    pub body: String,
}

/// Decides the request from every rule's result known (the shim's, or the local
/// layer's); `now_unix_ms` is the host's wall clock. With no result, the request passes
/// with no headers.
pub fn decide(judged: &[Judged<'_>], now_unix_ms: u64, settings: &ResponseSettings) -> Outcome {
    let enforcing: Vec<&Judged<'_>> = judged.iter().filter(|j| !j.rule.shadow).collect();
    let refusing = enforcing
        .iter()
        .copied()
        .filter(|j| !j.result.allowed)
        .max_by_key(|j| j.result.retry_after_ms);
    let headers = rate_limit_headers(&enforcing, refusing, now_unix_ms, settings);
    match refusing {
        None => Outcome::Allow { headers },
        Some(refusing) => {
            let violated: Vec<&str> = enforcing
                .iter()
                .filter(|j| !j.result.allowed)
                .map(|j| j.rule.name.as_str())
                .collect();
            Outcome::Reply(refusal(refusing, &violated, headers, settings))
        }
    }
}

/// Names of the shadow rules that would have refused this request.
pub fn shadow_refusals<'a>(judged: &[Judged<'a>]) -> Vec<&'a str> {
    judged
        .iter()
        .filter(|j| j.rule.shadow && !j.result.allowed)
        .map(|j| j.rule.name.as_str())
        .collect()
}

/// The reply when the shim gave no usable answer and the rules `failing_closed` fail
/// closed: the draft's `temporary-reduced-capacity` problem naming them.
pub fn unavailable(failing_closed: &[&str]) -> LocalReply {
    let body = json!({
        "type": TEMPORARY_REDUCED_CAPACITY,
        "title": "Temporary Reduced Capacity",
        "status": 503,
        "detail": "The rate limiter could not reach its backend and is configured to fail closed.",
        "violated-policies": failing_closed,
    });
    LocalReply {
        status: 503,
        headers: vec![
            ("content-type".into(), PROBLEM_JSON.into()),
            (RETRY_AFTER_HEADER.into(), "1".into()),
        ],
        body: body.to_string(),
    }
}

/// How a refusal names the rule's window, in the largest unit it is a whole number of:
/// "per minute", "per 5 minutes", "per 250 ms", "per month (UTC+05:30)".
fn per_window(check: &Check) -> String {
    const UNITS: [(u64, &str); 5] = [
        (7 * 86_400_000, "week"),
        (86_400_000, "day"),
        (3_600_000, "hour"),
        (60_000, "minute"),
        (1_000, "second"),
    ];
    if let Some(calendar) = check.calendar {
        return format!("per {calendar}");
    }
    let ms = check.period_ms;
    match UNITS
        .iter()
        .find(|(unit_ms, _)| ms >= *unit_ms && ms.is_multiple_of(*unit_ms))
    {
        Some((unit_ms, unit)) if ms == *unit_ms => format!("per {unit}"),
        Some((unit_ms, unit)) => format!("per {} {unit}s", ms / unit_ms),
        None => format!("per {ms} ms"),
    }
}

fn rate_limit_headers(
    enforcing: &[&Judged<'_>],
    refusing: Option<&Judged<'_>>,
    now_unix_ms: u64,
    settings: &ResponseSettings,
) -> Headers {
    // The rule that refused, else the one with the least headroom.
    let tightest = refusing.or_else(|| {
        enforcing
            .iter()
            .copied()
            .min_by_key(|j| (j.result.remaining, std::cmp::Reverse(j.result.reset_ms)))
    });
    match tightest {
        Some(tightest) => rate_headers::write(enforcing, tightest, now_unix_ms, settings),
        None => Vec::new(),
    }
}

/// The refusal: rate-limit headers, `Retry-After`, and an RFC 9457 problem document of
/// the draft's `quota-exceeded` type naming every refusing rule in `violated-policies`
/// and detailing the one whose wait is longest (or the configured body).
fn refusal(
    judged: &Judged<'_>,
    violated: &[&str],
    mut headers: Headers,
    settings: &ResponseSettings,
) -> LocalReply {
    let Judged { rule, check, result } = *judged;
    let retry_after = retry_after_seconds(result.retry_after_ms);
    headers.push((RETRY_AFTER_HEADER.into(), retry_after.to_string()));
    let (content_type, body) = match &settings.body {
        Some(custom) => (
            custom.content_type.clone(),
            custom
                .template
                .replace("{rule}", &rule.name)
                .replace("{limit}", &check.limit.to_string())
                .replace("{retry_after}", &retry_after.to_string()),
        ),
        None if check.algorithm.traits().counts_in_flight => (
            PROBLEM_JSON.to_string(),
            json!({
                "type": QUOTA_EXCEEDED,
                "title": "Quota Exceeded",
                "status": settings.status,
                "violated-policies": violated,
                "detail": format!(
                    "Concurrency limit '{}' reached: {} requests in flight. Retry in {} s.",
                    rule.name, check.limit, retry_after
                ),
                "rule": rule.name,
                "limit": check.limit,
                "quota_unit": "concurrent-requests",
                "retry_after": retry_after,
            })
            .to_string(),
        ),
        None => {
            let mut problem = json!({
                "type": QUOTA_EXCEEDED,
                "title": "Quota Exceeded",
                "status": settings.status,
                "violated-policies": violated,
                "detail": format!(
                    "Rate limit '{}' exceeded: {} {}. Retry in {} s.",
                    rule.name,
                    check.limit,
                    per_window(check),
                    retry_after
                ),
                "rule": rule.name,
                "limit": check.limit,
                "retry_after": retry_after,
            });
            // A calendar window has no fixed length: it is named, not measured.
            let window = match check.calendar {
                Some(calendar) => vec![
                    ("calendar", json!(calendar.unit.as_str())),
                    (
                        "utc_offset",
                        json!(UtcOffset(calendar.offset_minutes).to_string()),
                    ),
                ],
                None => vec![("period_ms", json!(check.period_ms))],
            };
            if let Some(fields) = problem.as_object_mut() {
                fields.extend(window.into_iter().map(|(name, value)| (name.to_string(), value)));
            }
            (PROBLEM_JSON.to_string(), problem.to_string())
        }
    };
    headers.push(("content-type".into(), content_type));
    LocalReply {
        status: settings.status,
        headers,
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    use crate::config::{written_headers, FilterConfig, HeaderDialect, Rule};
    use crate::judged::fixtures::{check_for, result};
    use crate::keys::KeyPart;
    use crate::rate_headers::{POLICY_HEADER, RATELIMIT_HEADER};
    use crate::wire::{Algorithm, CheckResult, Limit};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const BOTH: &[HeaderDialect] = &[HeaderDialect::XRateLimit, HeaderDialect::Draft10];

    fn rule(name: &str, limit: u64, shadow: bool) -> Rule {
        let mut rule = Rule::for_tests(name, vec![KeyPart::ClientIp]);
        rule.rate.limit = Limit::try_from(limit).unwrap();
        rule.shadow = shadow;
        rule
    }

    fn judged<'a>(rules: &'a [Rule], checks: &'a [Check], results: &[CheckResult]) -> Vec<Judged<'a>> {
        rules
            .iter()
            .zip(checks)
            .zip(results)
            .map(|((rule, check), result)| Judged {
                rule,
                check,
                result: *result,
            })
            .collect()
    }

    fn settings(style: &[HeaderDialect]) -> ResponseSettings {
        let mut settings = FilterConfig::from_json(br#"{"shim_cluster": "c", "rules": [{"name": "r", "key": ["client_ip"], "limit": 1, "period": "1s"}]}"#)
            .unwrap()
            .response;
        settings.dialects = style.to_vec();
        settings.written_headers = written_headers(
            style,
            ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"],
        );
        settings
    }

    fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    const NOW_MS: u64 = 1_700_000_000_250;

    fn run(rules: &[Rule], results: Vec<CheckResult>, style: &[HeaderDialect]) -> Outcome {
        let checks: Vec<Check> = rules.iter().map(check_for).collect();
        decide(&judged(rules, &checks, &results), NOW_MS, &settings(style))
    }

    #[test]
    fn allowed_request_gets_the_tightest_rules_headers() {
        let rules = [rule("a", 100, false), rule("b", 5, false)];
        let Outcome::Allow { headers } = run(
            &rules,
            vec![result(true, 100, 90, 6_000, 0), result(true, 5, 2, 36_000, 0)],
            &[HeaderDialect::XRateLimit],
        ) else {
            panic!("expected allow")
        };
        assert_eq!(header(&headers, "x-ratelimit-limit"), Some("5"));
        assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("2"));
        // 1_700_000_000.250 s + 36 s, rounded up.
        assert_eq!(header(&headers, "x-ratelimit-reset"), Some("1700000037"));
        assert_eq!(header(&headers, POLICY_HEADER), None);
    }

    #[test]
    fn refusal_names_the_refusing_rule() {
        let rules = [rule("per-user", 100, false), rule("per-ip", 5, false)];
        let Outcome::Reply(reply) = run(
            &rules,
            vec![
                result(true, 100, 50, 30_000, 0),
                result(false, 5, 0, 60_000, 11_001),
            ],
            &[HeaderDialect::XRateLimit],
        ) else {
            panic!("expected a reply")
        };
        assert_eq!(reply.status, 429);
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), Some("12"));
        assert_eq!(header(&reply.headers, "x-ratelimit-limit"), Some("5"));
        assert_eq!(header(&reply.headers, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(header(&reply.headers, "content-type"), Some(PROBLEM_JSON));
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["rule"], "per-ip");
        assert_eq!(body["status"], 429);
        assert_eq!(body["retry_after"], 12);
    }

    #[test]
    fn draft_headers_list_every_enforcing_rule_and_t_is_never_before_retry_after() {
        let rules = [
            rule("per-key", 100, false),
            rule("per-ip", 10, false),
            rule("trial", 1, true),
        ];
        let Outcome::Reply(reply) = run(
            &rules,
            vec![
                result(true, 100, 42, 17_200, 0),
                result(false, 10, 0, 59_000, 5_500),
                result(false, 1, 0, 1_000, 900),
            ],
            &[HeaderDialect::Draft10],
        ) else {
            panic!("expected a reply")
        };
        assert_eq!(
            header(&reply.headers, POLICY_HEADER),
            Some(r#""per-key";q=100;w=60, "per-ip";q=10;w=60"#)
        );
        assert_eq!(
            header(&reply.headers, RATELIMIT_HEADER),
            Some(r#""per-key";r=42;t=18, "per-ip";r=0;t=6"#)
        );
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), Some("6"));
        assert_eq!(header(&reply.headers, "x-ratelimit-limit"), None);
    }

    #[test]
    fn shadow_rules_never_refuse_nor_show() {
        let rules = [rule("live", 100, false), rule("trial", 1, true)];
        let results = vec![result(true, 100, 99, 600, 0), result(false, 1, 0, 1_000, 1_000)];
        let Outcome::Allow { headers } = run(&rules, results.clone(), BOTH) else {
            panic!("a shadow rule refused")
        };
        assert_eq!(header(&headers, "x-ratelimit-limit"), Some("100"));
        assert_eq!(header(&headers, POLICY_HEADER), Some(r#""live";q=100;w=60"#));
        let checks: Vec<Check> = rules.iter().map(check_for).collect();
        assert_eq!(shadow_refusals(&judged(&rules, &checks, &results)), ["trial"]);
    }

    #[test]
    fn custom_status_body_and_header_names() {
        let rules = [rule("r", 5, false)];
        let checks: Vec<Check> = rules.iter().map(check_for).collect();
        let custom = FilterConfig::from_json(
            br#"{"shim_cluster": "c", "response": {"status": 503,
            "header_names": {"limit": "X-Quota"}, "body": "{rule}: {limit} max, retry in {retry_after}s"},
            "rules": [{"name": "r", "key": ["client_ip"], "limit": 1, "period": "1s"}]}"#,
        )
        .unwrap()
        .response;
        let results = [result(false, 5, 0, 60_000, 2_000)];
        let Outcome::Reply(reply) = decide(&judged(&rules, &checks, &results), NOW_MS, &custom) else {
            panic!("expected a reply")
        };
        assert_eq!(reply.status, 503);
        assert_eq!(reply.body, "r: 5 max, retry in 2s");
        assert_eq!(header(&reply.headers, "content-type"), Some("text/plain"));
        assert_eq!(header(&reply.headers, "x-quota"), Some("5"));
    }

    #[test]
    fn a_calendar_rule_announces_its_window_and_its_end() {
        use crate::wire::{CalendarUnit, CalendarWindow};
        let mut monthly = rule("monthly", 1000, false);
        monthly.algorithm = Algorithm::FixedWindow;
        monthly.rate.period = crate::wire::Period::try_from(CalendarUnit::Month.longest_ms()).unwrap();
        monthly.calendar = Some(CalendarWindow {
            unit: CalendarUnit::Month,
            offset_minutes: 0,
        });
        // NOW_MS is 2023-11-14 22:13:20.250 UTC: November has 30 days, and the next
        // window starts on 2023-12-01 00:00 UTC, 1_701_388_800 s.
        let until_december_ms = 1_701_388_800_000 - NOW_MS;
        let Outcome::Reply(reply) = run(
            std::slice::from_ref(&monthly),
            vec![result(false, 1000, 0, until_december_ms, until_december_ms)],
            BOTH,
        ) else {
            panic!("expected a reply")
        };
        assert_eq!(
            header(&reply.headers, POLICY_HEADER),
            Some(r#""monthly";q=1000;w=2592000"#)
        );
        assert_eq!(
            header(&reply.headers, RATELIMIT_HEADER),
            Some(r#""monthly";r=0;t=1388800"#)
        );
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), Some("1388800"));
        assert_eq!(header(&reply.headers, "x-ratelimit-reset"), Some("1701388800"));
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(
            body["detail"],
            "Rate limit 'monthly' exceeded: 1000 per month (UTC+00:00). Retry in 1388800 s."
        );
        assert_eq!(body["calendar"], "month");
        assert_eq!(body["utc_offset"], "+00:00");
        assert!(body.get("period_ms").is_none(), "{body}");
        // In February of a leap year the window is 29 days.
        let checks = [check_for(&monthly)];
        let allowed = [result(true, 1000, 999, 1_000, 0)];
        let february_2024_ms = 1_708_000_000_000;
        let Outcome::Allow { headers } = decide(
            &judged(std::slice::from_ref(&monthly), &checks, &allowed),
            february_2024_ms,
            &settings(&[HeaderDialect::Draft10]),
        ) else {
            panic!("expected allow")
        };
        assert_eq!(
            header(&headers, POLICY_HEADER),
            Some(r#""monthly";q=1000;w=2505600"#)
        );
    }

    #[test]
    fn retry_after_is_never_zero() {
        let rules = [rule("a", 5, false)];
        let Outcome::Reply(reply) = run(&rules, vec![result(false, 5, 0, 100, 1)], &[]) else {
            panic!("expected a reply")
        };
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), Some("1"));
        assert_eq!(header(&reply.headers, "x-ratelimit-limit"), None);
    }

    #[test]
    fn no_result_known_lets_the_request_through_without_headers() {
        assert_eq!(
            decide(&[], NOW_MS, &settings(BOTH)),
            Outcome::Allow { headers: vec![] }
        );
    }

    #[test]
    fn failing_closed_answers_503_temporary_reduced_capacity_naming_the_rules() {
        let reply = unavailable(&["per_user", "global"]);
        assert_eq!(reply.status, 503);
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), Some("1"));
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(
            body["type"],
            "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
        );
        assert_eq!(body["violated-policies"], json!(["per_user", "global"]));
    }

    fn concurrency_rule(name: &str, limit: u64) -> (Rule, Check) {
        let mut rule = rule(name, limit, false);
        rule.algorithm = Algorithm::Concurrency;
        let check = Check {
            algorithm: Algorithm::Concurrency,
            ..check_for(&rule)
        };
        (rule, check)
    }

    #[test]
    fn a_concurrency_limit_announces_requests_in_flight_without_a_window() {
        let (slots, slots_check) = concurrency_rule("in-flight", 3);
        let rate = rule("per-min", 100, false);
        let rules = [slots, rate];
        let checks = [slots_check, check_for(&rules[1])];
        // Admitted with 2 slots left (the last slot in flight expires at the latest in
        // 60 s): no `t`, slots free whenever requests end.
        let results = [result(true, 3, 2, 60_000, 0), result(true, 100, 50, 30_000, 0)];
        let Outcome::Allow { headers } = decide(&judged(&rules, &checks, &results), NOW_MS, &settings(BOTH))
        else {
            panic!("expected allow")
        };
        assert_eq!(
            header(&headers, POLICY_HEADER),
            Some(r#""in-flight";q=3;qu="concurrent-requests", "per-min";q=100;w=60"#)
        );
        assert_eq!(
            header(&headers, RATELIMIT_HEADER),
            Some(r#""in-flight";r=2, "per-min";r=50;t=30"#)
        );
        assert_eq!(header(&headers, "x-ratelimit-limit"), Some("3"));
        assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("2"));

        // Refused: every slot taken; a slot may free any moment, retry within a second.
        let results = [
            result(false, 3, 0, 60_000, 1_000),
            result(true, 100, 50, 30_000, 0),
        ];
        let Outcome::Reply(reply) = decide(&judged(&rules, &checks, &results), NOW_MS, &settings(BOTH))
        else {
            panic!("expected a reply")
        };
        assert_eq!(reply.status, 429);
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), Some("1"));
        assert_eq!(
            header(&reply.headers, RATELIMIT_HEADER),
            Some(r#""in-flight";r=0;t=1, "per-min";r=50;t=30"#)
        );
        assert_eq!(header(&reply.headers, "x-ratelimit-remaining"), Some("0"));
        // X-RateLimit-Reset is when to retry, not when the last slot in flight expires.
        assert_eq!(header(&reply.headers, "x-ratelimit-reset"), Some("1700000002"));
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["rule"], "in-flight");
        assert_eq!(body["quota_unit"], "concurrent-requests");
        assert!(body["detail"].as_str().unwrap().contains("3 requests in flight"));
    }

    #[test]
    fn a_refusal_names_the_window_in_the_largest_whole_unit() {
        let rule = rule("r", 10, false);
        let per = |period_ms: u64| {
            per_window(&Check {
                period_ms,
                ..check_for(&rule)
            })
        };
        assert_eq!(per(60_000), "per minute");
        assert_eq!(per(300_000), "per 5 minutes");
        assert_eq!(per(90_000), "per 90 seconds");
        assert_eq!(per(86_400_000), "per day");
        assert_eq!(per(250), "per 250 ms");
        assert_eq!(per(1_500), "per 1500 ms");
    }

    #[test]
    fn a_calendar_refusal_reads_in_the_units_of_its_config() {
        // Through the config parser, so that the text follows what an operator wrote.
        let config = FilterConfig::from_json(
            br#"{"shim_cluster": "c", "rules": [
                {"name": "daily", "key": ["client_ip"], "limit": 3, "calendar": "day",
                 "utc_offset": "-03:30", "algorithm": "fixed_window"},
                {"name": "weekly", "key": ["client_ip"], "limit": 7, "calendar": "week",
                 "utc_offset": "+05:45", "algorithm": "fixed_window"}]}"#,
        )
        .unwrap();
        for (rule, expected) in config.rules.iter().zip([
            "Rate limit 'daily' exceeded: 3 per day (UTC-03:30). Retry in 60 s.",
            "Rate limit 'weekly' exceeded: 7 per week (UTC+05:45). Retry in 60 s.",
        ]) {
            let rule: Rule = (**rule).clone();
            let checks = [check_for(&rule)];
            let limit = rule.rate.limit.get();
            let refused = [result(false, limit, 0, 60_000, 60_000)];
            let Outcome::Reply(reply) = decide(
                &judged(std::slice::from_ref(&rule), &checks, &refused),
                NOW_MS,
                &settings(&[]),
            ) else {
                panic!("expected a reply")
            };
            let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
            assert_eq!(body["detail"], expected, "{body}");
        }
    }
}
