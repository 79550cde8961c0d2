//! `scripts/token_bucket.lua` in Rust: the token bucket kept as GCRA, its state the
//! theoretical arrival time (TAT, µs) at which the bucket is full again, the key expiring
//! then.

use super::algorithm::{int, ms_ceil, At, Params, EPSILON, MAX_DEBT_LIMITS};
use super::keyspace::CommandError;

#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tat: f64,
}

pub fn load(at: &mut At) -> Result<Bucket, CommandError> {
    let tat = at.keys.get(at.key, at.now_ms())?.unwrap_or(at.now);
    // A TAT in the past is a full bucket: idle time earns no credit beyond capacity.
    Ok(Bucket { tat: tat.max(at.now) })
}

pub fn available(c: &Params, st: &Bucket, now: f64) -> f64 {
    ((c.period - (st.tat - now)) / c.interval + EPSILON)
        .floor()
        .max(0.0)
}

pub fn charge(at: &mut At, c: &Params, st: &mut Bucket, amount: f64) -> f64 {
    st.tat = (st.tat + amount * c.interval).ceil();
    let now_ms = at.now_ms();
    at.keys
        .set_px(at.key, st.tat, ms_ceil(st.tat - at.now).max(1.0), now_ms);
    0.0
}

pub fn report(c: &Params, st: &Bucket, now: f64) -> (f64, f64) {
    (available(c, st, now), ms_ceil(st.tat - now))
}

pub fn retry_after(c: &Params, st: &Bucket, now: f64) -> f64 {
    ms_ceil(st.tat + c.cost * c.interval - c.period - now)
}

pub fn refund(at: &mut At, c: &Params, amount: f64) -> Result<(), CommandError> {
    let now_ms = at.now_ms();
    let Some(tat) = at.keys.get(at.key, now_ms)? else {
        return Ok(());
    };
    let tat = tat - amount * c.interval;
    if tat <= at.now {
        at.keys.del(at.key, now_ms);
    } else {
        at.keys
            .set_px(at.key, int(tat), int(ms_ceil(tat - at.now)), now_ms);
    }
    Ok(())
}

/// In debt the TAT lies more than a period ahead; at most MAX_DEBT_LIMITS periods more.
pub fn debt_room(c: &Params, st: &Bucket, now: f64) -> f64 {
    let latest = now + (1.0 + MAX_DEBT_LIMITS) * c.period;
    ((latest - st.tat) / c.interval + EPSILON).floor().max(0.0)
}
