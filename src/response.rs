//! The client-facing contract: what the filter does with the shim's answer.
//!
//! [`decide`] turns the shim's per-rule results into either rate-limit headers for an
//! allowed response or a complete 429 reply; [`on_shim_failure`] applies the configured
//! failure mode when no valid answer came. Both are pure: the host layer only applies the
//! [`Outcome`].

use crate::config::{FailureMode, Rule};
use crate::wire::{CheckResponse, CheckResult};
use serde_json::json;

pub const LIMIT_HEADER: &str = "x-ratelimit-limit";
pub const REMAINING_HEADER: &str = "x-ratelimit-remaining";
pub const RESET_HEADER: &str = "x-ratelimit-reset";
pub const RETRY_AFTER_HEADER: &str = "retry-after";
const PROBLEM_JSON: &str = "application/problem+json";

/// What the host layer must do with the paused request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Resume the request and add these headers to its response.
    Allow { headers: Vec<(&'static str, String)> },
    /// Answer locally with this reply.
    Reply(LocalReply),
}

/// A response the filter sends itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// The shim answered, but not with one result per rule checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MismatchedAnswer {
    pub expected: usize,
    pub received: usize,
}

/// Decides the request from the shim's answer. `rules` are the rules checked, in the
/// order of the answer's results; `now_unix_ms` is the host's wall clock.
pub fn decide(
    rules: &[&Rule],
    answer: &CheckResponse,
    now_unix_ms: u64,
) -> Result<Outcome, MismatchedAnswer> {
    if answer.results.len() != rules.len() || rules.is_empty() {
        return Err(MismatchedAnswer {
            expected: rules.len(),
            received: answer.results.len(),
        });
    }
    if answer.allowed {
        let tightest = most_restrictive_allowed(&answer.results);
        return Ok(Outcome::Allow {
            headers: rate_limit_headers(&answer.results[tightest], now_unix_ms),
        });
    }
    let refusing = refusing_rule(&answer.results);
    Ok(Outcome::Reply(too_many_requests(
        rules[refusing],
        &answer.results[refusing],
        now_unix_ms,
    )))
}

/// The outcome when the shim gave no usable answer (down, slow, garbage).
pub fn on_shim_failure(mode: FailureMode) -> Outcome {
    match mode {
        FailureMode::Open => Outcome::Allow { headers: Vec::new() },
        FailureMode::Closed => {
            let body = json!({
                "type": "about:blank",
                "title": "Service Unavailable",
                "status": 503,
                "detail": "The rate limiter could not reach its backend and is configured to fail closed.",
            });
            Outcome::Reply(LocalReply {
                status: 503,
                headers: vec![
                    ("content-type", PROBLEM_JSON.to_string()),
                    (RETRY_AFTER_HEADER, "1".to_string()),
                ],
                body: body.to_string(),
            })
        }
    }
}

/// Index of the result with the least headroom: fewest remaining, then longest reset.
fn most_restrictive_allowed(results: &[CheckResult]) -> usize {
    (0..results.len())
        .min_by_key(|&i| (results[i].remaining, std::cmp::Reverse(results[i].reset_ms)))
        .unwrap_or(0)
}

/// Index of the refusing result that keeps the client waiting longest.
fn refusing_rule(results: &[CheckResult]) -> usize {
    (0..results.len())
        .filter(|&i| !results[i].allowed)
        .max_by_key(|&i| results[i].retry_after_ms)
        .unwrap_or_else(|| most_restrictive_allowed(results))
}

fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `X-RateLimit-*` headers; the reset is the Unix time (seconds, rounded up) at which the
/// counter is back to its full limit.
pub fn rate_limit_headers(result: &CheckResult, now_unix_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        (LIMIT_HEADER, result.limit.to_string()),
        (REMAINING_HEADER, result.remaining.to_string()),
        (
            RESET_HEADER,
            ceil_seconds(now_unix_ms + result.reset_ms).to_string(),
        ),
    ]
}

/// The 429 reply: rate-limit headers, `Retry-After` in whole seconds rounded up (never
/// less than 1, so a client never retries before the refusing rule allows it), and an
/// RFC 9457 problem document naming the rule.
pub fn too_many_requests(rule: &Rule, result: &CheckResult, now_unix_ms: u64) -> LocalReply {
    let retry_after = ceil_seconds(result.retry_after_ms).max(1);
    let mut headers = rate_limit_headers(result, now_unix_ms);
    headers.push((RETRY_AFTER_HEADER, retry_after.to_string()));
    headers.push(("content-type", PROBLEM_JSON.to_string()));
    let body = json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!(
            "Rate limit '{}' exceeded: {} requests per {} ms. Retry in {} s.",
            rule.name, rule.limit, rule.period_ms, retry_after
        ),
        "rule": rule.name,
        "limit": rule.limit,
        "period_ms": rule.period_ms,
        "retry_after": retry_after,
    });
    LocalReply {
        status: 429,
        headers,
        body: body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyPart;
    use crate::wire::Algorithm;

    fn rule(name: &str, limit: u64) -> Rule {
        Rule {
            name: name.into(),
            key: vec![KeyPart::ClientIp],
            algorithm: Algorithm::TokenBucket,
            limit,
            period_ms: 60_000,
            cost: 1,
        }
    }

    fn result(allowed: bool, limit: u64, remaining: u64, reset_ms: u64, retry_after_ms: u64) -> CheckResult {
        CheckResult {
            allowed,
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            granted: if allowed { 1 } else { 0 },
        }
    }

    fn header<'a>(headers: &'a [(&'static str, String)], name: &str) -> &'a str {
        headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name}"))
    }

    const NOW_MS: u64 = 1_700_000_000_250;

    #[test]
    fn allowed_request_gets_the_tightest_rules_headers() {
        let (a, b) = (rule("a", 100), rule("b", 5));
        let answer = CheckResponse {
            allowed: true,
            results: vec![result(true, 100, 90, 6_000, 0), result(true, 5, 2, 36_000, 0)],
        };
        let Outcome::Allow { headers } = decide(&[&a, &b], &answer, NOW_MS).unwrap() else {
            panic!("expected allow")
        };
        assert_eq!(header(&headers, LIMIT_HEADER), "5");
        assert_eq!(header(&headers, REMAINING_HEADER), "2");
        // 1_700_000_000.250 s + 36 s, rounded up.
        assert_eq!(header(&headers, RESET_HEADER), "1700000037");
    }

    #[test]
    fn refusal_is_a_429_naming_the_refusing_rule() {
        let (a, b) = (rule("per-user", 100), rule("per-ip", 5));
        let answer = CheckResponse {
            allowed: false,
            results: vec![
                result(true, 100, 50, 30_000, 0),
                result(false, 5, 0, 60_000, 11_001),
            ],
        };
        let Outcome::Reply(reply) = decide(&[&a, &b], &answer, NOW_MS).unwrap() else {
            panic!("expected a reply")
        };
        assert_eq!(reply.status, 429);
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), "12");
        assert_eq!(header(&reply.headers, LIMIT_HEADER), "5");
        assert_eq!(header(&reply.headers, REMAINING_HEADER), "0");
        assert_eq!(header(&reply.headers, "content-type"), PROBLEM_JSON);
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["rule"], "per-ip");
        assert_eq!(body["status"], 429);
        assert_eq!(body["retry_after"], 12);
    }

    #[test]
    fn retry_after_is_never_zero() {
        let a = rule("a", 5);
        let reply = too_many_requests(&a, &result(false, 5, 0, 100, 1), NOW_MS);
        assert_eq!(header(&reply.headers, RETRY_AFTER_HEADER), "1");
    }

    #[test]
    fn answer_with_wrong_result_count_is_rejected() {
        let a = rule("a", 5);
        let answer = CheckResponse {
            allowed: true,
            results: vec![],
        };
        assert_eq!(
            decide(&[&a], &answer, NOW_MS),
            Err(MismatchedAnswer {
                expected: 1,
                received: 0
            })
        );
    }

    #[test]
    fn failure_modes() {
        assert_eq!(
            on_shim_failure(FailureMode::Open),
            Outcome::Allow { headers: vec![] }
        );
        let Outcome::Reply(reply) = on_shim_failure(FailureMode::Closed) else {
            panic!("closed must refuse")
        };
        assert_eq!(reply.status, 503);
    }
}
