//! Requests over several rules' keys as a cluster splits them: keys sharing a hash tag
//! decided in one atomic script, and a request whose keys span masters all or nothing
//! (the slots it charged first refunded). On a standalone Redis and in memory every key is
//! in one call's reach, and the answers are the same.

use super::support::*;
use serde_json::{json, Value};

fn decide(shim: &Shim, checks: &[Value]) -> Value {
    decide_at(&shim.url("/v1/check"), checks)
}

/// The cluster slot of `key`, as Redis computes it: CRC16 of its hash tag (the first
/// non-empty `{...}`), or of the whole key without one.
fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(bytes)) % 16_384
}

/// Two hash tags whose slots lie on different masters of a three-master cluster (slots
/// split evenly: 0..5461, 5461..10923, 10923..16384).
fn tags_on_different_masters() -> (String, String) {
    let on_master = |master: u16| {
        (0..)
            .map(|i| format!("master{master}-client-{i}"))
            .find(|tag| slot(&format!("{{{tag}}}")) / 5461 == master)
            .unwrap()
    };
    (on_master(0), on_master(1))
}

fn rules_sharing_a_hash_tag_are_one_atomic_script(backend: Backend) {
    let shim = backend.shim(&[]);
    let per_minute = check_of("per-minute:{user-1}", "fixed_window", 1, 60_000);
    let per_day = check_of("per-day:{user-1}", "sliding_window_log", 10, 86_400_000);
    assert_eq!(slot("per-minute:{user-1}"), slot("per-day:{user-1}"));
    assert_eq!(
        decide(&shim, &[per_minute.clone(), per_day.clone()])["allowed"],
        true
    );
    let refused = decide(&shim, &[per_minute, per_day]);
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["results"][1]["remaining"], 9);
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(metrics.contains("rlshim_slot_refunds_total 0\n"), "{metrics}");
}

fn a_request_spanning_slots_is_all_or_nothing_under_every_algorithm(backend: Backend) {
    let shim = backend.shim(&[]);
    let (tag_a, tag_b) = tags_on_different_masters();
    for algorithm in ALGORITHMS {
        // The loose rule's slot is checked (and charged) first; the tight one refuses.
        let loose = check_of(&format!("loose-{algorithm}:{{{tag_a}}}"), algorithm, 10, 600_000);
        let tight = check_of(&format!("tight-{algorithm}:{{{tag_b}}}"), algorithm, 1, 600_000);
        let first = decide(&shim, &[loose.clone(), tight.clone()]);
        assert_eq!(first["allowed"], true, "{algorithm}");
        assert_eq!(first["results"][0]["granted"], 1, "{algorithm}");
        let refused = decide(&shim, &[loose.clone(), tight.clone()]);
        assert_eq!(refused["allowed"], false, "{algorithm}");
        assert_eq!(refused["results"][0]["allowed"], true, "{algorithm}");
        assert_eq!(refused["results"][0]["granted"], 0, "{algorithm}: refunded");
        assert_eq!(
            refused["results"][0]["remaining"], 9,
            "{algorithm}: state after the refund"
        );
        assert_eq!(refused["results"][1]["allowed"], false, "{algorithm}");
        // The refund was exact: the loose rule was charged by the first request only.
        let alone = decide(&shim, std::slice::from_ref(&loose));
        assert_eq!(alone["results"][0]["remaining"], 8, "{algorithm}");
        // The other order: the refusing slot first, the later slot only peeked at.
        let reversed = decide(&shim, &[tight, loose.clone()]);
        assert_eq!(reversed["allowed"], false, "{algorithm}");
        assert_eq!(reversed["results"][1]["granted"], 0, "{algorithm}");
        assert_eq!(reversed["results"][1]["remaining"], 8, "{algorithm}");
    }
    // Slot by slot, with a refund, only where the slots are on different masters.
    let refunds = if backend == Backend::Cluster { 4 } else { 0 };
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(
        metrics.contains(&format!("rlshim_slot_refunds_total {refunds}\n")),
        "{metrics}"
    );
    assert!(metrics.contains("rlshim_refund_failures_total 0\n"), "{metrics}");
}

fn concurrent_requests_spanning_slots_admit_exactly_the_tighter_limit(backend: Backend) {
    let shim = backend.shim(&[]);
    let (tag_a, tag_b) = tags_on_different_masters();
    // Every request is charged on the loose slot first; 900 of them are refunded there
    // when the tight slot refuses. The loose log ends with exactly the 100 admitted.
    let loose = check_of(
        &format!("loose:{{{tag_a}}}"),
        "sliding_window_log",
        1_000,
        600_000,
    );
    let tight = check_of(&format!("tight:{{{tag_b}}}"), "token_bucket", 100, 600_000);
    let body = checks_body(&[loose.clone(), tight]);
    let replies = load(&shim.url("/v1/check"), 100, 10, move |_, _| body.clone());
    assert_eq!(count_status(&replies, 200), 1_000);
    assert_eq!(count_allowed(&replies), 100);
    let loose_key = format!("{}loose:{{{tag_a}}}", shim.key_prefix());
    if let Some(entries) = backend.cli(&["ZCARD", &loose_key]) {
        assert_eq!(entries, "100");
    }
    assert_eq!(
        decide(&shim, &[with(loose, "cost", json!(1))])["results"][0]["remaining"],
        899
    );
}

on_every_backend!(
    rules_sharing_a_hash_tag_are_one_atomic_script,
    a_request_spanning_slots_is_all_or_nothing_under_every_algorithm,
    concurrent_requests_spanning_slots_admit_exactly_the_tighter_limit,
);
