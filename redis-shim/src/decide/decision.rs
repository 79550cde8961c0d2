//! Deciding one request's checks against the [`Store`]: every check charged, or none.
//!
//! On a standalone Redis, and on a cluster when every key shares a slot (the filter's
//! keys carry the client's hash as a hash tag, so one client's rules do), that is a
//! single atomic script. When a request's keys span slots, no script can see them all:
//! the slots are checked one after the other, and when one refuses, the charges already
//! made on earlier slots are refunded ([`crate::decide::refund`]) and the later slots only peeked at. Between a
//! charge and its refund, other requests see those tokens as taken (`docs/SHIM.md`).
//!
//! Nothing here counts or logs: a [`Decision`] or a [`DecideError`] says what happened,
//! refunds included, and the handler that asked counts and logs it.

use crate::decide::refund::{refund_slots, Refund};
use crate::store::scripts::{Mode, RequestRows, Row};
use crate::store::{check_group, Store, StoreError};
use ratelimit_wire::{Check, CheckResult};

/// What the shim answers for one request, and what it took to decide it.
#[derive(Debug)]
pub struct Decision {
    pub allowed: bool,
    pub results: Vec<CheckResult>,
    /// Present when a later slot refused and the charges made on earlier slots were
    /// given back (cluster only).
    pub refund: Option<Refund>,
}

/// A store failure during a decision, after any refund it required.
#[derive(Debug)]
pub struct DecideError {
    pub error: StoreError,
    /// Present when slots had been charged before the failure: their refund.
    pub refund: Option<Refund>,
    /// The refund made when a slot refused, before `error` struck a slot peeked after
    /// it. `refund` then finds nothing left to give back: a failed refund is not retried.
    pub earlier_refund: Option<Refund>,
}

/// Whether every enforcing check among `indices` admits.
fn enforcing_checks_admit(indices: &[usize], rows: &[Option<Row>], checks: &[Check]) -> bool {
    indices
        .iter()
        .all(|&i| checks[i].shadow || rows[i].is_some_and(|row| row.admits))
}

/// The error for `error`, after giving back what the `charged` slots took.
async fn fail<S: Store>(
    store: &S,
    error: StoreError,
    charged: &[&Vec<usize>],
    keys: &[String],
    checks: &[Check],
    rows: &mut [Option<Row>],
    earlier_refund: Option<Refund>,
) -> DecideError {
    let refund = if charged.is_empty() {
        None
    } else {
        Some(refund_slots(store, charged, keys, checks, rows).await)
    };
    DecideError {
        error,
        refund,
        earlier_refund,
    }
}

/// The decision of one request that check_batch.lua decided along with others, from its
/// rows, or the error that stopped its part of the script. Every key of the request is
/// in the script's reach, so nothing is ever refunded.
pub fn decided_in_batch(rows: RequestRows, checks: &[Check]) -> Result<Decision, DecideError> {
    let rows = rows.map_err(|message| DecideError::nothing_charged(StoreError::Script(message)))?;
    let allowed = rows
        .iter()
        .zip(checks)
        .all(|(row, check)| check.shadow || row.admits);
    Ok(Decision {
        allowed,
        results: rows
            .iter()
            .zip(checks)
            .map(|(row, check)| row.result(check))
            .collect(),
        refund: None,
    })
}

impl DecideError {
    /// A failure before anything was charged.
    pub fn nothing_charged(error: StoreError) -> DecideError {
        DecideError {
            error,
            refund: None,
            earlier_refund: None,
        }
    }
}

/// Decides `checks`, whose Redis keys (prefixed) are `keys`.
pub async fn decide<S: Store>(store: &S, keys: &[String], checks: &[Check]) -> Result<Decision, DecideError> {
    let groups = store.group_by_slot(keys);
    let mut rows: Vec<Option<Row>> = vec![None; checks.len()];
    let mut charged_groups: Vec<&Vec<usize>> = Vec::new();
    let mut allowed = true;
    let mut refund = None;
    for (position, group) in groups.iter().enumerate() {
        let mode = if allowed { Mode::Charge } else { Mode::Peek };
        let group_rows = match check_group(store, mode, group, keys, checks).await {
            Ok(group_rows) => group_rows,
            Err(error) => {
                return Err(fail(store, error, &charged_groups, keys, checks, &mut rows, refund).await);
            }
        };
        for (&i, row) in group.iter().zip(group_rows) {
            rows[i] = Some(row);
        }
        if !allowed {
            continue;
        }
        if enforcing_checks_admit(group, &rows, checks) {
            charged_groups.push(group);
        } else {
            allowed = false;
            if position > 0 {
                refund = Some(refund_slots(store, &charged_groups, keys, checks, &mut rows).await);
            }
        }
    }
    let results: Option<Vec<CheckResult>> = rows
        .iter()
        .zip(checks)
        .map(|(row, check)| Some(row.as_ref()?.result(check)))
        .collect();
    match results {
        Some(results) => Ok(Decision {
            allowed,
            results,
            refund,
        }),
        // Only a store whose groups leave a check out gets here.
        None => {
            let error = StoreError::Malformed("a check in no slot group".into());
            Err(fail(store, error, &charged_groups, keys, checks, &mut rows, refund).await)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The decision across slots against a store in memory: no Redis.

    use super::*;
    use crate::store::fake::{charge, check, keys, peek, refund, shadow, FakeStore};

    async fn decide_on(store: &FakeStore, checks: &[Check]) -> Result<Decision, DecideError> {
        decide(store, &keys(checks), checks).await
    }

    #[tokio::test]
    async fn one_slot_is_one_script_charged_when_it_admits() {
        let store = FakeStore::default();
        let checks = [check("min:{a}", 5), check("day:{a}", 5)];
        let decision = decide_on(&store, &checks).await.unwrap();
        assert!(decision.allowed);
        assert!(decision.refund.is_none());
        assert_eq!(store.calls(), vec![charge(&["min:{a}", "day:{a}"])]);
        assert_eq!((store.taken("min:{a}"), store.taken("day:{a}")), (1, 1));
        assert_eq!(
            decision.results.iter().map(|r| r.granted).collect::<Vec<_>>(),
            [1, 1]
        );
    }

    #[tokio::test]
    async fn a_later_slot_refusing_refunds_the_earlier_slots() {
        let store = FakeStore::with(|s| {
            s.taken.insert("ip:{b}".into(), 2);
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 2)];
        let decision = decide_on(&store, &checks).await.unwrap();
        assert!(!decision.allowed);
        assert_eq!(
            store.calls(),
            vec![charge(&["user:{a}"]), charge(&["ip:{b}"]), refund(&["user:{a}"])]
        );
        assert!(decision.refund.as_ref().is_some_and(Refund::is_complete));
        assert_eq!(
            store.taken("user:{a}"),
            0,
            "the earlier slot's charge is given back"
        );
        assert_eq!(store.taken("ip:{b}"), 2);
        // The refunded check still admitted on its own; it reports the state after the
        // refund and holds no tokens.
        let user = decision.results[0];
        assert!(user.allowed);
        assert_eq!((user.remaining, user.granted), (5, 0));
        assert!(!decision.results[1].allowed);
    }

    #[tokio::test]
    async fn a_first_slot_refusing_leaves_the_later_slots_only_peeked() {
        let store = FakeStore::with(|s| {
            s.taken.insert("user:{a}".into(), 5);
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 5), check("route:{c}", 5)];
        let decision = decide_on(&store, &checks).await.unwrap();
        assert!(!decision.allowed);
        assert!(decision.refund.is_none(), "nothing was charged, nothing refunded");
        assert_eq!(
            store.calls(),
            vec![charge(&["user:{a}"]), peek(&["ip:{b}"]), peek(&["route:{c}"])]
        );
        assert_eq!((store.taken("ip:{b}"), store.taken("route:{c}")), (0, 0));
        // Every check still gets a result: the peeked slots report that they admit.
        assert_eq!(
            decision
                .results
                .iter()
                .map(|r| (r.allowed, r.granted))
                .collect::<Vec<_>>(),
            [(false, 0), (true, 0), (true, 0)]
        );
    }

    #[tokio::test]
    async fn shadow_checks_never_refuse() {
        let store = FakeStore::with(|s| {
            s.taken.insert("shadow:{a}".into(), 1);
            s.taken.insert("shadow:{b}".into(), 1);
        });
        let checks = [
            shadow("shadow:{a}", 1),
            check("user:{a}", 5),
            shadow("shadow:{b}", 1),
            shadow("new:{b}", 1),
        ];
        let decision = decide_on(&store, &checks).await.unwrap();
        assert!(decision.allowed);
        assert!(decision.refund.is_none());
        assert_eq!(
            store.calls(),
            vec![
                charge(&["shadow:{a}", "user:{a}"]),
                charge(&["shadow:{b}", "new:{b}"])
            ]
        );
        assert_eq!(
            decision
                .results
                .iter()
                .map(|r| (r.allowed, r.granted))
                .collect::<Vec<_>>(),
            [(false, 0), (true, 1), (false, 0), (true, 1)],
            "a shadow check that admits is charged, one that would deny is not"
        );
    }

    #[tokio::test]
    async fn a_store_error_on_a_later_slot_refunds_the_earlier_slots() {
        let store = FakeStore::with(|s| {
            s.failing_checks.insert("ip:{b}".into());
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 5), check("route:{c}", 5)];
        let failure = decide_on(&store, &checks).await.unwrap_err();
        assert!(matches!(failure.error, StoreError::Timeout));
        assert!(failure.refund.as_ref().is_some_and(Refund::is_complete));
        assert!(failure.earlier_refund.is_none());
        // The slots after the failure are not asked at all.
        assert_eq!(
            store.calls(),
            vec![charge(&["user:{a}"]), charge(&["ip:{b}"]), refund(&["user:{a}"])]
        );
        assert_eq!(store.taken("user:{a}"), 0);
    }

    #[tokio::test]
    async fn a_store_error_on_the_first_slot_has_nothing_to_refund() {
        let store = FakeStore::with(|s| {
            s.failing_checks.insert("user:{a}".into());
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 5)];
        let failure = decide_on(&store, &checks).await.unwrap_err();
        assert!(failure.refund.is_none());
        assert_eq!(store.calls(), vec![charge(&["user:{a}"])]);
    }

    #[tokio::test]
    async fn a_failed_refund_is_reported_with_its_keys_and_leaves_the_charge() {
        let store = FakeStore::with(|s| {
            s.taken.insert("ip:{b}".into(), 2);
            s.failing_refunds.insert("user:{a}".into());
        });
        let checks = [check("user:{a}", 5), check("day:{a}", 5), check("ip:{b}", 2)];
        let decision = decide_on(&store, &checks).await.unwrap();
        assert!(!decision.allowed);
        let refund = decision.refund.unwrap();
        assert!(!refund.is_complete());
        assert_eq!(refund.failures.len(), 1);
        assert_eq!(refund.failures[0].keys, ["user:{a}", "day:{a}"]);
        assert_eq!(
            store.taken("user:{a}"),
            1,
            "the tokens come back only as they refill"
        );
        // The request is refused: the answer holds no tokens, charged or not.
        assert!(decision.results.iter().all(|r| r.granted == 0));
    }

    /// Guards today's behaviour when a refund failed and a slot peeked after it fails
    /// too: the failed refund is not retried, and only the refund made at the failure
    /// (which then finds nothing left to give back) counts as the request's refund.
    #[tokio::test]
    async fn a_store_error_after_a_failed_refund_reports_both_refunds() {
        let store = FakeStore::with(|s| {
            s.taken.insert("ip:{b}".into(), 2);
            s.failing_refunds.insert("user:{a}".into());
            s.failing_checks.insert("route:{c}".into());
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 2), check("route:{c}", 5)];
        let failure = decide_on(&store, &checks).await.unwrap_err();
        assert_eq!(
            store.calls(),
            vec![
                charge(&["user:{a}"]),
                charge(&["ip:{b}"]),
                refund(&["user:{a}"]),
                peek(&["route:{c}"]),
            ]
        );
        assert!(matches!(failure.error, StoreError::Timeout));
        let earlier = failure.earlier_refund.unwrap();
        assert_eq!(earlier.failures[0].keys, ["user:{a}"]);
        assert!(failure.refund.is_some_and(|refund| refund.is_complete()));
    }

    /// A store whose groups leave a check out breaks the trait's contract: the decision
    /// fails (and gives back what it charged) instead of panicking.
    #[tokio::test]
    async fn a_check_in_no_group_fails_the_decision_without_a_panic() {
        let store = FakeStore::with(|s| {
            s.ungrouped.insert("ip:{b}".into());
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 5)];
        let failure = decide_on(&store, &checks).await.unwrap_err();
        assert!(matches!(failure.error, StoreError::Malformed(_)));
        assert!(failure.refund.is_some_and(|refund| refund.is_complete()));
        assert_eq!(store.taken("user:{a}"), 0);
    }
}
