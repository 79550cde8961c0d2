//! The store in memory held to Redis's answers: one sequence of checks, batches, returns
//! and settlements over every algorithm (leases, shadow checks and refusals included) is
//! sent step by step to a shim on each backend, and every answer from memory and from the
//! Cluster must equal the standalone Redis's. The counters, grants and decisions must be
//! equal; the durations (reset, retry, lease window) may differ by the moments between
//! the backends' calls. Periods of an hour keep every step within one window.

use super::support::*;
use serde_json::{json, Value};

/// Most a duration may differ between two backends answering one step, ms.
const TOLERANCE_MS: i64 = 250;

const HOUR_MS: u64 = 3_600_000;

/// The steps: (path, body) of each request, in order.
fn sequence() -> Vec<(&'static str, Value)> {
    let mut steps = Vec::new();
    let every = [
        "token_bucket",
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "concurrency",
    ];
    for algorithm in every {
        let plain = check_of(&format!("plain-{algorithm}"), algorithm, 3, HOUR_MS);
        // Three admitted, then refused, with every field of the answer compared.
        for _ in 0..4 {
            steps.push(("/v1/check", json!({ "checks": [plain] })));
        }
        if algorithm == "concurrency" {
            continue;
        }
        let costly = with(
            check_of(&format!("cost-{algorithm}"), algorithm, 10, HOUR_MS),
            "cost",
            json!(4),
        );
        let lease = with(
            check_of(&format!("lease-{algorithm}"), algorithm, 10, HOUR_MS),
            "lease",
            json!(4),
        );
        let shadow = with(
            check_of(&format!("shadow-{algorithm}"), algorithm, 1, HOUR_MS),
            "shadow",
            json!(true),
        );
        for _ in 0..3 {
            steps.push(("/v1/check", json!({ "checks": [costly, shadow] })));
            steps.push(("/v1/check", json!({ "checks": [lease] })));
        }
        // A batch: each request on its own, one refused by its tight rule.
        let tight = check_of(&format!("tight-{algorithm}"), algorithm, 1, HOUR_MS);
        let batch = json!({ "requests": [
            { "checks": [costly] },
            { "checks": [tight, lease] },
            { "checks": [tight, lease] },
        ]});
        steps.push(("/v1/check-batch", batch));
        // Returns and settlements, then a look at what they left.
        let back = json!({ "requests": [{ "checks": [costly] }],
            "returns": [{ "key": format!("lease-{algorithm}"), "algorithm": algorithm,
                          "limit": 10, "period_ms": HOUR_MS, "amount": 2 }],
            "settlements": [{ "key": format!("cost-{algorithm}"), "algorithm": algorithm,
                              "limit": 10, "period_ms": HOUR_MS, "charged": 4, "actual": 9 }] });
        if algorithm != "sliding_window_log" {
            steps.push(("/v1/check-batch", back));
        }
        steps.push(("/v1/check", json!({ "checks": [lease, costly] })));
    }
    // Keys of one algorithm read by another: Redis refuses the type, and so must memory.
    let clash = check_of("plain-token_bucket", "fixed_window", 3, HOUR_MS);
    steps.push(("/v1/check-batch", json!({ "requests": [{ "checks": [clash] }] })));
    steps
}

/// `answer` with the durations and stamps taken out (into `durations` and `stamps`), and
/// an error naming a key of the wrong type reduced to that.
fn split(answer: &Value, durations: &mut Vec<i64>, stamps: &mut Vec<i64>) -> Value {
    match answer {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, value)| {
                    let number = value.as_i64().unwrap_or(0);
                    match name.as_str() {
                        "reset_ms" | "retry_after_ms" | "lease_window_ms" => durations.push(number),
                        "stamp" => stamps.push(number),
                        _ => return (name.clone(), split(value, durations, stamps)),
                    }
                    (name.clone(), Value::Null)
                })
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| split(item, durations, stamps)).collect())
        }
        Value::String(text) if text.contains("WRONGTYPE") => Value::String("WRONGTYPE".into()),
        other => other.clone(),
    }
}

/// Two answers agree: equal but for durations and stamps, durations within the
/// tolerance, stamps both zero or both not (a stamp names an instant of each backend's).
fn assert_agree(step: usize, request: &Value, expected: &Value, actual: &Value, backend: Backend) {
    let (mut expected_durations, mut expected_stamps) = (Vec::new(), Vec::new());
    let (mut actual_durations, mut actual_stamps) = (Vec::new(), Vec::new());
    let expected_shape = split(expected, &mut expected_durations, &mut expected_stamps);
    let actual_shape = split(actual, &mut actual_durations, &mut actual_stamps);
    let context =
        format!("step {step} on {backend:?}: {request}\nstandalone: {expected}\n{backend:?}: {actual}");
    assert_eq!(expected_shape, actual_shape, "{context}");
    for (e, a) in expected_durations.iter().zip(&actual_durations) {
        assert!((e - a).abs() <= TOLERANCE_MS, "{context}");
    }
    for (e, a) in expected_stamps.iter().zip(&actual_stamps) {
        assert_eq!(*e == 0, *a == 0, "{context}");
    }
}

#[test]
fn memory_and_cluster_answer_every_step_as_standalone_redis_does() {
    let shims: Vec<(Backend, Shim)> = [Backend::Standalone, Backend::Memory, Backend::Cluster]
        .into_iter()
        .map(|backend| (backend, backend.shim(&[])))
        .collect();
    for (step, (path, body)) in sequence().into_iter().enumerate() {
        let answers: Vec<(Backend, Value)> = shims
            .iter()
            .map(|(backend, shim)| {
                let reply = post(&shim.url(path), &[], &body.to_string());
                assert_eq!(reply.status, 200, "step {step} on {backend:?}: {reply:?}");
                (*backend, serde_json::from_str(&reply.body).unwrap())
            })
            .collect();
        let (_, standalone) = &answers[0];
        for (backend, answer) in &answers[1..] {
            assert_agree(step, &body, standalone, answer, *backend);
        }
    }
}
