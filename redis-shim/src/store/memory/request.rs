//! The drivers in Rust: `scripts/request.lua`'s `check_request` (one request's checks, all
//! or nothing: every key read, then every enforcing check charged when all admit, a
//! lease granted at most half of what is available), what `check.lua` and
//! `check_batch.lua` run on it, and `scripts/refund.lua`. Rows come out as the scripts'
//! replies are parsed.

use super::algorithm::{self, At, Params, State};
use super::keyspace::{CommandError, Keyspace};
use crate::store::scripts::{Charge, Row};
use ratelimit_wire::Check;

/// One check's key and parameters.
pub struct Keyed<'a> {
    pub key: &'a str,
    pub check: &'a Check,
}

/// check.lua's seven values of one check, after charging it when `charge` holds.
fn finish_check(
    at: &mut At,
    c: &Params,
    st: &mut State,
    available: f64,
    charge: bool,
) -> Result<Row, CommandError> {
    let admits = available >= c.cost;
    let (mut granted, mut stamp, mut lease_ms, mut retry_after_ms) = (0.0, 0.0, 0.0, 0.0);
    if charge && admits {
        granted = c.cost;
        if c.lease > 0.0 {
            granted = c.cost.max(c.lease.min((available / 2.0).floor()));
        }
        stamp = algorithm::charge(at, c, st, granted)?;
        if granted > 0.0 {
            lease_ms = algorithm::lease_window(c, st, at.now);
        }
    }
    let (remaining, reset_ms) = algorithm::report(at, c, st)?;
    // A refusal always names a wait of at least 1 ms, whatever the rounding.
    if !admits {
        retry_after_ms = algorithm::retry_after(at, c, st)?.max(1.0);
    }
    // Redis turns a Lua number into an integer reply by truncation.
    Ok(Row {
        admits,
        remaining: remaining as u64,
        reset_ms: reset_ms as u64,
        retry_after_ms: retry_after_ms as u64,
        granted: granted as u64,
        stamp: stamp as i64,
        lease_window_ms: lease_ms as u64,
    })
}

/// check_request: the checks of one request at the instant `now` (µs), charged when
/// `charging` and every enforcing one admits. A command failing (a key of another type)
/// ends it with Redis's message; what was written before stays, as in Redis.
pub fn check_request(
    keys: &mut Keyspace,
    checks: &[Keyed],
    charging: bool,
    now: f64,
) -> Result<Vec<Row>, CommandError> {
    let mut loaded = Vec::with_capacity(checks.len());
    let mut every_enforcing_check_admits = true;
    for keyed in checks {
        let c = Params::of(keyed.check);
        let mut at = At {
            keys,
            key: keyed.key,
            now,
        };
        let st = algorithm::load(&mut at, &c)?;
        let available = algorithm::available(&c, &st, now);
        if !c.shadow && available < c.cost {
            every_enforcing_check_admits = false;
        }
        loaded.push((c, st, available));
    }
    let charge = charging && every_enforcing_check_admits;
    checks
        .iter()
        .zip(loaded)
        .map(|(keyed, (c, mut st, available))| {
            let mut at = At {
                keys,
                key: keyed.key,
                now,
            };
            finish_check(&mut at, &c, &mut st, available, charge)
        })
        .collect()
}

/// refund.lua over `charges` at `now`: each given back (amount > 0) or charged into debt
/// (amount < 0, as far as the algorithm's debt room goes), then reported. An algorithm
/// that takes no settlement fails the call there, the keys before it adjusted.
pub fn refund(keys: &mut Keyspace, charges: &[Charge], now: f64) -> Result<Vec<Row>, CommandError> {
    let mut rows = Vec::with_capacity(charges.len());
    for charge in charges {
        let check = charge.check;
        let c = Params::new(check.algorithm, check.limit, check.period_ms, check.calendar);
        let mut at = At {
            keys,
            key: charge.key,
            now,
        };
        let amount = charge.amount as f64;
        if amount > 0.0 {
            algorithm::refund(&mut at, &c, amount, charge.stamp as f64)?;
        } else if amount < 0.0 {
            let mut st = algorithm::load(&mut at, &c)?;
            let room = algorithm::debt_room(&c, &st, now)
                .ok_or_else(|| format!("{} takes no settlement", check.algorithm.as_str()))?;
            let owed = (-amount).min(room);
            if owed > 0.0 {
                algorithm::charge(&mut at, &c, &mut st, owed)?;
            }
        }
        let st = algorithm::load(&mut at, &c)?;
        let (remaining, reset_ms) = algorithm::report(&mut at, &c, &st)?;
        rows.push(Row {
            admits: true,
            remaining: remaining as u64,
            reset_ms: reset_ms as u64,
            retry_after_ms: 0,
            granted: 0,
            stamp: 0,
            lease_window_ms: 0,
        });
    }
    Ok(rows)
}
