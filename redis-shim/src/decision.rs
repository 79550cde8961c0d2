//! Deciding one request's checks against the [`Store`]: every check charged, or none.
//!
//! On a standalone Redis, and on a cluster when every key shares a slot (the filter's
//! keys carry the client's hash as a hash tag, so one client's rules do), that is a
//! single atomic script. When a request's keys span slots, no script can see them all:
//! the slots are checked one after the other, and when one refuses, the charges already
//! made on earlier slots are refunded and the later slots only peeked at. Between a
//! charge and its refund, other requests see those tokens as taken (`docs/SHIM.md`).
//!
//! Nothing here counts or logs: a [`Decision`] or a [`DecideError`] says what happened,
//! refunds included, and the handler that asked counts and logs it.

use crate::scripts::{Charge, Mode, RequestRows, Row};
use crate::store::{Store, StoreError};
use ratelimit_wire::{Algorithm, CalendarWindow, Check, CheckResult, Settlement, TokenReturn};

/// What the shim answers for one request, and what it took to decide it.
#[derive(Debug)]
pub struct Decision {
    pub allowed: bool,
    pub results: Vec<CheckResult>,
    /// Present when a later slot refused and the charges made on earlier slots were
    /// given back (cluster only).
    pub refund: Option<Refund>,
}

/// The refund of the slots charged before a later slot refused or failed.
#[derive(Debug, Default)]
pub struct Refund {
    /// Slots whose refund failed: their tokens come back only as the counters refill or
    /// expire.
    pub failures: Vec<RefundFailure>,
}

impl Refund {
    /// Whether every charge was given back.
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty()
    }
}

/// One slot's refund that the store did not complete.
#[derive(Debug)]
pub struct RefundFailure {
    /// The keys whose charges stay.
    pub keys: Vec<String>,
    pub error: StoreError,
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

async fn run_group<S: Store>(
    store: &S,
    mode: Mode,
    group: &[usize],
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<Row>, StoreError> {
    let group_keys: Vec<&str> = group.iter().map(|&i| keys[i].as_str()).collect();
    let group_checks: Vec<&Check> = group.iter().map(|&i| &checks[i]).collect();
    store.check(mode, &group_keys, &group_checks).await
}

/// Gives back every charge recorded in `rows` for the checks of `groups`, one script per
/// slot, and records the state after the refund. A failed refund is not retried: its
/// charges are recorded as given back (`granted` 0) all the same.
async fn refund_slots<S: Store>(
    store: &S,
    groups: &[&Vec<usize>],
    keys: &[String],
    checks: &[Check],
    rows: &mut [Option<Row>],
) -> Refund {
    let mut refund = Refund::default();
    for group in groups {
        let charged: Vec<(usize, Row)> = group
            .iter()
            .filter_map(|&i| Some((i, rows[i].filter(|row| row.granted > 0)?)))
            .collect();
        if charged.is_empty() {
            continue;
        }
        let charges: Vec<Charge<'_>> = charged
            .iter()
            .map(|&(i, row)| Charge {
                key: &keys[i],
                check: &checks[i],
                amount: i64::try_from(row.granted).unwrap_or(i64::MAX),
                stamp: row.stamp,
            })
            .collect();
        match store.refund(&charges).await {
            Ok(after) => {
                for (&(i, charged_row), row) in charged.iter().zip(after) {
                    rows[i] = Some(Row {
                        admits: charged_row.admits,
                        ..row
                    });
                }
            }
            Err(error) => {
                for &(i, _) in &charged {
                    if let Some(row) = rows[i].as_mut() {
                        row.granted = 0;
                    }
                }
                refund.failures.push(RefundFailure {
                    keys: charged.iter().map(|&(i, _)| keys[i].clone()).collect(),
                    error,
                });
            }
        }
    }
    refund
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

/// A change to one counter outside any request's check: tokens given back (`amount` > 0)
/// or charged (`amount` < 0), where `stamp` says.
struct Adjustment {
    check: Check,
    amount: i64,
    stamp: i64,
}

impl Adjustment {
    /// Tokens a lease left unspent, or a concurrency slot, given back.
    fn of_return(back: &TokenReturn) -> Adjustment {
        Adjustment {
            check: counter_check(
                &back.key,
                back.algorithm,
                back.limit,
                back.period_ms,
                back.calendar,
            ),
            amount: i64::try_from(back.amount).unwrap_or(i64::MAX),
            stamp: back.stamp,
        }
    }

    /// The difference between a request's real cost and its estimate, charged or given back.
    fn of_settlement(settled: &Settlement) -> Adjustment {
        Adjustment {
            check: counter_check(
                &settled.key,
                settled.algorithm,
                settled.limit,
                settled.period_ms,
                settled.calendar,
            ),
            amount: -settled.difference(),
            stamp: settled.stamp,
        }
    }
}

/// The counter a return or a settlement names, as the scripts take it.
fn counter_check(
    key: &str,
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    calendar: Option<CalendarWindow>,
) -> Check {
    Check {
        key: key.to_string(),
        algorithm,
        limit,
        period_ms,
        cost: 1,
        shadow: false,
        lease: 0,
        calendar,
    }
}

/// Applies `adjustments` (whose Redis keys, prefixed, are `keys`), slot by slot.
async fn adjust<S: Store>(store: &S, keys: &[String], adjustments: &[Adjustment]) -> Result<(), StoreError> {
    for group in store.group_by_slot(keys) {
        let charges: Vec<Charge<'_>> = group
            .iter()
            .filter_map(|&i| {
                let adjustment = adjustments.get(i).filter(|a| a.amount != 0)?;
                Some(Charge {
                    key: keys.get(i)?,
                    check: &adjustment.check,
                    amount: adjustment.amount,
                    stamp: adjustment.stamp,
                })
            })
            .collect();
        if !charges.is_empty() {
            store.refund(&charges).await?;
        }
    }
    Ok(())
}

/// Gives back what Envoys did not spend (leased tokens, concurrency slots) and settles
/// admitted requests at their real cost (the difference charged now, into debt if need
/// be, or given back to the window it was charged to), in one call per slot. `keys` are
/// the returns' keys then the settlements', with the shim's prefix. Best effort: a lost
/// return only leaves the counter stricter than it need be, a lost settlement the
/// estimate charged.
pub async fn adjust_counters<S: Store>(
    store: &S,
    keys: &[String],
    returns: &[TokenReturn],
    settlements: &[Settlement],
) -> Result<(), StoreError> {
    let adjustments: Vec<Adjustment> = returns
        .iter()
        .map(Adjustment::of_return)
        .chain(settlements.iter().map(Adjustment::of_settlement))
        .collect();
    adjust(store, keys, &adjustments).await
}

/// The state of `checks`, whose Redis keys (prefixed) are `keys`, charging nothing:
/// check.lua in peek mode, slot by slot. What `redis-shim counters show` reports.
pub async fn peek<S: Store>(
    store: &S,
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<CheckResult>, StoreError> {
    let mut rows: Vec<Option<Row>> = vec![None; checks.len()];
    for group in store.group_by_slot(keys) {
        let group_rows = run_group(store, Mode::Peek, &group, keys, checks).await?;
        for (&i, row) in group.iter().zip(group_rows) {
            rows[i] = Some(row);
        }
    }
    rows.iter()
        .zip(checks)
        .map(|(row, check)| {
            row.as_ref()
                .map(|row| row.result(check))
                .ok_or_else(|| StoreError::Malformed("a check in no slot group".into()))
        })
        .collect()
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
        let group_rows = match run_group(store, mode, group, keys, checks).await {
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
    use ratelimit_wire::Algorithm;
    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;

    /// What the fake store was asked, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Check(Mode, Vec<String>),
        Refund(Vec<String>),
    }

    /// Counters in memory, one number of tokens taken per key, each charge taking its
    /// check's cost; a key's slot is its hash tag. Any script touching a key of
    /// `failing` fails with a timeout, as would a Redis node that stopped answering.
    #[derive(Default)]
    struct FakeStore {
        state: Mutex<FakeState>,
    }

    #[derive(Default)]
    struct FakeState {
        taken: HashMap<String, u64>,
        calls: Vec<Call>,
        failing_checks: HashSet<String>,
        failing_refunds: HashSet<String>,
        /// Keys `group_by_slot` leaves out, to play a store that breaks its contract.
        ungrouped: HashSet<String>,
    }

    /// The hash tag of `key` (the whole key without one), as Redis Cluster reads it.
    fn hash_tag(key: &str) -> &str {
        key.find('{')
            .and_then(|open| {
                let close = key[open + 1..].find('}')?;
                Some(&key[open + 1..open + 1 + close]).filter(|tag| !tag.is_empty())
            })
            .unwrap_or(key)
    }

    impl FakeStore {
        fn with(setup: impl FnOnce(&mut FakeState)) -> FakeStore {
            let store = FakeStore::default();
            setup(&mut store.state.lock().unwrap());
            store
        }

        fn calls(&self) -> Vec<Call> {
            self.state.lock().unwrap().calls.clone()
        }

        fn taken(&self, key: &str) -> u64 {
            self.state.lock().unwrap().taken.get(key).copied().unwrap_or(0)
        }
    }

    impl Store for FakeStore {
        fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
            let state = self.state.lock().unwrap();
            let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
            for (index, key) in keys.iter().enumerate() {
                if state.ungrouped.contains(key) {
                    continue;
                }
                let tag = hash_tag(key);
                match groups.iter_mut().find(|(t, _)| *t == tag) {
                    Some((_, members)) => members.push(index),
                    None => groups.push((tag, vec![index])),
                }
            }
            groups.into_iter().map(|(_, members)| members).collect()
        }

        /// check.lua's contract: all or nothing over the enforcing checks.
        async fn check(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
            let mut state = self.state.lock().unwrap();
            state
                .calls
                .push(Call::Check(mode, keys.iter().map(|k| k.to_string()).collect()));
            if keys.iter().any(|key| state.failing_checks.contains(*key)) {
                return Err(StoreError::Timeout);
            }
            let available: Vec<u64> = keys
                .iter()
                .zip(checks)
                .map(|(key, check)| {
                    check
                        .limit
                        .saturating_sub(state.taken.get(*key).copied().unwrap_or(0))
                })
                .collect();
            let admits: Vec<bool> = checks.iter().zip(&available).map(|(c, &a)| a >= c.cost).collect();
            let charging = mode == Mode::Charge
                && checks
                    .iter()
                    .zip(&admits)
                    .all(|(check, &admits)| admits || check.shadow);
            let mut rows = Vec::new();
            for ((key, check), (&admits, &available)) in
                keys.iter().zip(checks).zip(admits.iter().zip(&available))
            {
                let granted = if charging && admits { check.cost } else { 0 };
                *state.taken.entry(key.to_string()).or_default() += granted;
                rows.push(Row {
                    admits,
                    remaining: available - granted,
                    reset_ms: 0,
                    retry_after_ms: u64::from(!admits),
                    granted,
                    stamp: if granted > 0 { 7 } else { 0 },
                    lease_window_ms: 0,
                });
            }
            Ok(rows)
        }

        async fn refund(&self, charges: &[Charge<'_>]) -> Result<Vec<Row>, StoreError> {
            let mut state = self.state.lock().unwrap();
            state
                .calls
                .push(Call::Refund(charges.iter().map(|c| c.key.to_string()).collect()));
            if charges.iter().any(|c| state.failing_refunds.contains(c.key)) {
                return Err(StoreError::Timeout);
            }
            let mut rows = Vec::new();
            for charge in charges {
                assert_eq!(charge.stamp, 7, "a refund carries its charge's stamp");
                let taken = state.taken.entry(charge.key.to_string()).or_default();
                *taken = taken.saturating_add_signed(-charge.amount);
                rows.push(Row {
                    admits: true,
                    remaining: charge.check.limit - *taken,
                    reset_ms: 0,
                    retry_after_ms: 0,
                    granted: 0,
                    stamp: 0,
                    lease_window_ms: 0,
                });
            }
            Ok(rows)
        }
    }

    fn check(key: &str, limit: u64) -> Check {
        Check {
            key: key.into(),
            algorithm: Algorithm::TokenBucket,
            limit,
            period_ms: 60_000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
        }
    }

    fn shadow(key: &str, limit: u64) -> Check {
        Check {
            shadow: true,
            ..check(key, limit)
        }
    }

    fn keys(checks: &[Check]) -> Vec<String> {
        checks.iter().map(|c| c.key.clone()).collect()
    }

    fn charge(keys: &[&str]) -> Call {
        Call::Check(Mode::Charge, keys.iter().map(|k| k.to_string()).collect())
    }

    fn peek(keys: &[&str]) -> Call {
        Call::Check(Mode::Peek, keys.iter().map(|k| k.to_string()).collect())
    }

    fn refund(keys: &[&str]) -> Call {
        Call::Refund(keys.iter().map(|k| k.to_string()).collect())
    }

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

    #[tokio::test]
    async fn a_peek_reports_every_slot_and_charges_nothing() {
        let store = FakeStore::with(|s| {
            s.taken.insert("user:{a}".into(), 5);
            s.taken.insert("ip:{b}".into(), 1);
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 5)];
        let results = super::peek(&store, &keys(&checks), &checks).await.unwrap();
        assert_eq!(store.calls(), vec![peek(&["user:{a}"]), peek(&["ip:{b}"])]);
        assert_eq!(
            results
                .iter()
                .map(|r| (r.allowed, r.remaining, r.granted))
                .collect::<Vec<_>>(),
            [(false, 0, 0), (true, 4, 0)]
        );
        assert_eq!((store.taken("user:{a}"), store.taken("ip:{b}")), (5, 1));
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
