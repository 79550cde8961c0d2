//! A request queued for the shim, as the dispatcher carries it from the queue through a
//! call to its answer, and what the end of its wait means for others: the lease
//! acquisitions it ends, and the slots its answer granted a stream already gone.

use crate::events::Event;
use crate::local::Claim;
use crate::shim_call::RequestAnswer;
use crate::stream_end::{granted_to_gone, Held, SlotAsked};
use crate::wire::Check;

/// A request waiting for the shim: what to ask, and how the host finds it again (`H`:
/// its context, and its state, gone once its stream is).
pub struct QueuedRequest<H> {
    pub request: H,
    /// Sent in the call's body, taken out of the request then.
    pub checks: Vec<Check>,
    /// The lease acquisitions it makes: when it ends, the requests waiting for them run
    /// again.
    pub claims: Vec<Claim>,
    /// The checks that can grant it a concurrency slot: released at once when the answer
    /// finds the stream gone.
    pub slots: Vec<SlotAsked>,
    /// When it joined the queue, in µs: the queued_us histogram.
    pub queued_at_us: u64,
}

impl<H> QueuedRequest<H> {
    /// The events that give back what `answer` granted this request, whose stream is
    /// gone (the client went away while it waited): none for a failure.
    pub fn released_when_gone(&self, answer: &RequestAnswer) -> Vec<Event> {
        let Ok(answered) = answer else {
            return Vec::new();
        };
        granted_to_gone(&self.slots, &answered.results)
            .into_iter()
            .flat_map(Held::into_events)
            .collect()
    }
}

/// The counters whose lease acquisitions ended with these requests (answered, failed or
/// dropped): their waiters run again.
pub fn ended_acquisitions<H>(requests: &[QueuedRequest<H>]) -> Vec<u64> {
    requests
        .iter()
        .flat_map(|request| request.claims.iter().map(|claim| claim.fingerprint))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim_call::{Answered, ShimFailure};
    use crate::stats::{Count, Stat};
    use crate::wire::{Algorithm, CheckResult, TokenReturn};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn slot_check() -> Check {
        Check {
            key: "slow".into(),
            algorithm: Algorithm::Concurrency,
            limit: 2,
            period_ms: 30_000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
            regions: Default::default(),
        }
    }

    fn queued(claims: &[u64]) -> QueuedRequest<u32> {
        QueuedRequest {
            request: 1,
            checks: vec![slot_check()],
            claims: claims
                .iter()
                .map(|&fingerprint| Claim {
                    fingerprint,
                    until_ms: 100,
                })
                .collect(),
            slots: vec![SlotAsked {
                position: 0,
                rule_index: 3,
                check: slot_check(),
            }],
            queued_at_us: 0,
        }
    }

    #[test]
    fn a_granted_slot_goes_back_when_the_stream_is_gone() {
        let granted = CheckResult {
            allowed: true,
            limit: 2,
            remaining: 1,
            granted: 1,
            stamp: 42,
            ..CheckResult::default()
        };
        let events = queued(&[]).released_when_gone(&Ok(Answered::decided(vec![granted])));
        assert_eq!(
            events,
            vec![
                Event::ReturnTokens(TokenReturn {
                    key: "slow".into(),
                    algorithm: Algorithm::Concurrency,
                    limit: 2,
                    period_ms: 30_000,
                    amount: 1,
                    stamp: 42,
                    calendar: None,
                }),
                Event::Count(Count {
                    rule_index: 3,
                    stat: Stat::Released,
                }),
            ]
        );
    }

    #[test]
    fn nothing_goes_back_for_a_failure_or_a_refusal() {
        let request = queued(&[]);
        assert!(request.released_when_gone(&Err(ShimFailure::Timeout)).is_empty());
        let refused = CheckResult {
            allowed: false,
            limit: 2,
            ..CheckResult::default()
        };
        assert!(request
            .released_when_gone(&Ok(Answered::decided(vec![refused])))
            .is_empty());
    }

    #[test]
    fn every_claim_of_every_request_ends() {
        let requests = vec![queued(&[7, 8]), queued(&[]), queued(&[9])];
        assert_eq!(ended_acquisitions(&requests), vec![7, 8, 9]);
        assert!(ended_acquisitions::<u32>(&[]).is_empty());
    }
}
