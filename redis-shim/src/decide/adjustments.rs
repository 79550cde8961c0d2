//! Returns and settlements: counters changed outside any request's check, as the
//! filter reports them with its next batch. A return gives back what an Envoy did not
//! spend (the unspent part of a lease, a concurrency slot); a settlement charges or gives
//! back the difference between an admitted request's real cost and its estimate.

use crate::store::scripts::Charge;
use crate::store::{Store, StoreError};
use ratelimit_wire::{Algorithm, CalendarWindow, Check, Settlement, TokenReturn};

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
        regions: Default::default(),
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
