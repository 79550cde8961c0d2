//! One request's decision: every check charged, or none.
//!
//! On a standalone Redis, and on a cluster when every key shares a slot (the filter's
//! keys carry the client's hash as a hash tag, so one client's rules do), that is a
//! single atomic script. When a request's keys span slots, no script can see them all:
//! the slots are checked one after the other, and when one refuses, the charges already
//! made on earlier slots are refunded and the later slots only peeked at. Between a
//! charge and its refund, other requests see those tokens as taken (`docs/SHIM.md`).

use crate::scripts::{check_invocation, refund_invocation, Mode, Row, Scripts};
use crate::store::{Store, StoreError};
use ratelimit_wire::{Check, CheckResult};

/// What the shim answers for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub results: Vec<CheckResult>,
    /// Charges on earlier slots had to be given back (cluster only).
    pub refunded: bool,
    /// Whether every such refund reached Redis.
    pub refund_complete: bool,
}

/// Whether every enforcing check among `indices` admits.
fn enforcing_checks_admit(indices: &[usize], rows: &[Option<Row>], checks: &[Check]) -> bool {
    indices
        .iter()
        .all(|&i| checks[i].shadow || rows[i].is_some_and(|row| row.admits))
}

async fn run_group(
    store: &Store,
    scripts: &Scripts,
    mode: Mode,
    group: &[usize],
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<Row>, StoreError> {
    let group_keys: Vec<&str> = group.iter().map(|&i| keys[i].as_str()).collect();
    let group_checks: Vec<&Check> = group.iter().map(|&i| &checks[i]).collect();
    let invocation = check_invocation(scripts, mode, &group_keys, &group_checks);
    store.run(&invocation, group.len()).await
}

/// Gives back every charge recorded in `rows` for the checks of `groups`, one script per
/// slot, and records the state after the refund. Returns false if a refund failed (the
/// tokens then come back only as the counters refill or expire).
async fn refund(
    store: &Store,
    scripts: &Scripts,
    groups: &[&Vec<usize>],
    keys: &[String],
    checks: &[Check],
    rows: &mut [Option<Row>],
) -> bool {
    let mut complete = true;
    for group in groups {
        let charged: Vec<usize> = group
            .iter()
            .copied()
            .filter(|&i| rows[i].is_some_and(|row| row.granted > 0))
            .collect();
        if charged.is_empty() {
            continue;
        }
        let charged_rows: Vec<Row> = charged
            .iter()
            .map(|&i| rows[i].expect("charged rows exist"))
            .collect();
        let charges: Vec<(&str, &Check, &Row)> = charged
            .iter()
            .zip(&charged_rows)
            .map(|(&i, row)| (keys[i].as_str(), &checks[i], row))
            .collect();
        match store
            .run(&refund_invocation(scripts, &charges), charged.len())
            .await
        {
            Ok(after) => {
                for (&i, row) in charged.iter().zip(after) {
                    rows[i] = Some(Row {
                        admits: rows[i].is_some_and(|r| r.admits),
                        ..row
                    });
                }
            }
            Err(e) => {
                tracing::error!(error = %e, keys = ?charged.iter().map(|&i| &keys[i]).collect::<Vec<_>>(), "refund failed");
                for &i in &charged {
                    if let Some(row) = rows[i].as_mut() {
                        row.granted = 0;
                    }
                }
                complete = false;
            }
        }
    }
    complete
}

/// Decides `checks`, whose Redis keys (prefixed) are `keys`.
pub async fn decide(
    store: &Store,
    scripts: &Scripts,
    keys: &[String],
    checks: &[Check],
) -> Result<Decision, DecideError> {
    let groups = store.group_by_slot(keys);
    let mut rows: Vec<Option<Row>> = vec![None; checks.len()];
    let mut charged_groups: Vec<&Vec<usize>> = Vec::new();
    let mut allowed = true;
    let mut refunded = false;
    let mut refund_complete = true;
    for (position, group) in groups.iter().enumerate() {
        let mode = if allowed { Mode::Charge } else { Mode::Peek };
        let group_rows = match run_group(store, scripts, mode, group, keys, checks).await {
            Ok(group_rows) => group_rows,
            Err(error) => {
                let refund_complete = refund(store, scripts, &charged_groups, keys, checks, &mut rows).await;
                return Err(DecideError {
                    error,
                    refund_complete,
                    slots_charged: charged_groups.len(),
                });
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
                refunded = true;
                refund_complete = refund(store, scripts, &charged_groups, keys, checks, &mut rows).await;
            }
        }
    }
    let results = rows
        .iter()
        .zip(checks)
        .map(|(row, check)| row.expect("every group ran").result(check))
        .collect();
    Ok(Decision {
        allowed,
        results,
        refunded,
        refund_complete,
    })
}

/// A Redis failure during a decision, after any refund it required.
#[derive(Debug)]
pub struct DecideError {
    pub error: StoreError,
    /// False when charges made on earlier slots could not all be given back.
    pub refund_complete: bool,
    pub slots_charged: usize,
}
