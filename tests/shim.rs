//! The shim against real Redis: each algorithm's contract, the wire semantics shared by
//! all of them (all or nothing, shadow checks, leases), concurrency, the function library
//! loaded again when Redis forgets it, bad requests, the shared token, Redis AUTH, HTTP/2
//! cleartext and batches.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
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

#[test]
fn token_bucket_admits_its_capacity_then_refuses_until_a_token_refills() {
    let (_redis, shim) = started();
    let bucket = check_of("k", "token_bucket", 3, 60_000);
    for expected_remaining in (0..3).rev() {
        let answer = decide_one(&shim, &bucket);
        assert_eq!(answer["allowed"], true);
        assert_eq!(answer["results"][0]["remaining"], expected_remaining);
        assert_eq!(answer["results"][0]["granted"], 1);
    }
    let refused = decide_one(&shim, &bucket);
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["results"][0]["granted"], 0);
    // One token every 20 s; the three were spent moments ago.
    let retry_after = number(&refused, 0, "retry_after_ms");
    assert!((15_000..=20_000).contains(&retry_after), "{retry_after}");
    let reset = number(&refused, 0, "reset_ms");
    assert!((55_000..=60_000).contains(&reset), "{reset}");
}

// Regression: at a rate finer than Redis's time precision the charge did not move the
// TAT and the script sent `PX 0`, an error on every check (so the filter failed open).
#[test]
fn a_bucket_of_extreme_rate_still_answers() {
    let (_redis, shim) = started();
    let flood = check_of("flood", "token_bucket", 1_000_000_000, 1_000);
    for _ in 0..3 {
        assert_eq!(decide_one(&shim, &flood)["allowed"], true);
    }
}

#[test]
fn bucket_refills_at_its_rate() {
    let (_redis, shim) = started();
    // 2 tokens per 200 ms: drain, then wait for the bucket to report a refill.
    let bucket = |cost: u64| with(check_of("fast", "token_bucket", 2, 200), "cost", json!(cost));
    assert_eq!(decide(&shim, &[bucket(2)])["allowed"], true);
    assert_eq!(decide(&shim, &[bucket(1)])["allowed"], false);
    wait_until("refill", Duration::from_secs(5), || {
        decide(&shim, &[bucket(1)])["allowed"] == true
    });
}

#[test]
fn fixed_window_resets_at_the_aligned_window_end_in_redis_time() {
    let (redis, shim) = started();
    let window = check_of("fw", "fixed_window", 3, 60_000);
    let before = redis.time_ms();
    for expected_remaining in (0..3).rev() {
        assert_eq!(
            decide_one(&shim, &window)["results"][0]["remaining"],
            expected_remaining
        );
    }
    let refused = decide_one(&shim, &window);
    let after = redis.time_ms();
    assert_eq!(refused["allowed"], false);
    // Both the reset and the retry are the end of the window holding `now`, aligned to
    // multiples of the period (the test must not straddle a boundary to know which).
    let window_end = (before / 60_000 + 1) * 60_000;
    if after < window_end {
        for field in ["reset_ms", "retry_after_ms"] {
            let value = number(&refused, 0, field);
            assert!(
                (window_end - after..=window_end - before).contains(&value),
                "{field} {value}, window ends in {}..={}",
                window_end - after,
                window_end - before
            );
        }
    }
    // A short window: exhausted, then fully available once the next one begins.
    let short = check_of("fw-short", "fixed_window", 2, 300);
    let start = redis.time_ms();
    assert_eq!(
        decide(&shim, &[with(short.clone(), "cost", json!(2))])["allowed"],
        true
    );
    wait_for_redis_time(&redis, (start / 300 + 1) * 300);
    assert_eq!(decide_one(&shim, &short)["results"][0]["remaining"], 1);
}

#[test]
fn sliding_window_log_counts_each_token_for_exactly_one_period() {
    let (redis, shim) = started();
    let log = check_of("log", "sliding_window_log", 3, 1_000);
    let first_at = redis.time_ms();
    assert_eq!(decide_one(&shim, &log)["allowed"], true);
    wait_for_redis_time(&redis, first_at + 400);
    let answer = decide(&shim, &[with(log.clone(), "cost", json!(2))]);
    assert_eq!(answer["results"][0]["remaining"], 0);
    let refused = decide_one(&shim, &log);
    assert_eq!(refused["allowed"], false);
    // The first token leaves the window first: about 600 ms from now, not 1,000.
    let retry_after = number(&refused, 0, "retry_after_ms");
    assert!((1..=650).contains(&retry_after), "{retry_after}");
    // The last token leaves a full period after it was taken.
    let reset = number(&refused, 0, "reset_ms");
    assert!((900..=1_000).contains(&reset), "{reset}");
    wait_until("first token leaves the log", Duration::from_secs(5), || {
        decide_one(&shim, &log)["allowed"] == true
    });
    // Exactly one token came back: the two taken later still count.
    assert_eq!(decide_one(&shim, &log)["allowed"], false);
}

#[test]
fn sliding_window_counter_weighs_the_previous_window_by_its_overlap() {
    let (redis, shim) = started();
    let period = 2_000;
    let counter = check_of("swc", "sliding_window_counter", 10, period);
    let now = redis.time_ms();
    let mut boundary = (now / period + 1) * period;
    if boundary - now < 300 {
        boundary += period;
    }
    wait_for_redis_time(&redis, boundary - 250);
    // Fill the window ending at `boundary` with all 10 tokens.
    let filled = decide(&shim, &[with(counter.clone(), "cost", json!(10))]);
    assert_eq!(filled["allowed"], true);
    assert!(redis.time_ms() < boundary, "the fill straddled the boundary");
    // Half way through the next window, half of the previous window still counts.
    wait_for_redis_time(&redis, boundary + period / 2);
    let before = redis.time_ms();
    let answer = decide(&shim, &[with(counter, "cost", json!(1))]);
    let after = redis.time_ms();
    let remaining = number(&answer, 0, "remaining");
    // remaining = floor(10 - 10 * (1 - elapsed / period)) - 1, elapsed in before..=after.
    let bound = |at: u64| (10.0 * (at - boundary) as f64 / period as f64).floor() as u64 - 1;
    assert!(
        (bound(before)..=bound(after) + 1).contains(&remaining),
        "{remaining} not in {}..={}",
        bound(before),
        bound(after) + 1
    );
    assert_eq!(answer["allowed"], true);
}

#[test]
fn a_refused_rule_charges_no_other_rule_of_any_algorithm() {
    let (_redis, shim) = started();
    let mut layered: Vec<Value> = ALGORITHMS
        .iter()
        .map(|algorithm| check_of(&format!("loose-{algorithm}"), algorithm, 10, 60_000))
        .collect();
    layered.push(check_of("tight", "sliding_window_log", 1, 60_000));
    assert_eq!(decide(&shim, &layered)["allowed"], true);
    let refused = decide(&shim, &layered);
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["results"][4]["allowed"], false);
    for (i, algorithm) in ALGORITHMS.iter().enumerate() {
        assert_eq!(refused["results"][i]["allowed"], true, "{algorithm}");
        assert_eq!(refused["results"][i]["granted"], 0, "{algorithm}");
        // Charged once, by the first request only.
        assert_eq!(refused["results"][i]["remaining"], 9, "{algorithm}");
        let alone = decide(&shim, &[layered[i].clone()]);
        assert_eq!(alone["results"][0]["remaining"], 8, "{algorithm}");
    }
}

#[test]
fn shadow_checks_count_but_never_refuse() {
    let (_redis, shim) = started();
    for algorithm in ALGORITHMS {
        let enforcing = check_of(&format!("enforcing-{algorithm}"), algorithm, 2, 60_000);
        let shadow = with(
            check_of(&format!("shadow-{algorithm}"), algorithm, 1, 60_000),
            "shadow",
            json!(true),
        );
        let first = decide(&shim, &[enforcing.clone(), shadow.clone()]);
        assert_eq!(first["allowed"], true, "{algorithm}");
        assert_eq!(
            first["results"][1]["granted"], 1,
            "{algorithm}: a shadow check that admits is charged"
        );
        let second = decide(&shim, &[enforcing.clone(), shadow.clone()]);
        assert_eq!(
            second["allowed"], true,
            "{algorithm}: the shadow check does not refuse"
        );
        assert_eq!(second["results"][1]["allowed"], false, "{algorithm}");
        assert!(number(&second, 1, "retry_after_ms") > 0, "{algorithm}");
        assert_eq!(second["results"][1]["granted"], 0, "{algorithm}");
        assert_eq!(second["results"][0]["remaining"], 0, "{algorithm}");
        // The enforcing check now refuses: nothing is charged, shadow included.
        let third = decide(&shim, &[enforcing, shadow]);
        assert_eq!(third["allowed"], false, "{algorithm}");
        assert_eq!(third["results"][1]["granted"], 0, "{algorithm}");
    }
}

#[test]
fn a_lease_is_granted_at_most_half_of_what_is_available_and_never_past_its_window() {
    let (_redis, shim) = started();
    for algorithm in ALGORITHMS {
        let lease = with(
            check_of(&format!("lease-{algorithm}"), algorithm, 10, 600_000),
            "lease",
            json!(4),
        );
        let answers: Vec<Value> = (0..5).map(|_| decide_one(&shim, &lease)).collect();
        let granted: Vec<u64> = answers.iter().map(|a| number(a, 0, "granted")).collect();
        // 10 available: 4; 6: 3; then single tokens as the counter nears its limit.
        assert_eq!(granted, vec![4, 3, 1, 1, 1], "{algorithm}");
        let window = answers[0]["results"][0]["lease_window_ms"].as_u64().unwrap_or(0);
        match algorithm {
            "token_bucket" => assert_eq!(window, 0, "a bucket has no window"),
            "sliding_window_log" => assert_eq!(window, 600_000, "{algorithm}"),
            _ => assert!(window > 0 && window <= 600_000, "{algorithm}: {window}"),
        }
        let refused = decide_one(&shim, &lease);
        assert_eq!(refused["allowed"], false, "{algorithm}");
        assert_eq!(refused["results"][0]["remaining"], 0, "{algorithm}");
    }
}

#[test]
fn concurrent_checks_on_one_key_admit_exactly_the_limit() {
    let (_redis, shim) = started();
    // 1,000 checks over 100 connections, each kept alive for 10 sequential checks.
    let body = checks_body(&[check_of("contended", "token_bucket", 100, 600_000)]);
    let replies = load(&shim.url("/v1/check"), 100, 10, move |_, _| body.clone());
    assert_eq!(count_status(&replies, 200), 1_000);
    assert_eq!(count_allowed(&replies), 100);
}

#[test]
fn concurrent_checks_admit_exactly_the_limit_under_every_algorithm() {
    let (_redis, shim) = started();
    let bodies: Vec<String> = ALGORITHMS
        .iter()
        .map(|algorithm| {
            checks_body(&[check_of(
                &format!("contended-{algorithm}"),
                algorithm,
                50,
                600_000,
            )])
        })
        .collect();
    let replies = load(&shim.url("/v1/check"), 40, 20, move |t, i| {
        bodies[(t + i) % 4].clone()
    });
    assert_eq!(count_status(&replies, 200), 800);
    // `load` returns thread 0's replies in order, then thread 1's, ...
    let which = |n: usize| (n / 20 + n % 20) % 4;
    for (a, algorithm) in ALGORITHMS.iter().enumerate() {
        let of_this_key: Vec<&Reply> = replies
            .iter()
            .enumerate()
            .filter(|(n, _)| which(*n) == a)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(of_this_key.len(), 200, "{algorithm}");
        let admitted = of_this_key
            .iter()
            .filter(|r| r.body.starts_with(r#"{"allowed":true"#))
            .count();
        assert_eq!(admitted, 50, "{algorithm}");
    }
}

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
fn a_batch_decides_each_request_on_its_own_in_order() {
    let (redis, shim) = started();
    let url = shim.url("/v1/check-batch");
    // Exhausted beforehand: the batch's requests run concurrently, so none of them may
    // depend on another's effect.
    let one = check_of("one", "token_bucket", 1, 60_000);
    assert_eq!(decide_one(&shim, &one)["allowed"], true);
    let batch = json!({ "requests": [
        { "checks": [check_of("fresh", "token_bucket", 3, 60_000)] },
        { "checks": [check_of("bad", "token_bucket", 0, 60_000)] },
        // Refused by `one`, so `other` is not charged either: all or nothing per request.
        { "checks": [one.clone(), check_of("other", "fixed_window", 5, 60_000)] },
        { "checks": [check_of("other", "fixed_window", 5, 60_000)] },
    ]});
    let reply = post(&url, &[], &batch.to_string());
    assert_eq!(reply.status, 200, "{reply:?}");
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let responses = answer["responses"].as_array().unwrap();
    assert_eq!(responses.len(), 4, "{answer}");
    assert_eq!(responses[0]["decided"]["results"][0]["remaining"], 2, "{answer}");
    let failure = responses[1]["failed"].as_str().unwrap();
    assert!(failure.contains("checks[0].limit"), "{failure}");
    assert_eq!(responses[2]["decided"]["allowed"], false, "{answer}");
    assert_eq!(responses[2]["decided"]["results"][1]["granted"], 0, "{answer}");
    assert_eq!(responses[3]["decided"]["results"][0]["remaining"], 4, "{answer}");
    assert_eq!(
        redis.cli(&["DBSIZE"]),
        "3",
        "one, fresh and other; nothing for the invalid request"
    );

    let too_many = json!({ "requests": vec![json!({ "checks": [one] }); 33] });
    let reply = post(&url, &[], &too_many.to_string());
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(reply.body.contains("requests"), "{reply:?}");
}

/// Concurrent callers' requests may share one function call (the shim merges them); each
/// is still decided all or nothing on its own and answered with its own rows.
#[test]
fn concurrent_callers_are_each_decided_on_their_own() {
    let (redis, shim) = started();
    let url = shim.url("/v1/check-batch");
    let (callers, calls) = (16, 12);
    // Each caller's own bucket admits 5, a bucket all share admits 50 (an hour's period:
    // nothing refills during the test). 80 requests fit their own bucket, so exactly 50
    // are admitted, and a request the shared bucket refuses charges its own nothing.
    let body = |caller: usize| {
        json!({ "requests": [{ "checks": [
            check_of(&format!("own-{caller}"), "token_bucket", 5, 3_600_000),
            check_of("shared", "token_bucket", 50, 3_600_000),
        ] }] })
        .to_string()
    };
    let warm = json!({ "requests": [{ "checks": [check_of("warm", "token_bucket", 1, 60_000)] }] });
    assert_eq!(post(&url, &[], &warm.to_string()).status, 200);
    let before = redis.scripts_run();
    let per_caller: Vec<(usize, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..callers)
            .map(|caller| {
                let (url, body) = (&url, body(caller));
                scope.spawn(move || {
                    let agent = agent();
                    let mut admitted = 0;
                    let mut last = Value::Null;
                    for _ in 0..calls {
                        let reply = post_with(&agent, url, &body);
                        assert_eq!(reply.status, 200, "{reply:?}");
                        let answer: Value = serde_json::from_str(&reply.body).unwrap();
                        last = answer["responses"][0]["decided"].clone();
                        if last["allowed"] == true {
                            admitted += 1;
                        }
                    }
                    (admitted, last)
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    let admitted: usize = per_caller.iter().map(|(admitted, _)| admitted).sum();
    assert_eq!(admitted, 50, "{per_caller:?}");
    for (caller_admitted, last) in &per_caller {
        assert!(*caller_admitted <= 5, "{per_caller:?}");
        // The caller's own bucket holds exactly its admitted requests' charges.
        assert_eq!(last["results"][0]["remaining"], 5 - caller_admitted, "{last}");
    }
    let scripts = redis.scripts_run() - before;
    assert!(scripts <= (callers * calls) as u64, "{scripts} calls");
    eprintln!("{} requests in {scripts} function calls", callers * calls);
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
fn a_full_batch_is_not_held_to_the_single_check_body_limit() {
    let (redis, shim) = started();
    let requests: Vec<Value> = (0..32)
        .map(|request| {
            let checks: Vec<Value> = (0..4)
                .map(|check| {
                    let key = format!("{request:02}-{check}-{}", "k".repeat(190));
                    check_of(&key, "token_bucket", 5, 60_000)
                })
                .collect();
            json!({ "checks": checks })
        })
        .collect();
    let body = json!({ "requests": requests }).to_string();
    assert!(body.len() > 16 * 1024, "{} bytes", body.len());
    let reply = post(&shim.url("/v1/check-batch"), &[], &body);
    assert_eq!(reply.status, 200, "{reply:?}");
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let allowed = answer["responses"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|response| response["decided"]["allowed"] == true)
        .count();
    assert_eq!(allowed, 32, "{answer}");
    assert_eq!(redis.cli(&["DBSIZE"]), "128");
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

#[test]
fn unspent_leased_tokens_given_back_are_available_again() {
    let (_redis, shim) = started();
    for algorithm in ALGORITHMS {
        let key = format!("give-back-{algorithm}");
        let lease = with(check_of(&key, algorithm, 10, 600_000), "lease", json!(4));
        let granted = decide_one(&shim, &lease);
        assert_eq!(number(&granted, 0, "granted"), 4, "{algorithm}");
        let stamp = granted["results"][0]["stamp"].as_i64().unwrap_or(0);
        let peek = |check: &Value| number(&decide_one(&shim, check), 0, "remaining");
        let one = check_of(&key, algorithm, 10, 600_000);
        // 4 granted, 1 more taken by this look: 5 left.
        assert_eq!(peek(&one), 5, "{algorithm}");
        // The Envoy spent one of its four and gives back three, with no request at all.
        let back = json!({ "requests": [], "returns": [{ "key": key, "algorithm": algorithm,
                           "limit": 10, "period_ms": 600_000, "amount": 3, "stamp": stamp }] });
        let reply = post(&shim.url("/v1/check-batch"), &[], &back.to_string());
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(
            peek(&one),
            7,
            "{algorithm}: the three came back (and one more was taken)"
        );
    }
}
