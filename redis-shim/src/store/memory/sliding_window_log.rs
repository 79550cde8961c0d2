//! `scripts/sliding_window_log.lua` in Rust: one sorted-set member per token taken, scored
//! by its instant (µs), so exactly `limit` tokens in any trailing period; the key expires
//! one period after its newest entry.

use super::algorithm::{int, ms_ceil, At, Params};
use super::keyspace::CommandError;

#[derive(Debug, Clone, Copy)]
pub struct Log {
    used: f64,
    /// The instant of the entries charged in this call, the newest.
    newest: Option<f64>,
}

/// The exclusive lower bound of the trailing window.
fn window_floor(c: &Params, now: f64) -> f64 {
    int(now - c.period)
}

pub fn load(at: &mut At, c: &Params) -> Result<Log, CommandError> {
    let used = at
        .keys
        .zcount_above(at.key, window_floor(c, at.now), at.now_ms())?;
    Ok(Log {
        used: used as f64,
        newest: None,
    })
}

pub fn available(c: &Params, st: &Log) -> f64 {
    (c.limit - st.used).max(0.0)
}

pub fn charge(at: &mut At, c: &Params, st: &mut Log, amount: f64) -> Result<f64, CommandError> {
    let now_ms = at.now_ms();
    at.keys.zremrange_up_to(at.key, at.now - c.period, now_ms)?;
    // Members must be unique: one already present (same microsecond, after a refund)
    // would be re-scored instead of added, losing a token.
    let (mut seq, score) = (st.used, int(at.now));
    for _ in 0..amount as u64 {
        loop {
            seq += 1.0;
            if at
                .keys
                .zadd_nx(at.key, score, &format!("{score}-{seq}"), now_ms)?
            {
                break;
            }
        }
    }
    at.keys.pexpire(at.key, c.period_ms, now_ms);
    st.used += amount;
    st.newest = Some(at.now);
    Ok(at.now)
}

pub fn report(at: &mut At, c: &Params, st: &Log) -> Result<(f64, f64), CommandError> {
    let newest = match st.newest {
        Some(newest) => Some(newest),
        None if st.used > 0.0 => at.keys.zlast_score(at.key, at.now_ms())?,
        None => None,
    };
    let reset_ms = newest.map_or(0.0, |newest| ms_ceil(newest + c.period - at.now));
    Ok((available(c, st), reset_ms))
}

/// The request fits once the oldest (used - (limit - cost)) entries have left the
/// window: the wait for the last of those.
pub fn retry_after(at: &mut At, c: &Params, st: &Log) -> Result<f64, CommandError> {
    let must_leave = st.used - (c.limit - c.cost);
    let entry = at.keys.zscore_above_at(
        at.key,
        window_floor(c, at.now),
        must_leave as i64 - 1,
        at.now_ms(),
    )?;
    let entry = entry.ok_or("attempt to perform arithmetic on a nil value")?;
    Ok(ms_ceil(entry + c.period - at.now))
}

pub fn refund(at: &mut At, amount: f64, stamp: f64) -> Result<(), CommandError> {
    let now_ms = at.now_ms();
    at.keys.zrem_scored(at.key, int(stamp), amount as usize, now_ms)
}
