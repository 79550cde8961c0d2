//! What a request gives back when its stream ends, for whatever reason (response
//! complete, upstream reset, timeout, client abort, a later filter refusing): the
//! concurrency slots its admission took, each released to the shim as a [`TokenReturn`]
//! of one slot naming the slot's id (the `stamp` of the shim's result).
//!
//! Pure: [`RequestDecision`](crate::request::RequestDecision) calls [`held`] over its
//! results at stream end, and [`granted_to_gone`] covers an answer that arrives after
//! the stream is gone (the client aborted while the request waited for the shim): the
//! slots it granted are released at once. The host only queues the returns with the
//! worker's next shim call. A release that never reaches Redis (the call fails, the
//! Envoy dies) leaves its slot taken until the rule's `max_duration`.
//!
//! Anything else a request will settle at stream end (a cost known only from the
//! response) belongs here too: [`Held`] is one such obligation.

use crate::events::Event;
use crate::stats::{Count, Stat};
use crate::wire::{Check, CheckResult, TokenReturn};

/// Something a request holds until its stream ends, and the rule it holds it for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub rule_index: usize,
    pub give_back: TokenReturn,
}

impl Held {
    /// The events that give it back: the return to queue, and the rule's stat.
    pub fn into_events(self) -> [Event; 2] {
        [
            Event::ReturnTokens(self.give_back),
            Event::Count(Count {
                rule_index: self.rule_index,
                stat: Stat::Released,
            }),
        ]
    }
}

/// A check sent to the shim that can grant its request a slot: where it is among the
/// checks sent (its result's position), its rule, and the check itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotAsked {
    pub position: usize,
    pub rule_index: usize,
    pub check: Check,
}

/// The slot `result` gave the request for `check`, as the return that releases it;
/// `None` when the check holds nothing (not a concurrency check, not charged).
pub fn slot_release(check: &Check, result: &CheckResult) -> Option<TokenReturn> {
    let holds_slot = check.algorithm.traits().counts_in_flight && result.granted > 0 && result.stamp != 0;
    holds_slot.then(|| TokenReturn {
        key: check.key.clone(),
        algorithm: check.algorithm,
        limit: check.limit,
        period_ms: check.period_ms,
        amount: result.granted,
        stamp: result.stamp,
        calendar: None,
    })
}

/// What a request holds at stream end, from its checks' results (`None`: undecided):
/// `(rule_index, check, result)`.
pub fn held<'a>(decided: impl IntoIterator<Item = (usize, &'a Check, &'a CheckResult)>) -> Vec<Held> {
    decided
        .into_iter()
        .filter_map(|(rule_index, check, result)| {
            Some(Held {
                rule_index,
                give_back: slot_release(check, result)?,
            })
        })
        .collect()
}

/// What the shim's answer granted a request whose stream is already gone: every slot,
/// to release at once. `results` are the answer's, one per check sent.
pub fn granted_to_gone(asked: &[SlotAsked], results: &[CheckResult]) -> Vec<Held> {
    held(
        asked
            .iter()
            .filter_map(|slot| Some((slot.rule_index, &slot.check, results.get(slot.position)?))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Algorithm;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn check(key: &str, algorithm: Algorithm) -> Check {
        Check {
            key: key.into(),
            algorithm,
            limit: 3,
            period_ms: 60_000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
            regions: Default::default(),
        }
    }

    fn granted(stamp: i64) -> CheckResult {
        CheckResult {
            allowed: true,
            limit: 3,
            remaining: 2,
            granted: 1,
            stamp,
            ..CheckResult::default()
        }
    }

    #[test]
    fn a_granted_concurrency_slot_is_released_by_its_id() {
        let slots = check("c/cc60000:{k}", Algorithm::Concurrency);
        let rate = check("r/tb60000:{k}", Algorithm::TokenBucket);
        let refused = CheckResult {
            allowed: false,
            ..CheckResult::default()
        };
        let held = held([
            (0, &slots, &granted(1_700_000_000_000_001)),
            (1, &rate, &granted(0)),
            (2, &slots, &refused),
        ]);
        assert_eq!(
            held,
            [Held {
                rule_index: 0,
                give_back: TokenReturn {
                    key: "c/cc60000:{k}".into(),
                    algorithm: Algorithm::Concurrency,
                    limit: 3,
                    period_ms: 60_000,
                    amount: 1,
                    stamp: 1_700_000_000_000_001,
                    calendar: None,
                },
            }],
            "only the concurrency slot taken is held"
        );
        let events = held[0].clone().into_events();
        assert!(matches!(&events[0], Event::ReturnTokens(back) if back.stamp == 1_700_000_000_000_001));
        assert_eq!(
            events[1],
            Event::Count(Count {
                rule_index: 0,
                stat: Stat::Released
            })
        );
    }

    #[test]
    fn an_answer_for_a_gone_stream_releases_what_it_granted() {
        let asked = [SlotAsked {
            position: 1,
            rule_index: 4,
            check: check("c/cc60000:{k}", Algorithm::Concurrency),
        }];
        let released = granted_to_gone(&asked, &[granted(0), granted(77)]);
        assert_eq!(released.len(), 1);
        assert_eq!((released[0].rule_index, released[0].give_back.stamp), (4, 77));
        // Refused, or an answer too short: nothing was granted, nothing to release.
        assert!(granted_to_gone(&asked, &[granted(0)]).is_empty());
        let refused = CheckResult::default();
        assert!(granted_to_gone(&asked, &[granted(0), refused]).is_empty());
    }
}
