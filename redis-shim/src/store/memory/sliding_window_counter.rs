//! `scripts/sliding_window_counter.lua` in Rust: two aligned windows' counters, the
//! previous one weighted by its overlap with the trailing period; the state a hash {w =
//! the current window's start (ms), c = its count, p = the previous window's count},
//! expiring two periods after `w`.

use super::algorithm::{int, ms_ceil, window_start_ms, At, Params, EPSILON};
use super::keyspace::CommandError;

#[derive(Debug, Clone, Copy)]
pub struct Windows {
    start: f64,
    pub current: f64,
    previous: f64,
    weight: f64,
}

pub fn load(at: &mut At, c: &Params) -> Result<Windows, CommandError> {
    let start = window_start_ms(at.now, c.period_ms);
    let [stored_start, stored_current, stored_previous] =
        at.keys.hmget(at.key, ["w", "c", "p"], at.now_ms())?;
    let (mut current, mut previous) = (0.0, 0.0);
    if stored_start == Some(start) {
        current = stored_current.unwrap_or(0.0);
        previous = stored_previous.unwrap_or(0.0);
    } else if stored_start == Some(start - c.period_ms) {
        previous = stored_current.unwrap_or(0.0);
    }
    let weight = 1.0 - (at.now - start * 1000.0) / c.period;
    Ok(Windows {
        start,
        current,
        previous,
        weight,
    })
}

pub fn available(c: &Params, st: &Windows) -> f64 {
    (c.limit - st.previous * st.weight - st.current + EPSILON)
        .floor()
        .max(0.0)
}

pub fn charge(at: &mut At, c: &Params, st: &mut Windows, amount: f64) -> Result<f64, CommandError> {
    st.current += amount;
    let now_ms = at.now_ms();
    let pairs = [("w", st.start), ("c", st.current), ("p", st.previous)];
    at.keys.hset(at.key, &pairs, now_ms)?;
    at.keys.pexpireat(at.key, st.start + 2.0 * c.period_ms, now_ms);
    Ok(st.start)
}

pub fn report(c: &Params, st: &Windows, now: f64) -> (f64, f64) {
    let reset_ms = if st.current > 0.0 {
        ms_ceil((st.start + 2.0 * c.period_ms) * 1000.0 - now)
    } else if st.previous > 0.0 {
        ms_ceil((st.start + c.period_ms) * 1000.0 - now)
    } else {
        0.0
    };
    (available(c, st), reset_ms)
}

pub fn retry_after(c: &Params, st: &Windows, now: f64) -> f64 {
    let window_us = st.start * 1000.0;
    // Within this window, once the previous count's weight has fallen far enough.
    let room = c.limit - c.cost - st.current;
    if room >= 0.0 && st.previous > 0.0 {
        return ms_ceil(window_us + c.period * (1.0 - room / st.previous) - now);
    }
    // Otherwise in the next window, where today's count becomes the weighted one.
    let room_next = c.limit - c.cost;
    let elapsed = if st.current > room_next {
        c.period * (1.0 - room_next / st.current)
    } else {
        0.0
    };
    ms_ceil(window_us + c.period + elapsed - now)
}

pub fn refund(at: &mut At, c: &Params, amount: f64, stamp: f64) -> Result<(), CommandError> {
    let now_ms = at.now_ms();
    let [stored_start, stored_current, stored_previous] = at.keys.hmget(at.key, ["w", "c", "p"], now_ms)?;
    let (field, count) = if stored_start == Some(stamp) {
        ("c", stored_current)
    } else if stored_start == Some(stamp + c.period_ms) {
        ("p", stored_previous)
    } else {
        return Ok(());
    };
    let count = (count.unwrap_or(0.0) - amount).max(0.0);
    at.keys.hset(at.key, &[(field, int(count))], now_ms)
}

/// Tokens charged to the current window are spent in it, or not at all.
pub fn lease_window(c: &Params, st: &Windows, now: f64) -> f64 {
    ms_ceil((st.start + c.period_ms) * 1000.0 - now)
}
