//! Batches (`POST /v1/check-batch`): each request decided on its own, concurrent callers
//! merged, tokens returned and costs settled.

use super::support::*;
use serde_json::{json, Value};

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

fn a_batch_decides_each_request_on_its_own_in_order(backend: Backend) {
    let shim = backend.shim(&[]);
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
    if let Some(keys) = backend.key_count(&shim) {
        assert_eq!(keys, 3, "one, fresh and other; nothing for the invalid request");
    }

    let too_many = json!({ "requests": vec![json!({ "checks": [one] }); 33] });
    let reply = post(&url, &[], &too_many.to_string());
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(reply.body.contains("requests"), "{reply:?}");
}

/// Concurrent callers' requests may share one function call (the shim merges them); each
/// is still decided all or nothing on its own and answered with its own rows.
fn concurrent_callers_are_each_decided_on_their_own(backend: Backend) {
    let shim = backend.shim(&[]);
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
}

fn unspent_leased_tokens_given_back_are_available_again(backend: Backend) {
    let shim = backend.shim(&[]);
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

fn a_full_batch_is_not_held_to_the_single_check_body_limit(backend: Backend) {
    let shim = backend.shim(&[]);
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
    if let Some(keys) = backend.key_count(&shim) {
        assert_eq!(keys, 128);
    }
}

on_every_backend!(
    a_batch_decides_each_request_on_its_own_in_order,
    concurrent_callers_are_each_decided_on_their_own,
    unspent_leased_tokens_given_back_are_available_again,
    a_full_batch_is_not_held_to_the_single_check_body_limit,
);
