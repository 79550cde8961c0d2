//! `scripts/concurrency.lua` in Rust: requests in flight, one sorted-set member per slot
//! taken, its id the charge's instant (µs, bumped while taken) and its score the instant
//! it frees itself; a release (a refund naming the id) frees it sooner.

use super::algorithm::{int, ms_ceil, At, Params};
use super::keyspace::CommandError;

/// The longest a refused request is told to wait: a slot can free at any moment.
const CONCURRENCY_RETRY_MS: f64 = 1000.0;

#[derive(Debug, Clone, Copy)]
pub struct Slots {
    used: f64,
}

pub fn load(at: &mut At) -> Result<Slots, CommandError> {
    let used = at.keys.zcount_above(at.key, int(at.now), at.now_ms())?;
    Ok(Slots { used: used as f64 })
}

pub fn available(c: &Params, st: &Slots) -> f64 {
    (c.limit - st.used).max(0.0)
}

pub fn charge(at: &mut At, c: &Params, st: &mut Slots, amount: f64) -> Result<f64, CommandError> {
    let now_ms = at.now_ms();
    at.keys.zremrange_up_to(at.key, int(at.now), now_ms)?;
    let mut id = at.now;
    for _ in 0..amount as u64 {
        while !at
            .keys
            .zadd_nx(at.key, int(at.now + c.period), &format!("{}", int(id)), now_ms)?
        {
            id += 1.0;
        }
    }
    at.keys.pexpire(at.key, int(c.period_ms), now_ms);
    st.used += amount;
    Ok(id)
}

/// The time until every slot now taken is free for sure: when the newest would expire.
pub fn report(at: &mut At, c: &Params, st: &Slots) -> Result<(f64, f64), CommandError> {
    let mut reset_ms = 0.0;
    if st.used > 0.0 {
        let newest = at.keys.zlast_score(at.key, at.now_ms())?;
        let newest = newest.ok_or("attempt to perform arithmetic on a nil value")?;
        reset_ms = ms_ceil(newest - at.now);
    }
    Ok((available(c, st), reset_ms))
}

/// A slot frees when a request ends (any moment) or, at the latest, when enough of the
/// oldest slots expire to leave one free.
pub fn retry_after(at: &mut At, c: &Params, st: &Slots) -> Result<f64, CommandError> {
    let must_free = st.used - (c.limit - c.cost);
    let slot = at
        .keys
        .zscore_above_at(at.key, int(at.now), must_free as i64 - 1, at.now_ms())?;
    Ok(slot.map_or(CONCURRENCY_RETRY_MS, |score| {
        CONCURRENCY_RETRY_MS.min(ms_ceil(score - at.now))
    }))
}
