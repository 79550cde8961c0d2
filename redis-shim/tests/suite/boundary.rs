//! The boundary burst under each algorithm: `limit` requests just before a window
//! boundary and `limit` just after it, limit 100 per period. The shape is 100 per
//! 60 s; a 3 s period keeps the test short, and the backend's own clock (the scripts'
//! clock) places the bursts. Expected: fixed window 200, sliding log 100, sliding counter close
//! to 100, token bucket its capacity plus what refilled between the bursts.

use super::support::*;
use serde_json::Value;

const LIMIT: u64 = 100;
const PERIOD_MS: u64 = 3_000;

struct Burst {
    admitted: u64,
    /// The backend's time just before the first request and just after the last answer.
    started_ms: u64,
    ended_ms: u64,
}

fn burst(backend: Backend, shim: &Shim, check: &Value) -> Burst {
    let (url, body) = (shim.url("/v1/check"), checks_body(std::slice::from_ref(check)));
    let started_ms = backend.time_ms();
    let replies = concurrently(LIMIT as usize, move |_| post(&url, &[], &body));
    let ended_ms = backend.time_ms();
    assert_eq!(count_status(&replies, 200), LIMIT as usize);
    Burst {
        admitted: count_allowed(&replies) as u64,
        started_ms,
        ended_ms,
    }
}

/// Runs the two bursts; returns them and the boundary between them.
fn boundary_bursts(backend: Backend, algorithm: &str) -> (Burst, Burst, u64) {
    let shim = backend.shim(&[]);
    for attempt in 0..3 {
        let check = check_of(&format!("burst-{attempt}"), algorithm, LIMIT, PERIOD_MS);
        let now = backend.time_ms();
        let mut boundary = (now / PERIOD_MS + 1) * PERIOD_MS;
        if boundary - now < 1_000 {
            boundary += PERIOD_MS;
        }
        backend.wait_for_time(boundary - 700);
        let before = burst(backend, &shim, &check);
        if before.ended_ms >= boundary {
            // A slow machine let the first burst straddle the boundary: start again
            // with a fresh key rather than assert on the wrong shape.
            continue;
        }
        backend.wait_for_time(boundary);
        let after = burst(backend, &shim, &check);
        eprintln!(
            "{algorithm}: {} admitted in {}..{} ms before the boundary, {} in {}..{} ms after",
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

fn fixed_window_admits_twice_the_limit_across_a_boundary(backend: Backend) {
    let (before, after, _) = boundary_bursts(backend, "fixed_window");
    assert_eq!((before.admitted, after.admitted), (100, 100));
}

fn sliding_window_log_admits_exactly_the_limit_across_a_boundary(backend: Backend) {
    let (before, after, _) = boundary_bursts(backend, "sliding_window_log");
    assert!(after.ended_ms < before.started_ms + PERIOD_MS);
    assert_eq!((before.admitted, after.admitted), (100, 0));
}

fn sliding_window_counter_admits_close_to_the_limit_across_a_boundary(backend: Backend) {
    let (before, after, boundary) = boundary_bursts(backend, "sliding_window_counter");
    assert_eq!(before.admitted, 100);
    // The previous window still weighs 1 - elapsed / period: only the elapsed fraction
    // of the limit passes after the boundary.
    let most = refill(after.ended_ms - boundary) + 1;
    assert!(
        after.admitted <= most,
        "{} admitted after the boundary, at most {most} expected",
        after.admitted
    );
    assert!(before.admitted + after.admitted <= 100 + most);
}

fn token_bucket_admits_its_capacity_plus_the_refill_across_a_boundary(backend: Backend) {
    let (before, after, _) = boundary_bursts(backend, "token_bucket");
    assert_eq!(before.admitted, 100);
    // Boundaries mean nothing to a bucket: after its capacity, only what refilled.
    let least = refill(after.started_ms - before.ended_ms).saturating_sub(1);
    let most = refill(after.ended_ms - before.started_ms) + 1;
    assert!(
        (least..=most).contains(&after.admitted),
        "{} admitted after the boundary, expected {least}..={most}",
        after.admitted
    );
}

on_every_backend!(
    fixed_window_admits_twice_the_limit_across_a_boundary,
    sliding_window_log_admits_exactly_the_limit_across_a_boundary,
    sliding_window_counter_admits_close_to_the_limit_across_a_boundary,
    token_bucket_admits_its_capacity_plus_the_refill_across_a_boundary,
);
