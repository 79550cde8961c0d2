//! What only a standalone Redis shows, each test on a Redis of its own: the function
//! library loaded again when Redis forgets it, every key's expiry, the keys bad requests
//! leave untouched, the key prefix, the shared token, Redis ACLs and AUTH, HTTP/2
//! cleartext, and the function calls a batch costs. The behaviour every backend shares is
//! in the suite (`suite/`).

mod support;

use serde_json::{json, Value};
use support::*;

fn started() -> (Redis, Shim) {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    (redis, shim)
}

fn decide(shim: &Shim, checks: &[Value]) -> Value {
    decide_at(&shim.url("/v1/check"), checks)
}

fn decide_one(shim: &Shim, check: &Value) -> Value {
    decide(shim, std::slice::from_ref(check))
}

fn number(answer: &Value, check: usize, field: &str) -> u64 {
    answer["results"][check][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {answer}"))
}

// Regression: at a rate finer than Redis's time precision the charge did not move the
// TAT and the script sent `PX 0`, an error on every check (so the filter failed open).

#[test]
fn functions_are_loaded_again_after_redis_forgets_them() {
    let (redis, shim) = started();
    let bucket = check_of("k", "token_bucket", 5, 60_000);
    assert_eq!(decide_one(&shim, &bucket)["allowed"], true);
    assert!(redis.cli(&["FUNCTION", "LIST"]).contains("ratelimit_"));
    assert_eq!(redis.cli(&["FUNCTION", "FLUSH"]), "OK");
    assert_eq!(redis.cli(&["FUNCTION", "LIST"]), "");
    assert_eq!(decide_one(&shim, &bucket)["results"][0]["remaining"], 3);
    assert!(redis.cli(&["FUNCTION", "LIST"]).contains("ratelimit_"));
}

#[test]
fn every_written_key_expires() {
    let (redis, shim) = started();
    for algorithm in ALGORITHMS {
        decide(
            &shim,
            &[check_of(&format!("ttl-{algorithm}"), algorithm, 5, 60_000)],
        );
        let ttl: i64 = redis
            .cli(&["PTTL", &format!("rl:ttl-{algorithm}")])
            .parse()
            .unwrap();
        assert!((1..=120_000).contains(&ttl), "{algorithm}: PTTL {ttl}");
    }
}

#[test]
fn bad_requests_get_400_and_touch_no_key() {
    let (redis, shim) = started();
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
            r#"{"checks": [{"key": "k", "limit": 5, "period_ms": 1000, "lease": 6}]}"#,
            "checks[0].lease",
        ),
        (
            r#"{"checks": [{"key": "k", "limit": 5, "period_ms": 1000, "extra": 1}]}"#,
            "unknown field",
        ),
        (
            r#"{"checks": [{"key": "k", "algorithm": "leaky_bucket", "limit": 5, "period_ms": 1000}]}"#,
            "unknown variant",
        ),
        (
            r#"{"checks": [{"key": "k", "algorithm": "sliding_window_log", "limit": 10001, "period_ms": 1000}]}"#,
            "checks[0].limit",
        ),
        (
            r#"{"checks": [{"key": "a b", "limit": 5, "period_ms": 1000}]}"#,
            "checks[0].key",
        ),
        (
            r#"{"checks": [{"key": "k", "limit": 5, "period_ms": 1000}, {"key": "k", "limit": 5, "period_ms": 1000}]}"#,
            "duplicate",
        ),
    ];
    for (body, expected) in cases {
        let reply = post(&url, &[], body);
        assert_eq!(reply.status, 400, "{body}: {reply:?}");
        assert!(reply.body.contains(expected), "{body}: {}", reply.body);
    }
    let long_key = checks_body(&[check_of(&"k".repeat(201), "token_bucket", 5, 1000)]);
    assert_eq!(post(&url, &[], &long_key).status, 400);
    let huge = checks_body(&[check_of(&"k".repeat(20_000), "token_bucket", 5, 1000)]);
    let reply = post(&url, &[], &huge);
    assert_eq!(reply.status, 413, "{reply:?}");
    assert!(reply.body.contains("bytes"), "{}", reply.body);
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
}

#[test]
fn keys_are_namespaced_by_the_configured_prefix() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--key-prefix", "tenant-a:"]);
    decide(&shim, &[check_of("r:{h}", "fixed_window", 5, 60_000)]);
    assert_eq!(redis.cli(&["KEYS", "*"]), "tenant-a:r:{h}");
}

#[test]
fn shared_token_is_required_when_configured() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--token", "s3cret"]);
    let url = shim.url("/v1/check");
    let body = checks_body(&[check_of("k", "token_bucket", 5, 60_000)]);
    assert_eq!(post(&url, &[], &body).status, 401);
    assert_eq!(post(&url, &[("x-ratelimit-token", "s3creT")], &body).status, 401);
    assert_eq!(post(&url, &[("x-ratelimit-token", "s3cret")], &body).status, 200);
    assert_eq!(redis.cli(&["DBSIZE"]), "1");
}

#[test]
fn a_redis_without_functions_is_named_in_the_error() {
    // FCALL renamed away: what a Redis older than 7.0 answers to it.
    let redis = Redis::start_with(&["--rename-command", "FCALL", "fcall-hidden"], None);
    let shim = Shim::start(&redis.url(), &[]);
    let reply = post(
        &shim.url("/v1/check"),
        &[],
        &checks_body(&[check_of("k", "token_bucket", 5, 60_000)]),
    );
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(reply.body.contains("Redis 7.0 or later is required"), "{reply:?}");
}

#[test]
fn a_redis_user_limited_as_docs_shim_md_says_runs_every_algorithm() {
    // The ACL that docs/SHIM.md gives for the shim's user: its functions and the commands
    // they run, on its keys only.
    let redis = Redis::start_with(
        &[
            "--user",
            "shim",
            "on",
            ">s3cret",
            "~rl:*",
            "+@scripting",
            "+@read",
            "+@write",
            "+time",
            "+ping",
        ],
        None,
    );
    let shim = Shim::start(&format!("redis://shim:s3cret@127.0.0.1:{}", redis.port), &[]);
    assert_eq!(get(&shim.url("/readyz"), &[]).status, 200);
    for algorithm in ALGORITHMS {
        let answer = decide_one(
            &shim,
            &check_of(&format!("acl-{algorithm}"), algorithm, 5, 60_000),
        );
        assert_eq!(answer["allowed"], true, "{algorithm}: {answer}");
    }
}

#[test]
fn redis_auth_from_the_url() {
    let redis = Redis::start_with(&["--requirepass", "hunter2"], Some("hunter2"));
    let good = Shim::start(&format!("redis://:hunter2@127.0.0.1:{}", redis.port), &[]);
    assert_eq!(
        decide(&good, &[check_of("k", "token_bucket", 5, 60_000)])["allowed"],
        true
    );
    assert_eq!(get(&good.url("/readyz"), &[]).status, 200);
    let wrong = Shim::start(&format!("redis://:wrong@127.0.0.1:{}", redis.port), &[]);
    let reply = post(
        &wrong.url("/v1/check"),
        &[],
        &checks_body(&[check_of("k", "token_bucket", 5, 60_000)]),
    );
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(get(&wrong.url("/readyz"), &[]).status, 503);
}

#[test]
fn serves_http2_cleartext_and_http1_keep_alive() {
    let (_redis, shim) = started();
    let body = checks_body(&[check_of("h2", "token_bucket", 5, 60_000)]);
    let url = shim.url("/v1/check");
    // Prior-knowledge HTTP/2, as Envoy speaks it when the shim's cluster has
    // `http2_protocol_options`. (One request per curl: curl 7.88 fails to reuse an h2c
    // connection, whatever the server.)
    for expected_remaining in [4, 3] {
        let output = std::process::Command::new("curl")
            .args([
                "-s",
                "--http2-prior-knowledge",
                "-H",
                "content-type: application/json",
            ])
            .args(["-w", "\n%{http_version} %{response_code}", "-d", &body, &url])
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.ends_with("\n2 200"), "{text}");
        assert!(
            text.contains(&format!("\"remaining\":{expected_remaining}")),
            "{text}"
        );
    }
    let agent = agent();
    for _ in 0..3 {
        assert_eq!(post_with(&agent, &url, &body).status, 200);
    }
}

#[test]
fn a_batch_is_one_script_on_a_standalone_redis() {
    let (redis, shim) = started();
    let url = shim.url("/v1/check-batch");
    let batch = |keys: &[&str]| {
        let requests: Vec<Value> = keys
            .iter()
            .map(|key| json!({ "checks": [check_of(key, "token_bucket", 2, 60_000), check_of(&format!("{key}-ip"), "fixed_window", 1, 60_000)] }))
            .collect();
        json!({ "requests": requests }).to_string()
    };
    // Loads the library (a missing function costs a second call).
    assert_eq!(post(&url, &[], &batch(&["warm"])).status, 200);
    let before = redis.scripts_run();
    let keys = ["a", "b", "c", "d", "e", "f", "g", "a"];
    let reply = post(&url, &[], &batch(&keys));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(redis.scripts_run(), before + 1, "eight requests, one script");
    // Each request on its own and in order: the second "a" finds the first one's charge
    // on its fixed window of 1 and is refused, charging its bucket nothing.
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let responses = answer["responses"].as_array().unwrap();
    for response in &responses[..7] {
        assert_eq!(response["decided"]["allowed"], true, "{answer}");
    }
    assert_eq!(responses[7]["decided"]["allowed"], false, "{answer}");
    assert_eq!(responses[7]["decided"]["results"][0]["granted"], 0, "{answer}");
    assert_eq!(responses[7]["decided"]["results"][0]["remaining"], 1, "{answer}");

    // A command failing on one request's key fails that request alone.
    redis.cli(&["LPUSH", "rl:broken", "not a counter"]);
    let reply = post(&url, &[], &batch(&["h", "broken", "i"]));
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let responses = answer["responses"].as_array().unwrap();
    assert_eq!(responses[0]["decided"]["allowed"], true, "{answer}");
    let failure = responses[1]["failed"].as_str().unwrap_or_default();
    assert!(failure.contains("WRONGTYPE"), "{answer}");
    assert_eq!(responses[2]["decided"]["allowed"], true, "{answer}");
}

#[test]
fn a_batch_larger_than_the_in_flight_bound_decides_what_fits() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--max-in-flight", "2"]);
    let requests: Vec<Value> = (0..5)
        .map(|n| json!({ "checks": [check_of(&format!("k{n}"), "token_bucket", 5, 60_000)] }))
        .collect();
    let reply = post(
        &shim.url("/v1/check-batch"),
        &[],
        &json!({ "requests": requests }).to_string(),
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let responses = answer["responses"].as_array().unwrap();
    assert_eq!(responses[0]["decided"]["allowed"], true, "{answer}");
    assert_eq!(responses[1]["decided"]["allowed"], true, "{answer}");
    for refused in &responses[2..] {
        let reason = refused["failed"].as_str().unwrap_or_default();
        assert!(reason.contains("overloaded"), "{answer}");
    }
    assert_eq!(redis.cli(&["DBSIZE"]), "2", "the refused were not charged");
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(
        metrics.contains(r#"rlshim_requests_total{endpoint="check",outcome="overloaded"} 3"#),
        "{metrics}"
    );
}

#[test]
fn a_batch_needs_the_shared_token_too() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--token", "s3cret"]);
    let url = shim.url("/v1/check-batch");
    let body = json!({ "requests": [{ "checks": [check_of("k", "token_bucket", 5, 60_000)] }] }).to_string();
    assert_eq!(post(&url, &[], &body).status, 401);
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    assert_eq!(post(&url, &[("x-ratelimit-token", "s3cret")], &body).status, 200);
    assert_eq!(redis.cli(&["DBSIZE"]), "1");
}

#[test]
fn a_batch_returns_and_settles_in_one_call() {
    let (redis, shim) = started();
    // Two requests charged 4 each on one bucket of 10: 2 left.
    let charged = with(
        check_of("adjusted", "token_bucket", 10, 600_000),
        "cost",
        json!(4),
    );
    for _ in 0..2 {
        assert_eq!(decide_one(&shim, &charged)["allowed"], true);
    }
    let before = redis.scripts_run();
    // One gives back 3 unspent tokens; the other reported a real cost of 1 (3 back).
    let adjust = json!({
        "requests": [],
        "returns": [{ "key": "adjusted", "algorithm": "token_bucket", "limit": 10, "period_ms": 600_000, "amount": 3 }],
        "settlements": [{ "key": "adjusted", "algorithm": "token_bucket", "limit": 10, "period_ms": 600_000,
                          "charged": 4, "actual": 1 }],
    });
    let reply = post(&shim.url("/v1/check-batch"), &[], &adjust.to_string());
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        redis.scripts_run(),
        before + 1,
        "returns and settlements in one call"
    );
    let peek = decide_one(&shim, &check_of("adjusted", "token_bucket", 10, 600_000));
    assert_eq!(
        number(&peek, 0, "remaining"),
        7,
        "2 left, 3 + 3 back, 1 taken by the look"
    );
}
