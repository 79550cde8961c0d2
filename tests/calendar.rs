//! Calendar quotas end to end: real Envoy loading the built filter, the shim and Redis.
//! A daily quota whose local midnight the test places a few seconds ahead in Redis time
//! (by choosing the rule's `utc_offset`), a monthly quota, and configurations real Envoy
//! refuses naming the field.

mod support;

use ratelimit_wire::calendar::UtcOffset;
use ratelimit_wire::{CalendarUnit, CalendarWindow};
use serde_json::{json, Value};
use support::*;

const MS_PER_MINUTE: u64 = 60_000;
const MINUTES_PER_DAY: i64 = 24 * 60;

fn quotas(daily_offset: &str) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        "response": { "headers": "both" },
        "rules": [
            { "name": "daily", "key": [{ "header": "x-api-key" }], "limit": 3,
              "calendar": "day", "utc_offset": daily_offset },
            { "name": "monthly", "key": [{ "header": "x-month-key" }], "limit": 2,
              "calendar": "month", "utc_offset": "-03:30" }
        ]
    })
}

/// The UTC offset (in use: -12:00..=+14:00) at which `utc_ms`, a whole minute, is
/// midnight.
fn offset_with_midnight_at(utc_ms: u64) -> i32 {
    let minute_of_day = ((utc_ms / MS_PER_MINUTE) as i64).rem_euclid(MINUTES_PER_DAY);
    let mut offset = (-minute_of_day).rem_euclid(MINUTES_PER_DAY);
    if offset > 14 * 60 {
        offset -= MINUTES_PER_DAY;
    }
    offset as i32
}

fn seconds_ceil(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The `t` of one rule in a draft `RateLimit` header.
fn draft_t(reply: &Reply, rule: &str) -> u64 {
    let header = reply.header("ratelimit").expect("a RateLimit header");
    let item = header
        .split(", ")
        .find(|item| item.starts_with(&format!("\"{rule}\"")))
        .unwrap_or_else(|| panic!("no {rule} in {header}"));
    item.split(';')
        .find_map(|param| param.strip_prefix("t="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no t in {item}"))
}

fn assert_within_a_second(actual: u64, low: u64, high: u64, what: &str) {
    assert!(
        (low.saturating_sub(1)..=high + 1).contains(&actual),
        "{what}: {actual} outside {low}..={high} (give or take a second's rounding)"
    );
}

#[test]
fn a_daily_quota_refuses_until_midnight_at_its_offset_then_admits_a_full_quota() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let mut lds = LdsEnvoy::start(shim.port, &quotas("+00:00"));
    // Midnight 3..63 s ahead of Redis time, at the offset that puts it there. A push
    // that left too little time before it to exhaust the quota (a loaded machine) is
    // retried with a later one.
    let midnight_ms = loop {
        let midnight_ms = (redis.time_ms() + 3_000).div_ceil(MS_PER_MINUTE) * MS_PER_MINUTE;
        let offset = UtcOffset(offset_with_midnight_at(midnight_ms)).to_string();
        assert_eq!(lds.push(&quotas(&offset)), Push::Accepted);
        if redis.time_ms() + 5_000 < midnight_ms {
            break midnight_ms;
        }
    };
    let url = lds.envoy.url("/");
    let key = [("x-api-key", "customer-1")];
    for remaining in (0..3).rev() {
        let reply = get(&url, &key);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.number("x-ratelimit-remaining"), remaining);
        assert_eq!(reply.header("ratelimit-policy"), Some(r#""daily";q=3;w=86400"#));
    }
    let before_ms = redis.time_ms();
    let refused = get(&url, &key);
    let after_ms = redis.time_ms();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(after_ms < midnight_ms, "the refusal came after midnight");
    let (low, high) = (
        seconds_ceil(midnight_ms - after_ms),
        seconds_ceil(midnight_ms - before_ms),
    );
    assert_within_a_second(refused.number("retry-after"), low, high, "Retry-After");
    assert_within_a_second(draft_t(&refused, "daily"), low, high, "RateLimit t");
    let midnight_s = midnight_ms / 1000;
    assert_within_a_second(
        refused.number("x-ratelimit-reset"),
        midnight_s,
        midnight_s,
        "X-RateLimit-Reset",
    );
    let problem: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(problem["calendar"], "day", "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("3 per day (UTC"),
        "{problem}"
    );
    // Still refused just before midnight, admitted with a full quota after it.
    assert_eq!(get(&url, &key).status, 429);
    wait_for_redis_time(&redis, midnight_ms);
    let admitted = get(&url, &key);
    assert_eq!(admitted.status, 200, "{admitted:?}");
    assert_eq!(admitted.number("x-ratelimit-remaining"), 2);
}

#[test]
fn a_monthly_quota_refuses_until_the_first_of_next_month_at_its_offset() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let envoy = Envoy::start(shim.port, &quotas("+00:00"));
    let url = envoy.url("/");
    let key = [("x-month-key", "customer-1")];
    for _ in 0..2 {
        assert_eq!(get(&url, &key).status, 200);
    }
    let before_ms = redis.time_ms();
    let refused = get(&url, &key);
    let after_ms = redis.time_ms();
    assert_eq!(refused.status, 429, "{refused:?}");
    let month = CalendarWindow {
        unit: CalendarUnit::Month,
        offset_minutes: -210,
    };
    let (start_ms, next_month_ms) = month.window_at(before_ms as i64);
    assert!(after_ms < next_month_ms as u64, "the test ran across a month end");
    let next_month_ms = next_month_ms as u64;
    let (low, high) = (
        seconds_ceil(next_month_ms - after_ms),
        seconds_ceil(next_month_ms - before_ms),
    );
    assert_within_a_second(refused.number("retry-after"), low, high, "Retry-After");
    assert_within_a_second(draft_t(&refused, "monthly"), low, high, "RateLimit t");
    assert_within_a_second(
        refused.number("x-ratelimit-reset"),
        next_month_ms / 1000,
        next_month_ms / 1000,
        "X-RateLimit-Reset",
    );
    // `w` is this month's length: 28 to 31 days.
    let month_seconds = (next_month_ms - start_ms as u64) / 1000;
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(format!(r#""monthly";q=2;w={month_seconds}"#).as_str())
    );
    let problem: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(problem["utc_offset"], "-03:30", "{problem}");
}

#[test]
fn real_envoy_refuses_a_bad_calendar_naming_the_field() {
    let rule = |extra: Value| {
        let mut rule = json!({ "name": "quota", "key": [{ "header": "x-api-key" }], "limit": 5 });
        for (field, value) in extra.as_object().unwrap() {
            rule[field] = value.clone();
        }
        json!({ "shim_cluster": "ratelimit_shim", "rules": [rule] })
    };
    let cases = [
        (
            rule(json!({ "calendar": "day", "period": "1d" })),
            "rules[0].calendar",
        ),
        (
            rule(json!({ "calendar": "month", "utc_offset": "+5:30" })),
            "rules[0].utc_offset",
        ),
        (
            rule(json!({ "calendar": "week", "algorithm": "token_bucket" })),
            "rules[0].algorithm",
        ),
    ];
    for (config, field) in cases {
        let (ok, output) = envoy_validate_plugin(&config);
        assert!(!ok, "{config} was accepted");
        assert!(output.contains("invalid plugin configuration"), "{output}");
        assert!(output.contains(field), "{config}: expected {field} in\n{output}");
    }
    let (ok, output) = envoy_validate_plugin(&rule(json!({ "calendar": "week", "utc_offset": "+14:00" })));
    assert!(ok, "{output}");
}
