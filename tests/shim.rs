//! The shim against real Redis: the token bucket's contract, atomicity across rules,
//! NOSCRIPT recovery, bad requests and the shared token.

mod support;

use serde_json::{json, Value};
use support::*;

fn check_body(checks: &[(&str, u64, u64, u64)]) -> String {
    let checks: Vec<Value> = checks
        .iter()
        .map(|(key, limit, period_ms, cost)| json!({ "key": key, "limit": limit, "period_ms": period_ms, "cost": cost }))
        .collect();
    json!({ "checks": checks }).to_string()
}

fn check(shim: &Shim, checks: &[(&str, u64, u64, u64)]) -> Value {
    let reply = post(&shim.url("/v1/check"), &[], &check_body(checks));
    assert_eq!(reply.status, 200, "{reply:?}");
    serde_json::from_str(&reply.body).unwrap()
}

#[test]
fn token_bucket_admits_its_capacity_then_refuses_until_a_token_refills() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    for expected_remaining in (0..3).rev() {
        let answer = check(&shim, &[("k", 3, 60_000, 1)]);
        assert_eq!(answer["allowed"], true);
        assert_eq!(answer["results"][0]["remaining"], expected_remaining);
    }
    let refused = check(&shim, &[("k", 3, 60_000, 1)]);
    assert_eq!(refused["allowed"], false);
    let retry_after = refused["results"][0]["retry_after_ms"].as_u64().unwrap();
    // One token every 20 s; the three were spent moments ago.
    assert!((15_000..=20_000).contains(&retry_after), "{retry_after}");
    let reset = refused["results"][0]["reset_ms"].as_u64().unwrap();
    assert!((55_000..=60_000).contains(&reset), "{reset}");
}

#[test]
fn bucket_refills_at_its_rate() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    // 2 tokens per 200 ms: drain, then wait for the bucket to report a refill.
    assert_eq!(check(&shim, &[("fast", 2, 200, 2)])["allowed"], true);
    assert_eq!(check(&shim, &[("fast", 2, 200, 1)])["allowed"], false);
    wait_until("refill", std::time::Duration::from_secs(5), || {
        check(&shim, &[("fast", 2, 200, 1)])["allowed"] == true
    });
}

#[test]
fn a_refused_rule_charges_no_other_rule() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let both = [("tight", 1, 60_000, 1), ("loose", 10, 60_000, 1)];
    assert_eq!(check(&shim, &both)["allowed"], true);
    let refused = check(&shim, &both);
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["results"][0]["allowed"], false);
    assert_eq!(refused["results"][1]["allowed"], true);
    // `loose` was charged once, by the first request only.
    assert_eq!(refused["results"][1]["remaining"], 9);
    assert_eq!(
        check(&shim, &[("loose", 10, 60_000, 1)])["results"][0]["remaining"],
        8
    );
}

#[test]
fn concurrent_checks_on_one_key_admit_exactly_the_limit() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let url = shim.url("/v1/check");
    let body = check_body(&[("contended", 50, 600_000, 1)]);
    let replies = concurrently(200, move |_| post(&url, &[], &body));
    assert_eq!(count_status(&replies, 200), 200);
    let admitted = replies
        .iter()
        .filter(|r| r.body.starts_with(r#"{"allowed":true"#))
        .count();
    assert_eq!(admitted, 50);
}

#[test]
fn script_is_reloaded_after_redis_forgets_it() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    assert_eq!(check(&shim, &[("k", 5, 60_000, 1)])["allowed"], true);
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    assert_eq!(check(&shim, &[("k", 5, 60_000, 1)])["results"][0]["remaining"], 3);
}

#[test]
fn bad_requests_get_400_and_touch_no_key() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let url = shim.url("/v1/check");
    let cases = [
        ("not json", "invalid check request"),
        (r#"{"checks": []}"#, "checks:"),
        (
            r#"{"checks": [{"key": "k", "limit": 0, "period_ms": 1000}]}"#,
            "checks[0].limit",
        ),
        (
            r#"{"checks": [{"key": "k", "limit": 5, "period_ms": 0}]}"#,
            "checks[0].period_ms",
        ),
        (
            r#"{"checks": [{"key": "k", "limit": 5, "period_ms": 1000, "cost": 6}]}"#,
            "checks[0].cost",
        ),
        (
            r#"{"checks": [{"key": "k", "limit": 5, "period_ms": 1000, "extra": 1}]}"#,
            "unknown field",
        ),
        (
            r#"{"checks": [{"key": "a b", "limit": 5, "period_ms": 1000}]}"#,
            "checks[0].key",
        ),
    ];
    for (body, expected) in cases {
        let reply = post(&url, &[], body);
        assert_eq!(reply.status, 400, "{body}: {reply:?}");
        assert!(reply.body.contains(expected), "{body}: {}", reply.body);
    }
    let huge = format!(
        r#"{{"checks": [{{"key": "{}", "limit": 5, "period_ms": 1000}}]}}"#,
        "k".repeat(20_000)
    );
    assert_eq!(post(&url, &[], &huge).status, 413);
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
}

#[test]
fn shared_token_is_required_when_configured() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--token", "s3cret"]);
    let url = shim.url("/v1/check");
    let body = check_body(&[("k", 5, 60_000, 1)]);
    assert_eq!(post(&url, &[], &body).status, 401);
    assert_eq!(post(&url, &[("x-ratelimit-token", "s3creT")], &body).status, 401);
    assert_eq!(post(&url, &[("x-ratelimit-token", "s3cret")], &body).status, 200);
    assert_eq!(redis.cli(&["DBSIZE"]), "1");
}

#[test]
fn health_follows_redis_and_checks_fail_fast_without_it() {
    let mut redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    assert_eq!(get(&shim.url("/healthz"), &[]).status, 200);
    redis.stop();
    assert_eq!(get(&shim.url("/healthz"), &[]).status, 503);
    let started = std::time::Instant::now();
    let reply = post(&shim.url("/v1/check"), &[], &check_body(&[("k", 5, 60_000, 1)]));
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(reply.body.contains("redis"), "{}", reply.body);
    // Fails within the Redis timeout (50 ms) plus scheduling slack, not after seconds.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
