//! A `scope: local` concurrency limit's count of requests in flight, in the counter's
//! slot record: taken when a request is admitted, given back when its stream ends.
//!
//! A release can be lost (a VM replaced after a crash, a plugin reconfigured while
//! requests were in flight): a count nobody has taken from for `max_duration` is
//! reset, and its generation moves on, so a release that comes after the reset (from a
//! request of the old generation) gives back nothing that a newer request holds. While
//! requests keep arriving, a lost release stays counted; the reset needs `max_duration`
//! without a new admission.

use crate::wire::{CheckResult, Rate};

/// Longest a refused request is told to wait: any request in flight may end at once.
const RETRY_MS: u64 = 1_000;

/// Requests in flight for one counter (or for the counters sharing its slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    pub count: u64,
    /// Which reset the count belongs to; a slot's id is its generation. 0: never used.
    pub generation: u64,
    /// When a request last took a slot.
    pub taken_ms: u64,
}

impl InFlight {
    /// Takes a slot of `rate` (its limit, and its period as max_duration) if one is free.
    /// An admission's `stamp` is the generation its release must name.
    pub fn take(&mut self, now_ms: u64, rate: Rate) -> CheckResult {
        let max_duration_ms = rate.period_ms();
        if self.generation == 0 || now_ms >= self.taken_ms.saturating_add(max_duration_ms) {
            // Idle for max_duration: whatever is still counted was lost.
            self.count = 0;
            self.generation += 1;
        }
        let limit = rate.limit();
        let allowed = self.count < limit;
        if allowed {
            self.count += 1;
            self.taken_ms = now_ms;
        }
        let expires_in_ms = self
            .taken_ms
            .saturating_add(max_duration_ms)
            .saturating_sub(now_ms);
        CheckResult {
            allowed,
            limit,
            remaining: limit.saturating_sub(self.count),
            reset_ms: if self.count == 0 { 0 } else { expires_in_ms },
            retry_after_ms: if allowed {
                0
            } else {
                expires_in_ms.clamp(1, RETRY_MS)
            },
            granted: u64::from(allowed),
            lease_window_ms: 0,
            stamp: if allowed { self.generation as i64 } else { 0 },
        }
    }

    /// Gives back a slot taken in `generation`; nothing if the count was reset since.
    pub fn give_back(&mut self, generation: u64) {
        if generation == self.generation {
            self.count = self.count.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Limit, Period};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn rate(limit: u64, max_duration_ms: u64) -> Rate {
        Rate {
            limit: Limit::try_from(limit).unwrap(),
            period: Period::try_from(max_duration_ms).unwrap(),
        }
    }

    #[test]
    fn at_most_limit_in_flight_and_a_release_frees_one() {
        let mut in_flight = InFlight::default();
        let two = rate(2, 60_000);
        let first = in_flight.take(1_000, two);
        let second = in_flight.take(1_001, two);
        assert!(first.allowed && second.allowed);
        assert_eq!((second.remaining, second.granted), (0, 1));
        let refused = in_flight.take(1_002, two);
        assert!(!refused.allowed);
        assert_eq!((refused.retry_after_ms, refused.stamp), (1_000, 0));
        in_flight.give_back(first.stamp as u64);
        assert!(in_flight.take(1_003, two).allowed);
    }

    #[test]
    fn a_lost_release_comes_back_after_max_duration_and_a_late_one_frees_nothing() {
        let mut in_flight = InFlight::default();
        let one = rate(1, 2_000);
        let lost = in_flight.take(10_000, one);
        let refused = in_flight.take(11_500, one);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_ms, 500, "when the lost slot expires");
        let after = in_flight.take(12_000, one);
        assert!(after.allowed, "idle for max_duration: reset");
        assert_ne!(after.stamp, lost.stamp);
        // The lost request's release arrives at last: it must not free the new slot.
        in_flight.give_back(lost.stamp as u64);
        assert!(!in_flight.take(12_001, one).allowed);
        in_flight.give_back(after.stamp as u64);
        assert!(in_flight.take(12_002, one).allowed);
    }
}
