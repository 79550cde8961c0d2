//! A token bucket's arithmetic over a [`Rate`]: capacity `limit`, refilled continuously
//! at `limit / period`. Time is an argument; the bucket never reads a clock.

use crate::wire::{CheckResult, Rate};

/// A token bucket's state; `updated_ms == 0` means untouched (full).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bucket {
    pub tokens: f64,
    pub updated_ms: u64,
}

impl Bucket {
    fn refill(&mut self, now_ms: u64, rate: Rate) {
        let capacity = rate.limit() as f64;
        if self.updated_ms == 0 {
            self.tokens = capacity;
        } else {
            // A wall clock stepping back refills nothing rather than going negative.
            let elapsed = now_ms.saturating_sub(self.updated_ms) as f64;
            self.tokens = (self.tokens + elapsed * capacity / rate.period_ms() as f64).min(capacity);
        }
        self.updated_ms = now_ms.max(1);
    }

    /// Takes `cost` tokens if there are enough; returns the state as a check result.
    pub fn take(&mut self, now_ms: u64, rate: Rate, cost: u64) -> CheckResult {
        self.refill(now_ms, rate);
        let allowed = self.tokens + 1e-9 >= cost as f64;
        if allowed {
            self.tokens = (self.tokens - cost as f64).max(0.0);
        }
        let per_token_ms = rate.ms_per_token();
        CheckResult {
            allowed,
            limit: rate.limit(),
            remaining: (self.tokens + 1e-9).floor() as u64,
            reset_ms: ((rate.limit() as f64 - self.tokens) * per_token_ms).ceil() as u64,
            retry_after_ms: if allowed {
                0
            } else {
                ((cost as f64 - self.tokens) * per_token_ms).ceil() as u64
            },
            granted: if allowed { cost } else { 0 },
            lease_window_ms: 0,
            stamp: 0,
        }
    }

    pub fn give_back(&mut self, rate: Rate, tokens: u64) {
        self.tokens = (self.tokens + tokens as f64).min(rate.limit() as f64);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {
    use super::*;
    use crate::wire::{Limit, Period};
    use proptest::prelude::*;

    proptest! {
        /// Over any interval of any sequence, a bucket admits at most its capacity plus
        /// what refills meanwhile: limit + limit * t / period. Refunds included.
        #[test]
        fn admits_at_most_capacity_plus_refill_over_any_interval(
            limit in 1u64..50,
            period_ms in 1u64..10_000,
            steps in proptest::collection::vec((0u64..500, 1u64..5, any::<bool>()), 1..120),
        ) {
            let rate = Rate {
                limit: Limit::try_from(limit).unwrap(),
                period: Period::try_from(period_ms).unwrap(),
            };
            let mut bucket = Bucket::default();
            let mut now = 1_000u64;
            let mut taken: Vec<(u64, i64)> = Vec::new();
            for (elapsed, cost, refund) in steps {
                now += elapsed;
                let cost = cost.min(limit);
                let result = bucket.take(now, rate, cost);
                prop_assert!(result.remaining <= limit);
                if result.allowed {
                    taken.push((now, cost as i64));
                    if refund {
                        bucket.give_back(rate, cost);
                        taken.push((now, -(cost as i64)));
                    }
                } else {
                    prop_assert!(result.retry_after_ms > 0);
                }
            }
            for (i, &(start, _)) in taken.iter().enumerate() {
                let mut admitted = 0i64;
                for &(at, cost) in &taken[i..] {
                    admitted += cost;
                    let allowed = limit as f64 + limit as f64 * (at - start) as f64 / period_ms as f64;
                    prop_assert!(admitted as f64 <= allowed + 1e-6, "{admitted} over {allowed} in [{start}, {at}]");
                }
            }
        }
    }
}
