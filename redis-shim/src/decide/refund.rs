//! Giving back, on a cluster, the charges a request made on earlier slots when a later
//! slot refused it or failed: no script reaches keys in two slots, so a request whose
//! keys span slots is charged slot by slot and its all-or-nothing is restored here.
//! Between a charge and its refund, other requests see those tokens as taken
//! (`docs/SHIM.md`).

use crate::store::scripts::{Charge, Row};
use crate::store::{Store, StoreError};
use ratelimit_wire::Check;

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

/// Gives back every charge recorded in `rows` for the checks of `groups`, one script per
/// slot, and records the state after the refund. A failed refund is not retried: its
/// charges are recorded as given back (`granted` 0) all the same.
pub async fn refund_slots<S: Store>(
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
