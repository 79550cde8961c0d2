//! The dispatcher's decisions, driven the way the host drives them: requests queued and
//! sent round by round, calls answered, lease waiters run again, returns and
//! settlements carried or sent alone, and everything failed when the plugin goes away.

use super::*;
use crate::batch::Call;
use crate::dispatch::leases::Waking;
use crate::dispatch::queued::{ended_acquisitions, QueuedRequest};
use crate::local::Claim;
use crate::wire::{Algorithm, BatchCheckRequest, Check};
// On wasm32 the same tests run under wasm-bindgen-test (Node).
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const TIMEOUT_MS: u64 = 100;

fn check(key: &str) -> Check {
    Check {
        key: key.into(),
        algorithm: Algorithm::TokenBucket,
        limit: 10,
        period_ms: 1_000,
        cost: 1,
        shadow: false,
        lease: 0,
        calendar: None,
        regions: Default::default(),
    }
}

/// A request known to the "host" by its id, claiming the leases of `claims`.
fn request(id: u32, claims: &[u64]) -> QueuedRequest<u32> {
    QueuedRequest {
        request: id,
        checks: vec![check(&format!("k{id}"))],
        claims: claims
            .iter()
            .map(|&fingerprint| Claim {
                fingerprint,
                until_ms: 50,
            })
            .collect(),
        slots: Vec::new(),
        queued_at_us: 0,
    }
}

fn back(key: &str) -> TokenReturn {
    TokenReturn {
        key: key.into(),
        algorithm: Algorithm::TokenBucket,
        limit: 10,
        period_ms: 1_000,
        amount: 2,
        stamp: 0,
        calendar: None,
    }
}

fn settlement(key: &str) -> Settlement {
    Settlement {
        key: key.into(),
        algorithm: Algorithm::TokenBucket,
        limit: 10,
        period_ms: 1_000,
        charged: 1,
        actual: 3,
        stamp: 0,
        calendar: None,
    }
}

fn ids(requests: &[QueuedRequest<u32>]) -> Vec<u32> {
    requests.iter().map(|queued| queued.request).collect()
}

fn all_live(_: &u32) -> bool {
    true
}

/// Sends the next round's call (at time 0) under `token`: what its body carried.
fn send_next(state: &mut DispatchState<u32>, token: u32) -> BatchCheckRequest {
    let round = state.next_round(0, all_live);
    send(state, round, token)
}

/// Sends the round's call as the host would, under `token`; what its body carried.
fn send(state: &mut DispatchState<u32>, round: Round<u32>, token: u32) -> BatchCheckRequest {
    let batch = round.call.unwrap();
    let call = state.prepare_call(batch);
    let body: BatchCheckRequest = serde_json::from_slice(call.body.as_ref().unwrap()).unwrap();
    let members = call.requests;
    state.sent(
        token,
        Call {
            members,
            sent_at_us: 0,
            adjustments: call.adjustments,
        },
    );
    body
}

#[test]
fn requests_wake_the_root_once_and_go_in_one_call() {
    let mut state = DispatchState::new(1, TIMEOUT_MS);
    assert!(state.submit(request(1, &[]), 100));
    assert!(!state.submit(request(2, &[]), 100), "a wake-up is pending");
    state.woken();
    let round = state.next_round(0, all_live);
    assert!(!round.is_last());
    let body = send(&mut state, round, 9);
    assert_eq!(body.requests.len(), 2);
    assert!(state.next_round(1, all_live).is_last(), "nothing left to send");
    assert!(!state.submit(request(3, &[]), 100), "the only call is in flight");
    assert!(state.next_round(1, all_live).is_last());
    let call = state.answered(9).unwrap();
    assert_eq!(ids(&call.members), vec![1, 2]);
    let round = state.next_round(2, all_live);
    assert_eq!(
        ids(&round.call.unwrap().members),
        vec![3],
        "the end of a call sends what came"
    );
}

#[test]
fn adjustments_ride_with_requests_or_go_alone_when_idle() {
    let mut state = DispatchState::new(1, TIMEOUT_MS);
    state.give_back(back("leased"));
    assert!(state.flush_adjustments(), "idle: the root is woken to send them");
    assert!(!state.flush_adjustments(), "already woken");
    state.woken();
    let round = state.next_round(0, all_live);
    let alone = round.call.as_ref().unwrap();
    assert!(alone.members.is_empty());
    assert_eq!(alone.timeout_ms, TIMEOUT_MS);
    let body = send(&mut state, round, 1);
    assert_eq!(body.returns, vec![back("leased")]);
    assert!(state.next_round(0, all_live).is_last(), "sent once");

    // With the only call in flight, the next return waits and rides with a request.
    state.give_back(back("slot"));
    assert!(!state.flush_adjustments(), "every call is in flight");
    assert!(state.next_round(0, all_live).is_last());
    state.submit(request(1, &[]), 100);
    state.answered(1).unwrap();
    let body = send_next(&mut state, 2);
    assert_eq!((body.requests.len(), body.returns), (1, vec![back("slot")]));
}

#[test]
fn settling_nothing_wakes_no_one() {
    let mut state = DispatchState::<u32>::new(2, TIMEOUT_MS);
    state.give_back(back("waits"));
    assert!(
        !state.settle(Vec::new()),
        "nothing settled: no wake-up, whatever waits"
    );
    assert!(state.settle(vec![settlement("llm")]));
    let body = send_next(&mut state, 1);
    assert_eq!(body.settlements, vec![settlement("llm")]);
    assert_eq!(body.returns, vec![back("waits")]);
}

#[test]
fn timed_out_and_gone_requests_come_back_before_anything_is_sent_alone() {
    let mut state = DispatchState::new(1, TIMEOUT_MS);
    state.submit(request(1, &[7]), 50);
    state.submit(request(2, &[8]), 500);
    state.give_back(back("leased"));
    let round = state.next_round(60, |id| *id != 2);
    assert_eq!(ids(&round.timed_out), vec![1]);
    assert_eq!(ids(&round.gone), vec![2]);
    assert!(
        round.call.is_none() && !round.is_last(),
        "the host comes back for more"
    );
    assert_eq!(ended_acquisitions(&round.timed_out), vec![7]);
    assert_eq!(ended_acquisitions(&round.gone), vec![8]);
    let round = state.next_round(60, all_live);
    assert!(
        round.call.unwrap().members.is_empty(),
        "then the return goes alone"
    );
}

#[test]
fn a_call_carries_a_batch_of_adjustments_the_rest_wait() {
    let mut state = DispatchState::<u32>::new(2, TIMEOUT_MS);
    for n in 0..(crate::wire::MAX_BATCH + 1) {
        state.give_back(back(&format!("k{n}")));
    }
    let first = send_next(&mut state, 1);
    assert_eq!(first.returns.len(), crate::wire::MAX_BATCH);
    let second = send_next(&mut state, 2);
    assert_eq!(
        second.returns,
        vec![back(&format!("k{}", crate::wire::MAX_BATCH))]
    );
    assert!(state.next_round(0, all_live).is_last());
}

#[test]
fn an_ended_acquisition_runs_its_waiters_again() {
    let mut state = DispatchState::new(1, TIMEOUT_MS);
    state.submit(request(1, &[7]), 100);
    state.await_lease(7, 100, 2);
    state.await_lease(8, 100, 3);
    send_next(&mut state, 4);
    let call = state.answered(4).unwrap();
    let ended = ended_acquisitions(&call.members);
    assert_eq!(state.wake_lease_waiters(Waking::Counters(&ended)), vec![2]);
    assert_eq!(state.overdue_lease_counters(99), Vec::<u64>::new());
    assert_eq!(state.overdue_lease_counters(100), vec![8]);
}

#[test]
fn the_tick_forgets_a_lost_wake_up_only_when_something_waits() {
    let mut state = DispatchState::new(2, TIMEOUT_MS);
    assert!(!state.tick_sends_adjustments() && !state.tick_sends_requests());
    assert!(state.submit(request(1, &[]), 100));
    assert!(!state.tick_sends_adjustments(), "no adjustment waits");
    assert!(
        !state.submit(request(2, &[]), 100),
        "the wake-up is still pending"
    );
    assert!(state.tick_sends_requests());
    assert!(
        state.submit(request(3, &[]), 100),
        "the lost wake-up no longer holds back"
    );
    state.give_back(back("leased"));
    assert!(state.tick_sends_adjustments());
    assert!(state.flush_adjustments());
}

#[test]
fn expired_leases_are_handed_back_once() {
    let mut state = DispatchState::<u32>::new(1, TIMEOUT_MS);
    state.hold_lease(HeldLease {
        fingerprint: 7,
        expires_ms: 100,
        counter: check("leased"),
    });
    assert!(state.take_expired_leases(99).is_empty());
    assert_eq!(state.take_expired_leases(100).len(), 1);
    assert!(state.take_expired_leases(200).is_empty());
}

#[test]
fn a_refused_call_is_logged_once_and_fails_its_requests() {
    let mut state = DispatchState::<u32>::new(1, TIMEOUT_MS);
    let first = state.call_refused("shim", true, &"BadArgument");
    let reason = "no cluster named \"shim\" in this Envoy (shim_cluster)".to_string();
    assert_eq!(
        first,
        RefusedCall {
            failure: ShimFailure::Unreachable(reason.clone()),
            log_line: Some(format!("calls to the shim fail: {reason}")),
        }
    );
    let again = state.call_refused("shim", false, &"InternalFailure");
    assert_eq!(again.log_line, None);
    assert_eq!(
        again.failure,
        ShimFailure::Unreachable("cannot call cluster \"shim\": InternalFailure".into())
    );
}

#[test]
fn going_away_takes_every_request_waiter_and_adjustment() {
    let mut state = DispatchState::new(1, TIMEOUT_MS);
    state.submit(request(1, &[]), 100);
    send_next(&mut state, 1);
    state.submit(request(2, &[]), 100);
    state.await_lease(7, 100, 3);
    state.give_back(back("leased"));
    state.settle(vec![settlement("llm")]);
    assert_eq!(state.wake_lease_waiters(Waking::All), vec![3]);
    let mut left = ids(&state.take_all_requests());
    left.sort_unstable();
    assert_eq!(left, vec![1, 2], "queued and in flight alike");
    assert_eq!(state.discard_adjustments(), 2);
    assert!(state.answered(1).is_none());
    assert!(state.next_round(0, all_live).is_last());
}
