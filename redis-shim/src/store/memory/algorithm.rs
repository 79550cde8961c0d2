//! A check's parameters as the algorithms read them (request.lua's `check_params`), the
//! shared helpers of `scripts/common.lua`, and the seven operations of `common.lua`'s
//! contract handed to the algorithm a check names, one file per algorithm beside this one.
//!
//! Numbers are `f64`, as Lua's are, so the arithmetic and its rounding are the scripts'.

use super::keyspace::{CommandError, Keyspace};
use super::{concurrency, fixed_window, sliding_window_counter, sliding_window_log, token_bucket};
use ratelimit_wire::{Algorithm, CalendarWindow, Check};

/// Float rounding must never turn 3.9999999 tokens into 3 (common.lua's EPSILON).
pub const EPSILON: f64 = 1e-6;

/// Deepest debt of one key, in limits (common.lua's MAX_DEBT_LIMITS).
pub const MAX_DEBT_LIMITS: f64 = ratelimit_wire::MAX_DEBT_LIMITS as f64;

/// One check's parameters, and what the algorithms derive from them.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub algorithm: Algorithm,
    pub limit: f64,
    pub period_ms: f64,
    /// The period in microseconds.
    pub period: f64,
    /// `period / limit`, microseconds per token.
    pub interval: f64,
    pub cost: f64,
    pub lease: f64,
    pub shadow: bool,
    pub calendar: Option<CalendarWindow>,
}

impl Params {
    pub fn of(check: &Check) -> Params {
        Params::new(check.algorithm, check.limit, check.period_ms, check.calendar).with_charge(
            check.cost,
            check.lease,
            check.shadow,
        )
    }

    /// refund.lua's parameters: cost 1, no lease, not shadow.
    pub fn new(algorithm: Algorithm, limit: u64, period_ms: u64, calendar: Option<CalendarWindow>) -> Params {
        let (limit, period_ms) = (limit as f64, period_ms as f64);
        Params {
            algorithm,
            limit,
            period_ms,
            period: period_ms * 1000.0,
            interval: period_ms * 1000.0 / limit,
            cost: 1.0,
            lease: 0.0,
            shadow: false,
            calendar,
        }
    }

    fn with_charge(self, cost: u64, lease: u64, shadow: bool) -> Params {
        Params {
            cost: cost as f64,
            lease: lease as f64,
            shadow,
            ..self
        }
    }
}

/// One key's state as its algorithm loaded it (`st` in the scripts).
#[derive(Debug, Clone, Copy)]
pub enum State {
    TokenBucket(token_bucket::Bucket),
    FixedWindow(fixed_window::Window),
    SlidingWindowCounter(sliding_window_counter::Windows),
    SlidingWindowLog(sliding_window_log::Log),
    Concurrency(concurrency::Slots),
}

/// What every operation works on: the keyspace, the key, and the call's instant (µs).
pub struct At<'a> {
    pub keys: &'a mut Keyspace,
    pub key: &'a str,
    pub now: f64,
}

impl At<'_> {
    /// The call's instant in ms, as Redis's expiries read it.
    pub fn now_ms(&self) -> f64 {
        (self.now / 1000.0).floor()
    }
}

/// Microseconds to whole milliseconds, rounded up, never negative (common.lua).
pub fn ms_ceil(us: f64) -> f64 {
    (us / 1000.0).ceil().max(0.0)
}

/// The start (ms) of the aligned window of `period_ms` holding `now` (common.lua).
pub fn window_start_ms(now: f64, period_ms: f64) -> f64 {
    let now_ms = (now / 1000.0).floor();
    now_ms - now_ms % period_ms
}

/// `int()` of common.lua: a number as Redis receives it from `string.format('%.0f')`.
pub fn int(x: f64) -> f64 {
    x.round_ties_even()
}

/// `load(key, c, now)`: reads the key, writes nothing.
pub fn load(at: &mut At, c: &Params) -> Result<State, CommandError> {
    Ok(match c.algorithm {
        Algorithm::TokenBucket => State::TokenBucket(token_bucket::load(at)?),
        Algorithm::FixedWindow => State::FixedWindow(fixed_window::load(at, c)?),
        Algorithm::SlidingWindowCounter => State::SlidingWindowCounter(sliding_window_counter::load(at, c)?),
        Algorithm::SlidingWindowLog => State::SlidingWindowLog(sliding_window_log::load(at, c)?),
        Algorithm::Concurrency => State::Concurrency(concurrency::load(at)?),
    })
}

/// `available(c, st, now)`: whole tokens the key admits now.
pub fn available(c: &Params, st: &State, now: f64) -> f64 {
    match st {
        State::TokenBucket(st) => token_bucket::available(c, st, now),
        State::FixedWindow(st) => fixed_window::available(c, st),
        State::SlidingWindowCounter(st) => sliding_window_counter::available(c, st),
        State::SlidingWindowLog(st) => sliding_window_log::available(c, st),
        State::Concurrency(st) => concurrency::available(c, st),
    }
}

/// `charge(key, c, st, amount, now)`: takes `amount` tokens; the charge's stamp.
pub fn charge(at: &mut At, c: &Params, st: &mut State, amount: f64) -> Result<f64, CommandError> {
    match st {
        State::TokenBucket(st) => Ok(token_bucket::charge(at, c, st, amount)),
        State::FixedWindow(st) => fixed_window::charge(at, st, amount),
        State::SlidingWindowCounter(st) => sliding_window_counter::charge(at, c, st, amount),
        State::SlidingWindowLog(st) => sliding_window_log::charge(at, c, st, amount),
        State::Concurrency(st) => concurrency::charge(at, c, st, amount),
    }
}

/// `report(c, st, now)`: remaining and reset_ms.
pub fn report(at: &mut At, c: &Params, st: &State) -> Result<(f64, f64), CommandError> {
    match st {
        State::TokenBucket(st) => Ok(token_bucket::report(c, st, at.now)),
        State::FixedWindow(st) => Ok(fixed_window::report(c, st, at.now)),
        State::SlidingWindowCounter(st) => Ok(sliding_window_counter::report(c, st, at.now)),
        State::SlidingWindowLog(st) => sliding_window_log::report(at, c, st),
        State::Concurrency(st) => concurrency::report(at, c, st),
    }
}

/// `retry_after(c, st, now)`: ms until `c.cost` tokens are available.
pub fn retry_after(at: &mut At, c: &Params, st: &State) -> Result<f64, CommandError> {
    match st {
        State::TokenBucket(st) => Ok(token_bucket::retry_after(c, st, at.now)),
        State::FixedWindow(st) => Ok(fixed_window::until_window_end(st, at.now)),
        State::SlidingWindowCounter(st) => Ok(sliding_window_counter::retry_after(c, st, at.now)),
        State::SlidingWindowLog(st) => sliding_window_log::retry_after(at, c, st),
        State::Concurrency(st) => concurrency::retry_after(at, c, st),
    }
}

/// `lease_window(c, st, now)`: ms a lease charged now may be spent (0: any).
pub fn lease_window(c: &Params, st: &State, now: f64) -> f64 {
    match st {
        State::TokenBucket(_) | State::Concurrency(_) => 0.0,
        State::FixedWindow(st) => fixed_window::until_window_end(st, now),
        State::SlidingWindowCounter(st) => sliding_window_counter::lease_window(c, st, now),
        State::SlidingWindowLog(_) => c.period_ms,
    }
}

/// `refund(key, c, amount, stamp, now)`: gives back a charge, as far as it can be found.
pub fn refund(at: &mut At, c: &Params, amount: f64, stamp: f64) -> Result<(), CommandError> {
    match c.algorithm {
        Algorithm::TokenBucket => token_bucket::refund(at, c, amount),
        Algorithm::FixedWindow => fixed_window::refund(at, amount, stamp),
        Algorithm::SlidingWindowCounter => sliding_window_counter::refund(at, c, amount, stamp),
        Algorithm::SlidingWindowLog => sliding_window_log::refund(at, amount, stamp),
        Algorithm::Concurrency => at.keys.zrem(at.key, &format!("{}", int(stamp)), at.now_ms()),
    }
}

/// `debt_room(c, st, now)`: tokens a settlement may still charge; `None` for the
/// algorithms that take no settlement.
pub fn debt_room(c: &Params, st: &State, now: f64) -> Option<f64> {
    match st {
        State::TokenBucket(st) => Some(token_bucket::debt_room(c, st, now)),
        State::FixedWindow(st) => Some(((1.0 + MAX_DEBT_LIMITS) * c.limit - st.used).max(0.0)),
        State::SlidingWindowCounter(st) => Some(((1.0 + MAX_DEBT_LIMITS) * c.limit - st.current).max(0.0)),
        State::SlidingWindowLog(_) | State::Concurrency(_) => None,
    }
}
