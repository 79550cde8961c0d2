//! Checked values of a rate: a [`Limit`] and a [`Period`], each built with `TryFrom` so
//! that a value out of the bounds every part relies on cannot exist. The filter's
//! configuration holds them; the shim checks what arrives on the wire with the same
//! constructors, so each bound is defined once, here.

use crate::Algorithm;
use std::fmt;
use std::time::Duration;

/// Longest period accepted: one year. Keeps every time value exact in Lua's doubles.
pub const MAX_PERIOD_MS: u64 = 366 * 24 * 3600 * 1000;
/// Largest limit accepted.
pub const MAX_LIMIT: u64 = 1_000_000_000;

/// A value outside its bounds; the text says which bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfBounds(pub String);

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfBounds {}

/// How many tokens a counter holds: `1..=MAX_LIMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Limit(u64);

impl Limit {
    pub fn get(self) -> u64 {
        self.0
    }

    /// A limit the algorithm can hold (a sliding window log stores one entry per token,
    /// a concurrency counter one per request in flight: they hold less).
    pub fn for_algorithm(value: u64, algorithm: Algorithm) -> Result<Limit, OutOfBounds> {
        let max = algorithm.traits().max_limit;
        if value == 0 || value > max {
            return Err(OutOfBounds(if max < MAX_LIMIT {
                format!("must be between 1 and {max} for a {}", algorithm.as_str())
            } else {
                format!("must be between 1 and {max}")
            }));
        }
        Ok(Limit(value))
    }
}

impl TryFrom<u64> for Limit {
    type Error = OutOfBounds;

    fn try_from(value: u64) -> Result<Limit, OutOfBounds> {
        Limit::for_algorithm(value, Algorithm::TokenBucket)
    }
}

impl TryFrom<i64> for Limit {
    type Error = OutOfBounds;

    fn try_from(value: i64) -> Result<Limit, OutOfBounds> {
        Limit::try_from(u64::try_from(value).unwrap_or(0))
    }
}

/// The time over which a limit applies: `1ms..=366d`, whole milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period(u64);

impl Period {
    pub fn as_ms(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for Period {
    type Error = OutOfBounds;

    /// From milliseconds.
    fn try_from(ms: u64) -> Result<Period, OutOfBounds> {
        if ms == 0 || ms > MAX_PERIOD_MS {
            return Err(OutOfBounds("must be between 1ms and 366d".into()));
        }
        Ok(Period(ms))
    }
}

impl TryFrom<Duration> for Period {
    type Error = OutOfBounds;

    fn try_from(duration: Duration) -> Result<Period, OutOfBounds> {
        // A duration too long for u64 milliseconds is out of bounds anyway.
        Period::try_from(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }
}

/// `limit` tokens per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub limit: Limit,
    pub period: Period,
}

impl Rate {
    pub fn limit(self) -> u64 {
        self.limit.get()
    }

    pub fn period_ms(self) -> u64 {
        self.period.as_ms()
    }

    /// Milliseconds for one token to come back, at an even refill over the period.
    pub fn ms_per_token(self) -> f64 {
        self.period_ms() as f64 / self.limit() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MAX_CONCURRENCY_LIMIT, MAX_LOG_LIMIT};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn limits_and_periods_refuse_what_the_scripts_cannot_hold() {
        assert!(Limit::try_from(0u64).is_err());
        assert!(Limit::try_from(-5i64).is_err());
        assert_eq!(Limit::try_from(MAX_LIMIT).map(Limit::get), Ok(MAX_LIMIT));
        assert!(Limit::try_from(MAX_LIMIT + 1).is_err());
        assert!(Limit::for_algorithm(MAX_LOG_LIMIT + 1, Algorithm::SlidingWindowLog).is_err());
        assert!(Limit::for_algorithm(MAX_LOG_LIMIT + 1, Algorithm::FixedWindow).is_ok());
        assert!(Limit::for_algorithm(MAX_CONCURRENCY_LIMIT + 1, Algorithm::Concurrency).is_err());
        assert!(Limit::for_algorithm(MAX_CONCURRENCY_LIMIT, Algorithm::Concurrency).is_ok());
        assert!(Period::try_from(0u64).is_err());
        assert!(Period::try_from(Duration::from_secs(367 * 86_400)).is_err());
        assert_eq!(
            Period::try_from(Duration::from_millis(250)).map(Period::as_ms),
            Ok(250)
        );
    }
}
