//! Each algorithm's contract over HTTP, and the semantics all of them share: all or
//! nothing, shadow checks, leases, concurrent checks on one key.

use super::support::*;
use serde_json::{json, Value};
use std::time::Duration;

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

fn token_bucket_admits_its_capacity_then_refuses_until_a_token_refills(backend: Backend) {
    let shim = backend.shim(&[]);
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

fn a_bucket_of_extreme_rate_still_answers(backend: Backend) {
    let shim = backend.shim(&[]);
    let flood = check_of("flood", "token_bucket", 1_000_000_000, 1_000);
    for _ in 0..3 {
        assert_eq!(decide_one(&shim, &flood)["allowed"], true);
    }
}

fn bucket_refills_at_its_rate(backend: Backend) {
    let shim = backend.shim(&[]);
    // 2 tokens per 200 ms: drain, then wait for the bucket to report a refill.
    let bucket = |cost: u64| with(check_of("fast", "token_bucket", 2, 200), "cost", json!(cost));
    assert_eq!(decide(&shim, &[bucket(2)])["allowed"], true);
    assert_eq!(decide(&shim, &[bucket(1)])["allowed"], false);
    wait_until("refill", Duration::from_secs(5), || {
        decide(&shim, &[bucket(1)])["allowed"] == true
    });
}

fn fixed_window_resets_at_the_aligned_window_end_in_redis_time(backend: Backend) {
    let shim = backend.shim(&[]);
    let window = check_of("fw", "fixed_window", 3, 60_000);
    let before = backend.time_ms();
    for expected_remaining in (0..3).rev() {
        assert_eq!(
            decide_one(&shim, &window)["results"][0]["remaining"],
            expected_remaining
        );
    }
    let refused = decide_one(&shim, &window);
    let after = backend.time_ms();
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
    let start = backend.time_ms();
    assert_eq!(
        decide(&shim, &[with(short.clone(), "cost", json!(2))])["allowed"],
        true
    );
    backend.wait_for_time((start / 300 + 1) * 300);
    assert_eq!(decide_one(&shim, &short)["results"][0]["remaining"], 1);
}

fn sliding_window_log_counts_each_token_for_exactly_one_period(backend: Backend) {
    let shim = backend.shim(&[]);
    let log = check_of("log", "sliding_window_log", 3, 1_000);
    let first_at = backend.time_ms();
    assert_eq!(decide_one(&shim, &log)["allowed"], true);
    backend.wait_for_time(first_at + 400);
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

fn sliding_window_counter_weighs_the_previous_window_by_its_overlap(backend: Backend) {
    let shim = backend.shim(&[]);
    let period = 2_000;
    let counter = check_of("swc", "sliding_window_counter", 10, period);
    let now = backend.time_ms();
    let mut boundary = (now / period + 1) * period;
    if boundary - now < 300 {
        boundary += period;
    }
    backend.wait_for_time(boundary - 250);
    // Fill the window ending at `boundary` with all 10 tokens.
    let filled = decide(&shim, &[with(counter.clone(), "cost", json!(10))]);
    assert_eq!(filled["allowed"], true);
    assert!(backend.time_ms() < boundary, "the fill straddled the boundary");
    // Half way through the next window, half of the previous window still counts.
    backend.wait_for_time(boundary + period / 2);
    let before = backend.time_ms();
    let answer = decide(&shim, &[with(counter, "cost", json!(1))]);
    let after = backend.time_ms();
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

fn a_refused_rule_charges_no_other_rule_of_any_algorithm(backend: Backend) {
    let shim = backend.shim(&[]);
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

fn shadow_checks_count_but_never_refuse(backend: Backend) {
    let shim = backend.shim(&[]);
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

fn a_lease_is_granted_at_most_half_of_what_is_available_and_never_past_its_window(backend: Backend) {
    let shim = backend.shim(&[]);
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

fn concurrent_checks_on_one_key_admit_exactly_the_limit(backend: Backend) {
    let shim = backend.shim(&[]);
    // 1,000 checks over 100 connections, each kept alive for 10 sequential checks.
    let body = checks_body(&[check_of("contended", "token_bucket", 100, 600_000)]);
    let replies = load(&shim.url("/v1/check"), 100, 10, move |_, _| body.clone());
    assert_eq!(count_status(&replies, 200), 1_000);
    assert_eq!(count_allowed(&replies), 100);
}

fn concurrent_checks_admit_exactly_the_limit_under_every_algorithm(backend: Backend) {
    let shim = backend.shim(&[]);
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

on_every_backend!(
    token_bucket_admits_its_capacity_then_refuses_until_a_token_refills,
    a_bucket_of_extreme_rate_still_answers,
    bucket_refills_at_its_rate,
    fixed_window_resets_at_the_aligned_window_end_in_redis_time,
    sliding_window_log_counts_each_token_for_exactly_one_period,
    sliding_window_counter_weighs_the_previous_window_by_its_overlap,
    a_refused_rule_charges_no_other_rule_of_any_algorithm,
    shadow_checks_count_but_never_refuse,
    a_lease_is_granted_at_most_half_of_what_is_available_and_never_past_its_window,
    concurrent_checks_on_one_key_admit_exactly_the_limit,
    concurrent_checks_admit_exactly_the_limit_under_every_algorithm,
);
