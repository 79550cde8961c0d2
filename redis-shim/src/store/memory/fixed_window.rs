//! `scripts/fixed_window.lua` in Rust: a counter per aligned window (or calendar
//! window), its state a hash {w = the window's start (ms), n = tokens taken in it}
//! expiring at the window's end.

use super::algorithm::{int, ms_ceil, window_start_ms, At, Params};
use super::keyspace::CommandError;

#[derive(Debug, Clone, Copy)]
pub struct Window {
    start: f64,
    finish: f64,
    pub used: f64,
}

/// The window holding `now`: [start, finish) in ms.
fn bounds(c: &Params, now: f64) -> (f64, f64) {
    if let Some(calendar) = c.calendar {
        let (start, finish) = calendar.window_at((now / 1000.0).floor() as i64);
        return (start as f64, finish as f64);
    }
    let start = window_start_ms(now, c.period_ms);
    (start, start + c.period_ms)
}

pub fn load(at: &mut At, c: &Params) -> Result<Window, CommandError> {
    let (start, finish) = bounds(c, at.now);
    let [stored_start, stored_used] = at.keys.hmget(at.key, ["w", "n"], at.now_ms())?;
    let used = if stored_start == Some(start) {
        stored_used.unwrap_or(0.0)
    } else {
        0.0
    };
    Ok(Window { start, finish, used })
}

pub fn available(c: &Params, st: &Window) -> f64 {
    (c.limit - st.used).max(0.0)
}

pub fn charge(at: &mut At, st: &mut Window, amount: f64) -> Result<f64, CommandError> {
    st.used += amount;
    let now_ms = at.now_ms();
    at.keys.hset(at.key, &[("w", st.start), ("n", st.used)], now_ms)?;
    at.keys.pexpireat(at.key, st.finish, now_ms);
    Ok(st.start)
}

pub fn until_window_end(st: &Window, now: f64) -> f64 {
    ms_ceil(st.finish * 1000.0 - now)
}

pub fn report(c: &Params, st: &Window, now: f64) -> (f64, f64) {
    let reset_ms = if st.used > 0.0 {
        until_window_end(st, now)
    } else {
        0.0
    };
    (available(c, st), reset_ms)
}

pub fn refund(at: &mut At, amount: f64, stamp: f64) -> Result<(), CommandError> {
    let now_ms = at.now_ms();
    let [stored_start, stored_used] = at.keys.hmget(at.key, ["w", "n"], now_ms)?;
    if stored_start != Some(stamp) {
        return Ok(());
    }
    let used = stored_used.unwrap_or(0.0) - amount;
    if used <= 0.0 {
        at.keys.del(at.key, now_ms);
        Ok(())
    } else {
        at.keys.hset(at.key, &[("n", int(used))], now_ms)
    }
}
