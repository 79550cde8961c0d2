//! The rate-limit headers of a response, in every dialect clients read.
//!
//! Client libraries each read one dialect (see docs/CONFIG.md's table): GitHub-style
//! `X-RateLimit-*` with a Unix reset, Envoy's `DRAFT_VERSION_03`, the IETF draft's -06
//! separate fields (express-rate-limit's `draft-6`), -07's combined `RateLimit` field, and
//! -10/-11's structured `RateLimit-Policy` and `RateLimit` lists. [`write`] renders the
//! configured ones; all of them describe the same decision. A refused rule's reset is the
//! time its retry is admitted, the same instant `Retry-After` names.

use crate::config::{Form, ResponseSettings};
use crate::judged::{Headers, Judged};
use crate::wire::{Check, Refill};

pub use crate::config::{POLICY_HEADER, RATELIMIT_HEADER, RETRY_AFTER_HEADER, RETRY_AFTER_MS_HEADER};

pub fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `Retry-After` of a refusal: whole seconds rounded up, never 0, so a client that obeys
/// it never comes back before the refusing rule admits it.
pub fn retry_after_seconds(retry_after_ms: u64) -> u64 {
    ceil_seconds(retry_after_ms).max(1)
}

/// Milliseconds until a rule's reset, as every dialect but -11 tells it: for a refused
/// rule until its retry is admitted (never before `Retry-After`), otherwise until its
/// counter is full again. `None` for a concurrency limit that admits: its slots free as
/// requests end, which nothing foretells.
fn reset_ms(judged: &Judged<'_>) -> Option<u64> {
    let result = &judged.result;
    if !result.allowed {
        Some(result.retry_after_ms.max(1))
    } else if judged.check.algorithm.traits().counts_in_flight {
        None
    } else {
        Some(result.reset_ms)
    }
}

/// draft-11's effective window `t`: the whole seconds within which no more than the
/// available quota may be used, so rounded down; for a refused rule the wait `Retry-After`
/// names. Known where the counter says when the next unit comes: a window's end, a token
/// bucket's next token. Unknown (no `t`) for the sliding algorithms and a concurrency
/// limit, whose next unit depends on entries the answer does not carry.
fn effective_window_seconds(judged: &Judged<'_>) -> Option<u64> {
    let Judged { check, result, .. } = judged;
    if !result.allowed {
        return Some(retry_after_seconds(result.retry_after_ms));
    }
    let next_unit_ms = match check.algorithm.traits().refill {
        Refill::AtWindowEnd => result.reset_ms,
        Refill::Continuously => {
            // reset_ms is the time to refill (limit - tokens); the next whole token comes
            // (limit - remaining - 1) token intervals before that.
            let later_tokens = u128::from(check.limit.saturating_sub(result.remaining + 1));
            let interval_ms = u128::from(check.period_ms) * later_tokens / u128::from(check.limit.max(1));
            u64::try_from(u128::from(result.reset_ms).saturating_sub(interval_ms)).unwrap_or(u64::MAX)
        }
        Refill::AsEntriesAge | Refill::WhenARequestEnds => return None,
    };
    Some(next_unit_ms / 1000)
}

/// A policy's window in seconds: the period, or for a calendar rule the length of the
/// calendar window holding now (a month of 28 to 31 days, a day, a week).
fn window_seconds(check: &Check, now_unix_ms: u64) -> u64 {
    let window_ms = match check.calendar {
        Some(calendar) => calendar.length_at(i64::try_from(now_unix_ms).unwrap_or(i64::MAX)),
        None => check.period_ms,
    };
    ceil_seconds(window_ms).max(1)
}

/// The structured `RateLimit-Policy` item of a rule (-10, -11): a rate's quota over its
/// window `w`, or a concurrency limit's quota of requests in flight (`qu`).
fn structured_policy(judged: &Judged<'_>, now_unix_ms: u64) -> String {
    let Judged { rule, check, .. } = judged;
    if check.algorithm.traits().counts_in_flight {
        format!("\"{}\";q={};qu=\"concurrent-requests\"", rule.name, check.limit)
    } else {
        let window = window_seconds(check, now_unix_ms);
        format!("\"{}\";q={};w={window}", rule.name, check.limit)
    }
}

/// The `RateLimit-Policy` of -06 and -07 (`10;w=60`) for the tightest rule: one quota,
/// and a window unless it is a concurrency limit.
fn legacy_policy(judged: &Judged<'_>, now_unix_ms: u64) -> String {
    if judged.check.algorithm.traits().counts_in_flight {
        judged.check.limit.to_string()
    } else {
        format!(
            "{};w={}",
            judged.check.limit,
            window_seconds(judged.check, now_unix_ms)
        )
    }
}

/// Envoy's `X-RateLimit-Limit`: the tightest rule's limit, then each rule's quota policy
/// (`, 10;w=60;name="per-ip"`; a concurrency limit has no window and so no policy item).
fn envoy_quota_policy(tightest: &Judged<'_>, enforcing: &[&Judged<'_>], now_unix_ms: u64) -> String {
    let mut value = tightest.result.limit.to_string();
    for judged in enforcing {
        if !judged.check.algorithm.traits().counts_in_flight {
            let window = window_seconds(judged.check, now_unix_ms);
            value.push_str(&format!(
                ", {};w={window};name=\"{}\"",
                judged.check.limit, judged.rule.name
            ));
        }
    }
    value
}

/// Every configured dialect's headers for this decision. `tightest` is the rule that
/// refused, else the one with the least headroom: the dialects with one quota tell its.
pub fn write(
    enforcing: &[&Judged<'_>],
    tightest: &Judged<'_>,
    now_unix_ms: u64,
    settings: &ResponseSettings,
) -> Headers {
    let result = &tightest.result;
    let reset = reset_ms(tightest).unwrap_or(result.reset_ms);
    let mut headers: Headers = Vec::new();
    for (name, form) in &settings.written_headers {
        let value = match *form {
            Form::Limit => result.limit.to_string(),
            Form::Remaining => result.remaining.to_string(),
            Form::UnixTime => ceil_seconds(now_unix_ms.saturating_add(reset)).to_string(),
            Form::Seconds => ceil_seconds(reset).to_string(),
            // Only refusals say how long to wait.
            Form::Milliseconds if result.allowed => continue,
            Form::Milliseconds => result.retry_after_ms.max(1).to_string(),
            Form::EnvoyQuotaPolicy => envoy_quota_policy(tightest, enforcing, now_unix_ms),
            Form::LegacyPolicy => legacy_policy(tightest, now_unix_ms),
            Form::CombinedDraft7 => format!(
                "limit={}, remaining={}, reset={}",
                result.limit,
                result.remaining,
                ceil_seconds(reset)
            ),
            Form::StructuredPolicy => list(enforcing, |j| structured_policy(j, now_unix_ms)),
            Form::StructuredDraft10 => list(enforcing, |j| service_limit(j, reset_ms(j).map(ceil_seconds))),
            Form::StructuredDraft11 => list(enforcing, |j| service_limit(j, effective_window_seconds(j))),
        };
        headers.push((name.clone(), value));
    }
    headers
}

/// A `RateLimit` item of -10 or -11: the rule, its `r` and, when known, its `t`.
fn service_limit(judged: &Judged<'_>, t: Option<u64>) -> String {
    let item = format!("\"{}\";r={}", judged.rule.name, judged.result.remaining);
    match t {
        Some(t) => format!("{item};t={t}"),
        None => item,
    }
}

fn list(enforcing: &[&Judged<'_>], item: impl Fn(&Judged<'_>) -> String) -> String {
    enforcing.iter().map(|j| item(j)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FilterConfig;
    use crate::judged::fixtures::{check_for, result};
    use crate::response::{decide, Outcome};
    use crate::wire::Check;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const NOW_MS: u64 = 1_700_000_000_250;

    /// A per-user token bucket of 10 a minute and a global fixed window of 100 a minute.
    fn config(headers: &str) -> FilterConfig {
        let json = format!(
            r#"{{"shim_cluster": "c", "response": {{"headers": {headers}}}, "rules": [
                {{"name": "per_user", "key": ["client_ip"], "limit": 10, "period": "1m"}},
                {{"name": "global", "key": [{{"constant": "all"}}], "algorithm": "fixed_window", "limit": 100, "period": "1m"}}]}}"#
        );
        FilterConfig::from_json(json.as_bytes()).unwrap()
    }

    /// The headers of a response where per_user has 4 left (full again in 35.5 s, its
    /// next token in 5.5 s) and global 90 (its window ends in 20.2 s), or of the refusal
    /// when per_user has none (its next token in 2.5 s).
    fn headers(dialects: &str, refused: bool) -> Vec<(String, String)> {
        let config = config(dialects);
        let checks: Vec<Check> = config.rules.iter().map(|r| check_for(r)).collect();
        let per_user = if refused {
            result(false, 10, 0, 56_500, 2_500)
        } else {
            result(true, 10, 4, 35_500, 0)
        };
        let results = [per_user, result(true, 100, 90, 20_200, 0)];
        let judged: Vec<Judged<'_>> = config
            .rules
            .iter()
            .zip(&checks)
            .zip(results)
            .map(|((rule, check), result)| Judged { rule, check, result })
            .collect();
        match decide(&judged, NOW_MS, &config.response) {
            Outcome::Allow { headers } => headers,
            Outcome::Reply(reply) => reply.headers,
            Outcome::Spill(spill) => panic!("no rule spills here: {spill:?}"),
        }
    }

    fn get<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn each_dialect_tells_the_tightest_rule_in_its_own_form() {
        let x = headers(r#""x-ratelimit""#, false);
        assert_eq!(get(&x, "x-ratelimit-limit"), Some("10"));
        assert_eq!(get(&x, "x-ratelimit-remaining"), Some("4"));
        assert_eq!(get(&x, "x-ratelimit-reset"), Some("1700000036"));
        let seconds = headers(r#""x-ratelimit-seconds""#, false);
        assert_eq!(get(&seconds, "x-ratelimit-reset"), Some("36"));
        let envoy = headers(r#""envoy-draft-03""#, false);
        assert_eq!(
            get(&envoy, "x-ratelimit-limit"),
            Some(r#"10, 10;w=60;name="per_user", 100;w=60;name="global""#)
        );
        assert_eq!(get(&envoy, "x-ratelimit-reset"), Some("36"));
        let draft6 = headers(r#""draft-6""#, false);
        assert_eq!(get(&draft6, "ratelimit-limit"), Some("10"));
        assert_eq!(get(&draft6, "ratelimit-remaining"), Some("4"));
        assert_eq!(get(&draft6, "ratelimit-reset"), Some("36"));
        assert_eq!(get(&draft6, "ratelimit-policy"), Some("10;w=60"));
        let draft7 = headers(r#""draft-7""#, false);
        assert_eq!(get(&draft7, "ratelimit"), Some("limit=10, remaining=4, reset=36"));
        assert_eq!(get(&draft7, "ratelimit-policy"), Some("10;w=60"));
        let draft10 = headers(r#""draft-10""#, false);
        assert_eq!(
            get(&draft10, "ratelimit-policy"),
            Some(r#""per_user";q=10;w=60, "global";q=100;w=60"#)
        );
        assert_eq!(
            get(&draft10, "ratelimit"),
            Some(r#""per_user";r=4;t=36, "global";r=90;t=21"#)
        );
        // -11: no more than r within t: the next token in 5.5 s, the window's end in 20.2 s.
        let draft11 = headers(r#""draft-11""#, false);
        assert_eq!(
            get(&draft11, "ratelimit"),
            Some(r#""per_user";r=4;t=5, "global";r=90;t=20"#)
        );
        assert_eq!(get(&draft11, "retry-after-ms"), None);
    }

    #[test]
    fn on_a_refusal_every_reset_is_the_instant_retry_after_names() {
        let all = headers(r#"["x-ratelimit", "draft-6", "draft-7", "retry-after-ms"]"#, true);
        assert_eq!(get(&all, "retry-after"), Some("3"));
        assert_eq!(get(&all, "retry-after-ms"), Some("2500"));
        assert_eq!(get(&all, "x-ratelimit-reset"), Some("1700000003"));
        assert_eq!(get(&all, "x-ratelimit-remaining"), Some("0"));
        assert_eq!(get(&all, "ratelimit-reset"), Some("3"));
        assert_eq!(get(&all, "ratelimit"), Some("limit=10, remaining=0, reset=3"));
        // draft-6 and draft-7 share one RateLimit-Policy.
        assert_eq!(all.iter().filter(|(n, _)| n == "ratelimit-policy").count(), 1);
        for draft in ["draft-10", "draft-11"] {
            let structured = headers(&format!("{draft:?}"), true);
            assert!(
                get(&structured, "ratelimit")
                    .unwrap()
                    .starts_with(r#""per_user";r=0;t=3, "#),
                "{draft}: {structured:?}"
            );
        }
    }
}
