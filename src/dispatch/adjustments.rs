//! What a worker owes the shim besides checks: tokens given back (leased tokens left
//! unspent, released concurrency slots) and earlier requests' real costs to settle. They
//! wait here for a call to carry them, a batch's worth per call, and are lost with a
//! call that fails (counted in `adjustments_lost`): Redis then keeps the tokens until
//! the counter's window or the slot's `max_duration` ends.

use crate::wire::{Settlement, TokenReturn, MAX_BATCH};

/// The returns and settlements waiting for a call, in the order they came.
#[derive(Debug, Default)]
pub struct Adjustments {
    returns: Vec<TokenReturn>,
    settlements: Vec<Settlement>,
}

/// What one call carries besides its requests' checks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Carried {
    pub returns: Vec<TokenReturn>,
    pub settlements: Vec<Settlement>,
}

impl Carried {
    /// How many adjustments the call carries: how many are lost if it fails.
    pub fn count(&self) -> usize {
        self.returns.len() + self.settlements.len()
    }
}

impl Adjustments {
    pub fn give_back(&mut self, back: TokenReturn) {
        self.returns.push(back);
    }

    pub fn settle(&mut self, settlements: Vec<Settlement>) {
        self.settlements.extend(settlements);
    }

    pub fn is_empty(&self) -> bool {
        self.returns.is_empty() && self.settlements.is_empty()
    }

    /// The oldest of each kind, up to what one call may carry ([`MAX_BATCH`] each: the
    /// shim refuses more); the rest wait for the next call.
    pub fn take_for_call(&mut self) -> Carried {
        Carried {
            returns: take_oldest(&mut self.returns),
            settlements: take_oldest(&mut self.settlements),
        }
    }

    /// Drops everything: no call will carry it. How many were dropped.
    pub fn discard(&mut self) -> usize {
        let dropped = self.returns.len() + self.settlements.len();
        self.returns.clear();
        self.settlements.clear();
        dropped
    }
}

/// The first [`MAX_BATCH`] of `queue`, removed.
fn take_oldest<T>(queue: &mut Vec<T>) -> Vec<T> {
    let count = queue.len().min(MAX_BATCH);
    queue.drain(..count).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Algorithm;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn back(amount: u64) -> TokenReturn {
        TokenReturn {
            key: "k".into(),
            algorithm: Algorithm::Concurrency,
            limit: 2,
            period_ms: 30_000,
            amount,
            stamp: 1,
            calendar: None,
        }
    }

    fn settlement(actual: u64) -> Settlement {
        Settlement {
            key: "k".into(),
            algorithm: Algorithm::TokenBucket,
            limit: 1_000,
            period_ms: 60_000,
            charged: 100,
            actual,
            stamp: 0,
            calendar: None,
        }
    }

    #[test]
    fn a_call_carries_at_most_a_batch_of_each_kind_oldest_first() {
        let mut adjustments = Adjustments::default();
        assert!(adjustments.is_empty());
        for amount in 0..(MAX_BATCH as u64 + 2) {
            adjustments.give_back(back(amount));
        }
        adjustments.settle(vec![settlement(1), settlement(2)]);
        let first = adjustments.take_for_call();
        assert_eq!(first.returns.len(), MAX_BATCH);
        assert_eq!(first.returns.first(), Some(&back(0)));
        assert_eq!(first.settlements, vec![settlement(1), settlement(2)]);
        assert_eq!(first.count(), MAX_BATCH + 2);
        assert!(!adjustments.is_empty(), "two returns wait for the next call");
        let second = adjustments.take_for_call();
        assert_eq!(
            second,
            Carried {
                returns: vec![back(MAX_BATCH as u64), back(MAX_BATCH as u64 + 1)],
                settlements: Vec::new(),
            }
        );
        assert!(adjustments.is_empty());
        assert_eq!(adjustments.take_for_call().count(), 0);
    }

    #[test]
    fn discarding_counts_what_is_lost() {
        let mut adjustments = Adjustments::default();
        adjustments.give_back(back(1));
        adjustments.settle(vec![settlement(5)]);
        adjustments.settle(Vec::new());
        assert_eq!(adjustments.discard(), 2);
        assert!(adjustments.is_empty());
        assert_eq!(adjustments.discard(), 0);
    }
}
