//! The worker driven through a fake host, as Envoy drives it: requests arrive in their
//! own callbacks, the worker's wake-ups, ticks and calls' answers come in its own, and
//! every test ends with each paused request resumed or answered exactly once, in its own
//! context, and every call made in the worker's.

use super::CallAnswer;
use crate::attributes::fake::FakeRequest;
use crate::config::FilterConfig;
use crate::dispatch::fake_host::{FakeHost, Happened};
use crate::dispatch::host::{Flow, Host, LogLevel};
use crate::dispatch::paused::PendingRequest;
use crate::dispatch::worker::Worker;
use crate::local::create_slots;
use crate::plan::plan;
use crate::wire::{BatchAnswer, BatchCheckResponse, CheckResponse, CheckResult};
// On wasm32 the same tests run under wasm-bindgen-test (Node).
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const NOW_MS: u64 = 1_700_000_000_000;
const TIMEOUT_MS: u64 = 100;

/// A worker over a fake host, with one rule on `x-api-key` (`extra`: more of the rule's
/// fields) and `calls` calls in flight at most.
fn worker(extra: &str, calls: u32) -> Worker<FakeHost> {
    let json = format!(
        r#"{{"shim_cluster": "c", "local_slots": 64, "timeout": "{TIMEOUT_MS}ms",
            "shim_calls_in_flight": {calls},
            "rules": [{{"name": "r", "key": [{{"header": "x-api-key"}}], "limit": 10,
                        "period": "10s"{extra}}}]}}"#
    );
    let config = FilterConfig::from_json(json.as_bytes()).unwrap();
    let host = FakeHost::default();
    host.now_ms.set(NOW_MS);
    create_slots(&host.slots, config.local_slots).unwrap();
    Worker::new(host, 1, config)
}

const LEASE: &str = r#", "lease": {"size": 4, "ttl": "1s"}"#;
const CLOSED: &str = r#", "failure_mode": "closed""#;

/// Request `id` arrives (for API key `key`) in its own callback.
fn arrive(worker: &Worker<FakeHost>, id: u32, key: &str) -> PendingRequest<u32> {
    let request = PendingRequest::new(id);
    let headers = vec![("x-api-key".to_string(), key.to_string())];
    worker.host.request_headers.borrow_mut().insert(id, headers);
    let planned = plan(
        &worker.config,
        &FakeRequest::get("/").with_header("x-api-key", key),
    );
    worker.host.enter(id);
    let transition = request.start(worker, planned, worker.host.now_ms());
    if worker.proceed(&request, transition) == Flow::Continue {
        worker.host.happened.borrow_mut().push(Happened::Continued(id));
    }
    worker.host.leave();
    request
}

/// The tokens of the calls sent so far, in order.
fn sent(worker: &Worker<FakeHost>) -> Vec<(u32, usize)> {
    worker
        .host
        .happened
        .borrow()
        .iter()
        .filter_map(|happened| match happened {
            Happened::Sent(token, requests) => Some((*token, *requests)),
            _ => None,
        })
        .collect()
}

/// The shim answers the call `token`: every check allowed (granting its lease), or
/// every one refused.
fn answer(worker: &Worker<FakeHost>, token: u32, allowed: bool) {
    let body = worker.host.calls.borrow().get(&token).cloned().unwrap();
    let responses = body
        .requests
        .iter()
        .map(|request| {
            let results = request
                .checks
                .iter()
                .map(|check| CheckResult {
                    allowed,
                    limit: check.limit,
                    remaining: 5,
                    reset_ms: 1_000,
                    retry_after_ms: if allowed { 0 } else { 1_000 },
                    granted: if allowed { check.cost.max(check.lease) } else { 0 },
                    ..CheckResult::default()
                })
                .collect();
            BatchAnswer::Decided(CheckResponse {
                allowed,
                results,
                unsupported: Vec::new(),
            })
        })
        .collect();
    let body = serde_json::to_vec(&BatchCheckResponse {
        responses,
        unsupported: Vec::new(),
    })
    .unwrap();
    respond(worker, token, Some("200"), &body);
}

fn respond(worker: &Worker<FakeHost>, token: u32, status: Option<&str>, body: &[u8]) {
    let answer = CallAnswer {
        status,
        shim_version: None,
        body,
    };
    worker.on_call_response(token, answer);
}

/// Each of `ids` was resumed or answered exactly once, nothing was asked of the host in
/// the wrong context, and the worker holds no request any more.
fn each_answered_once(worker: &Worker<FakeHost>, ids: &[u32]) {
    for &id in ids {
        let outcomes = worker.host.outcomes_of(id);
        assert_eq!(outcomes.len(), 1, "request {id}: {outcomes:?}");
    }
    assert_eq!(*worker.host.misplaced.borrow(), Vec::<String>::new());
    let mut state = worker.state.borrow_mut();
    assert!(state.take_all_requests().is_empty(), "a request is still queued");
    assert!(
        state
            .wake_lease_waiters(crate::dispatch::leases::Waking::All)
            .is_empty(),
        "a request still waits for a lease"
    );
}

#[test]
fn requests_wake_the_worker_once_go_in_one_call_and_resume_in_their_contexts() {
    let worker = worker("", 1);
    let _held: Vec<_> = (1..=3).map(|id| arrive(&worker, id, &format!("k{id}"))).collect();
    assert_eq!(worker.host.wakes.get(), 1, "one wake-up for the three");
    assert!(sent(&worker).is_empty(), "no call from a request's callback");
    worker.on_wake();
    assert_eq!(sent(&worker), vec![(1, 3)]);
    answer(&worker, 1, true);
    assert_eq!(
        worker.host.happened.borrow()[1..],
        [Happened::Resumed(1), Happened::Resumed(2), Happened::Resumed(3)]
    );
    each_answered_once(&worker, &[1, 2, 3]);
}

#[test]
fn an_answer_is_applied_before_the_next_round_is_sent() {
    let worker = worker("", 1);
    let _first = arrive(&worker, 1, "a");
    worker.on_wake();
    let _second = arrive(&worker, 2, "b");
    worker.on_wake();
    assert_eq!(sent(&worker), vec![(1, 1)], "one call in flight at most");
    answer(&worker, 1, false);
    assert_eq!(
        worker.host.happened.borrow()[..],
        [
            Happened::Sent(1, 1),
            Happened::Replied(1, 429),
            Happened::Sent(2, 1)
        ]
    );
    answer(&worker, 2, true);
    each_answered_once(&worker, &[1, 2]);
}

#[test]
fn a_refused_call_fails_its_requests_by_their_failure_mode_and_is_logged_once() {
    let worker = worker(CLOSED, 1);
    worker.host.refuse_calls.set(true);
    let _first = arrive(&worker, 1, "a");
    worker.on_wake();
    let _second = arrive(&worker, 2, "b");
    worker.on_wake();
    assert_eq!(worker.host.outcomes_of(1), [Happened::Replied(1, 503)]);
    assert_eq!(worker.host.outcomes_of(2), [Happened::Replied(2, 503)]);
    let errors = worker
        .host
        .logs
        .borrow()
        .iter()
        .filter(|(level, _)| *level == LogLevel::Error)
        .count();
    assert_eq!(errors, 1);
    assert_eq!(worker.host.counter("ratelimit.r.failed_closed"), 2);
    each_answered_once(&worker, &[1, 2]);
}

#[test]
fn envoys_own_error_answer_fails_the_call_open() {
    let worker = worker("", 1);
    let _request = arrive(&worker, 1, "a");
    worker.on_wake();
    respond(&worker, 1, Some("503"), b"no healthy upstream");
    assert_eq!(worker.host.outcomes_of(1), [Happened::Resumed(1)]);
    assert_eq!(worker.host.counter("ratelimit.r.failed_open"), 1);
    each_answered_once(&worker, &[1]);
}

#[test]
fn a_call_timing_out_fails_its_requests_and_the_queue_behind_it_expires() {
    let worker = worker(CLOSED, 1);
    let _first = arrive(&worker, 1, "a");
    worker.on_wake();
    let _second = arrive(&worker, 2, "b");
    worker.on_wake();
    // Past both deadlines, the queue waits for the call in flight, which Envoy ends at
    // its timeout (no later than the first request's deadline).
    worker.host.now_ms.set(NOW_MS + TIMEOUT_MS);
    worker.on_tick();
    assert_eq!(worker.host.outcomes_of(2), []);
    respond(&worker, 1, Some("504"), b"upstream request timeout");
    assert_eq!(worker.host.outcomes_of(1), [Happened::Replied(1, 503)]);
    assert_eq!(worker.host.outcomes_of(2), [Happened::Replied(2, 503)]);
    assert_eq!(worker.host.counter("ratelimit.r.shim_timeouts"), 2);
    assert_eq!(sent(&worker).len(), 1, "the expired request is not sent");
    each_answered_once(&worker, &[1, 2]);
}

#[test]
fn a_request_gone_while_it_waits_is_never_resumed() {
    let worker = worker("", 1);
    let gone = arrive(&worker, 1, "a");
    let _stays = arrive(&worker, 2, "b");
    worker.on_wake();
    drop(gone);
    answer(&worker, 1, true);
    assert_eq!(worker.host.outcomes_of(1), []);
    each_answered_once(&worker, &[2]);
}

#[test]
fn an_ended_acquisition_runs_its_waiters_again_in_their_contexts() {
    let worker = worker(LEASE, 1);
    let _held: Vec<_> = (1..=3).map(|id| arrive(&worker, id, "same")).collect();
    worker.on_wake();
    assert_eq!(sent(&worker), vec![(1, 1)], "the others wait for the acquisition");
    answer(&worker, 1, true);
    assert_eq!(sent(&worker).len(), 1, "the waiters spend the lease, no call");
    assert_eq!(worker.host.counter("ratelimit.r.lease_hits"), 2);
    each_answered_once(&worker, &[1, 2, 3]);
}

#[test]
fn teardown_while_calls_are_in_flight_fails_each_request_once() {
    let worker = worker(CLOSED, 1);
    let _in_flight = arrive(&worker, 1, "a");
    worker.on_wake();
    let _queued = arrive(&worker, 2, "b");
    worker.fail_all();
    assert_eq!(worker.host.outcomes_of(1), [Happened::Replied(1, 503)]);
    assert_eq!(worker.host.outcomes_of(2), [Happened::Replied(2, 503)]);
    // The reload's answer arrives after all: its call is gone, nobody answers twice.
    answer(&worker, 1, true);
    worker.on_tick();
    each_answered_once(&worker, &[1, 2]);
}

#[test]
fn teardown_with_lease_waiters_behind_an_acquisition_in_flight_answers_them_all() {
    let worker = worker(&format!("{LEASE}{CLOSED}"), 1);
    let _held: Vec<_> = (1..=3).map(|id| arrive(&worker, id, "same")).collect();
    worker.on_wake();
    assert_eq!(sent(&worker), vec![(1, 1)], "2 and 3 wait for 1's acquisition");
    worker.fail_all();
    for id in 1..=3 {
        assert_eq!(worker.host.outcomes_of(id), [Happened::Replied(id, 503)]);
    }
    assert_eq!(sent(&worker).len(), 1, "nothing is sent once closing");
    each_answered_once(&worker, &[1, 2, 3]);
}

#[test]
fn teardown_loses_the_returns_waiting_and_a_later_request_is_decided_at_once() {
    let worker = worker(LEASE, 1);
    let _first = arrive(&worker, 1, "a");
    worker.on_wake();
    answer(&worker, 1, true);
    // The lease expires: what it left waits to go back with the next call.
    worker.host.now_ms.set(NOW_MS + 2_000);
    worker.return_expired_leases(worker.host.now_ms());
    worker.fail_all();
    assert_eq!(worker.host.counter("ratelimit.adjustments_lost"), 1);
    let _late = arrive(&worker, 2, "b");
    assert_eq!(
        worker.host.outcomes_of(2),
        [Happened::Continued(2)],
        "fails open now"
    );
    assert_eq!(sent(&worker).len(), 1);
    each_answered_once(&worker, &[1, 2]);
}

#[test]
fn a_spilled_request_is_checked_again_without_its_spilling_rule_and_resumed_once() {
    let json = r#"{"shim_cluster": "c", "local_slots": 64, "timeout": "100ms", "deny_cache": false,
        "rules": [
            {"name": "r", "key": [{"header": "x-api-key"}], "limit": 10, "period": "10s",
             "on_exceeded": {"spill": {"header": "x-pool", "value": "fallback"}}},
            {"name": "fb", "key": [{"header": "x-api-key"}], "limit": 10, "period": "10s",
             "match": {"headers": [{"name": "x-pool", "value": "fallback"}]}}]}"#;
    let config = FilterConfig::from_json(json.as_bytes()).unwrap();
    let host = FakeHost::default();
    host.now_ms.set(NOW_MS);
    create_slots(&host.slots, config.local_slots).unwrap();
    let worker = Worker::new(host, 1, config);
    let request = arrive(&worker, 1, "a");
    worker.on_wake();
    answer(&worker, 1, false);
    assert_eq!(worker.host.outcomes_of(1), [], "spilled, not refused");
    assert_eq!(
        worker.host.request_headers.borrow()[&1],
        [
            ("x-api-key".to_string(), "a".to_string()),
            ("x-pool".to_string(), "fallback".to_string())
        ]
    );
    worker.on_wake();
    let second = &worker.host.calls.borrow()[&2];
    let keys: Vec<&str> = second.requests[0]
        .checks
        .iter()
        .map(|check| check.key.as_str())
        .collect();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].starts_with("fb"), "{keys:?}");
    answer(&worker, 2, true);
    each_answered_once(&worker, &[1]);
    assert_eq!(worker.host.outcomes_of(1), [Happened::Resumed(1)]);
    let headers = &request.state.borrow().response_headers;
    assert!(
        headers.contains(&("x-ratelimit-spilled".to_string(), "r".to_string())),
        "{headers:?}"
    );
    assert_eq!(worker.host.counter("ratelimit.r.spilled"), 1);
    assert_eq!(worker.host.counter("ratelimit.r.denied"), 0);
    assert_eq!(worker.host.counter("ratelimit.fb.allowed"), 1);
}
