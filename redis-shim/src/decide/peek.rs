//! The state of some counters, charging nothing: what `redis-shim counters show`
//! reports, and what a reset reports it deleted.

use crate::store::scripts::{Mode, Row};
use crate::store::{check_group, Store, StoreError};
use ratelimit_wire::{Check, CheckResult};
/// The state of `checks`, whose Redis keys (prefixed) are `keys`, charging nothing:
/// check.lua in peek mode, slot by slot. What `redis-shim counters show` reports.
pub async fn peek<S: Store>(
    store: &S,
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<CheckResult>, StoreError> {
    let mut rows: Vec<Option<Row>> = vec![None; checks.len()];
    for group in store.group_by_slot(keys) {
        let group_rows = check_group(store, Mode::Peek, &group, keys, checks).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fake::{self, check, keys, FakeStore};

    #[tokio::test]
    async fn a_peek_reports_every_slot_and_charges_nothing() {
        let store = FakeStore::with(|s| {
            s.taken.insert("user:{a}".into(), 5);
            s.taken.insert("ip:{b}".into(), 1);
        });
        let checks = [check("user:{a}", 5), check("ip:{b}", 5)];
        let results = peek(&store, &keys(&checks), &checks).await.unwrap();
        assert_eq!(
            store.calls(),
            vec![fake::peek(&["user:{a}"]), fake::peek(&["ip:{b}"])]
        );
        assert_eq!(
            results
                .iter()
                .map(|r| (r.allowed, r.remaining, r.granted))
                .collect::<Vec<_>>(),
            [(false, 0, 0), (true, 4, 0)]
        );
        assert_eq!((store.taken("user:{a}"), store.taken("ip:{b}")), (5, 1));
    }
}
