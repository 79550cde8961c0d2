//! The boundary burst under each algorithm: `limit` requests just before a window
//! boundary and `limit` just after it, limit 100 per period. The shape is 100 per
//! 60 s; a 3 s period keeps the test short, and the backend's own clock (the scripts'
//! clock) places the bursts. Expected: fixed window 200, sliding log 100, sliding counter
//! close to 100, token bucket its capacity plus what refilled between the bursts. The
//! four algorithms' bursts go together (each caller's batch holds one request of each),
//! around one boundary, so a backend waits for one.

use super::support::*;
use serde_json::{json, Value};

const LIMIT: u64 = 100;
const PERIOD_MS: u64 = 3_000;
const ALGORITHMS: [&str; 4] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];

struct Burst {
    /// Admitted requests, per algorithm of [`ALGORITHMS`].
    admitted: [u64; 4],
    /// The backend's time just before the first request and just after the last answer.
    started_ms: u64,
    ended_ms: u64,
}

/// `LIMIT` callers at once, each posting a batch of one request per algorithm (each
/// request decided on its own) to the checks of `attempt`.
fn burst(backend: Backend, shim: &Shim, attempt: usize) -> Burst {
    let url = shim.url("/v1/check-batch");
    let requests: Vec<Value> = ALGORITHMS
        .iter()
        .map(|algorithm| {
            let check = check_of(
                &format!("burst-{attempt}-{algorithm}"),
                algorithm,
                LIMIT,
                PERIOD_MS,
            );
            json!({ "checks": [check] })
        })
        .collect();
    let body = json!({ "requests": requests }).to_string();
    let started_ms = backend.time_ms();
    let replies = concurrently(LIMIT as usize, move |_| post(&url, &[], &body));
    let ended_ms = backend.time_ms();
    let mut admitted = [0; 4];
    for reply in &replies {
        assert_eq!(reply.status, 200, "{reply:?}");
        let answer: Value = serde_json::from_str(&reply.body).unwrap();
        for (count, response) in admitted.iter_mut().zip(answer["responses"].as_array().unwrap()) {
            assert!(response["decided"].is_object(), "{answer}");
            *count += u64::from(response["decided"]["allowed"] == true);
        }
    }
    Burst {
        admitted,
        started_ms,
        ended_ms,
    }
}

/// Runs the two bursts; returns them and the boundary between them.
fn boundary_bursts(backend: Backend) -> (Burst, Burst, u64) {
    let shim = backend.shim(&[]);
    // The function library loaded on every master, and a cluster's map read, before the
    // bursts (the first calls of a fresh shim cost Redis more).
    burst(backend, &shim, usize::MAX);
    for attempt in 0..3 {
        let now = backend.time_ms();
        let mut boundary = (now / PERIOD_MS + 1) * PERIOD_MS;
        if boundary - now < 1_000 {
            boundary += PERIOD_MS;
        }
        backend.wait_for_time(boundary - 700);
        let before = burst(backend, &shim, attempt);
        if before.ended_ms >= boundary {
            // A slow machine let the first burst straddle the boundary: start again
            // with fresh keys rather than assert on the wrong shape.
            continue;
        }
        backend.wait_for_time(boundary);
        let after = burst(backend, &shim, attempt);
        eprintln!(
            "{backend:?}: {:?} admitted in {}..{} ms before the boundary, {:?} in {}..{} ms after",
            before.admitted,
            boundary - before.ended_ms,
            boundary - before.started_ms,
            after.admitted,
            after.started_ms - boundary,
            after.ended_ms - boundary,
        );
        return (before, after, boundary);
    }
    panic!("the first burst never fit in the 700 ms before a boundary");
}

/// Tokens a bucket of LIMIT per PERIOD_MS refills in `ms`.
fn refill(ms: u64) -> u64 {
    LIMIT * ms / PERIOD_MS
}

fn each_algorithm_admits_its_own_shape_across_a_boundary(backend: Backend) {
    let (before, after, boundary) = boundary_bursts(backend);
    assert_eq!(
        before.admitted, [100; 4],
        "each algorithm admits its limit at first"
    );
    let [fixed_window, sliding_log, sliding_counter, token_bucket] = after.admitted;
    assert_eq!(fixed_window, 100, "a fixed window admits its limit again");
    assert!(after.ended_ms < before.started_ms + PERIOD_MS);
    assert_eq!(sliding_log, 0, "a sliding log admits exactly the limit");
    // The previous window still weighs 1 - elapsed / period: only the elapsed fraction
    // of the limit passes after the boundary.
    let most = refill(after.ended_ms - boundary) + 1;
    assert!(
        sliding_counter <= most,
        "{sliding_counter} admitted after the boundary by the sliding counter, at most {most} expected"
    );
    // Boundaries mean nothing to a bucket: after its capacity, only what refilled.
    let least = refill(after.started_ms - before.ended_ms).saturating_sub(1);
    let most = refill(after.ended_ms - before.started_ms) + 1;
    assert!(
        (least..=most).contains(&token_bucket),
        "{token_bucket} admitted after the boundary by the bucket, expected {least}..={most}"
    );
}

on_every_backend!(each_algorithm_admits_its_own_shape_across_a_boundary);
