//! The worker's side of leases, as the dispatcher keeps it: the requests waiting for
//! one of this worker's lease acquisitions to end ([`LeaseWaiters`]), and the leases it
//! acquired until they expire, when what they leave goes back to the shim
//! ([`HeldLeases`]). What a lease holds lives in shared data (`crate::local`); these
//! only say who to run again, and when.

use crate::local::HeldLease;
use std::collections::HashMap;

/// A request waiting for this worker's acquisition of a counter's lease. `H` is how the
/// host finds the request again.
struct LeaseWaiter<H> {
    fingerprint: u64,
    deadline_ms: u64,
    request: H,
}

/// Which waiters to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waking<'a> {
    /// Those waiting on these counters (by fingerprint): their acquisitions ended.
    Counters(&'a [u64]),
    /// Every one: the dispatcher is going away.
    All,
}

/// The requests waiting for this worker's lease acquisitions, in the order they came.
pub struct LeaseWaiters<H> {
    waiting: Vec<LeaseWaiter<H>>,
}

impl<H> Default for LeaseWaiters<H> {
    fn default() -> Self {
        LeaseWaiters { waiting: Vec::new() }
    }
}

impl<H> LeaseWaiters<H> {
    /// `request` waits for the acquisition of the counter `fingerprint`, at most until
    /// `deadline_ms`.
    pub fn wait(&mut self, fingerprint: u64, deadline_ms: u64, request: H) {
        self.waiting.push(LeaseWaiter {
            fingerprint,
            deadline_ms,
            request,
        });
    }

    /// Removes the waiters to run again, in the order they came; the rest keep waiting.
    pub fn wake(&mut self, which: Waking<'_>) -> Vec<H> {
        let (woken, waiting) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|waiter| match which {
                    Waking::Counters(fingerprints) => fingerprints.contains(&waiter.fingerprint),
                    Waking::All => true,
                });
        self.waiting = waiting;
        woken.into_iter().map(|waiter| waiter.request).collect()
    }

    /// The counters with a waiter past its deadline, one entry per such waiter. Waking
    /// them runs every waiter of those counters again: the overdue one to be checked
    /// exactly, the others at no cost, as they would at the acquisition's end.
    pub fn overdue(&self, now_ms: u64) -> Vec<u64> {
        self.waiting
            .iter()
            .filter(|waiter| waiter.deadline_ms <= now_ms)
            .map(|waiter| waiter.fingerprint)
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// The leases this worker acquired for the Envoy, by counter, until they expire.
#[derive(Debug, Default)]
pub struct HeldLeases {
    by_counter: HashMap<u64, HeldLease>,
}

impl HeldLeases {
    /// Remembers a lease, replacing an earlier one of the same counter (which the later
    /// acquisition replaced in shared data too).
    pub fn hold(&mut self, lease: HeldLease) {
        self.by_counter.insert(lease.fingerprint, lease);
    }

    /// Removes the leases expired at `now_ms`, in no particular order: what they leave
    /// goes back to the shim.
    pub fn take_expired(&mut self, now_ms: u64) -> Vec<HeldLease> {
        let expired: Vec<u64> = self
            .by_counter
            .values()
            .filter(|lease| lease.expires_ms <= now_ms)
            .map(|lease| lease.fingerprint)
            .collect();
        expired
            .iter()
            .filter_map(|fingerprint| self.by_counter.remove(fingerprint))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Algorithm, Check};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn lease(fingerprint: u64, expires_ms: u64) -> HeldLease {
        HeldLease {
            fingerprint,
            expires_ms,
            counter: Check {
                key: format!("k{fingerprint}"),
                algorithm: Algorithm::TokenBucket,
                limit: 10,
                period_ms: 1_000,
                cost: 1,
                shadow: false,
                lease: 5,
                calendar: None,
                regions: Default::default(),
            },
        }
    }

    #[test]
    fn an_ended_acquisition_wakes_only_its_waiters_in_order() {
        let mut waiters = LeaseWaiters::default();
        waiters.wait(7, 100, "a");
        waiters.wait(8, 100, "b");
        waiters.wait(7, 100, "c");
        assert_eq!(waiters.wake(Waking::Counters(&[7])), vec!["a", "c"]);
        assert_eq!(waiters.wake(Waking::Counters(&[7])), Vec::<&str>::new());
        assert!(!waiters.is_empty(), "b still waits for counter 8");
        assert_eq!(waiters.wake(Waking::Counters(&[9, 8])), vec!["b"]);
        assert!(waiters.is_empty());
    }

    #[test]
    fn waking_all_empties_the_waiters() {
        let mut waiters = LeaseWaiters::default();
        waiters.wait(1, 10, 1);
        waiters.wait(2, 20, 2);
        assert_eq!(waiters.wake(Waking::All), vec![1, 2]);
        assert!(waiters.is_empty());
    }

    #[test]
    fn overdue_names_the_counters_of_waiters_past_their_deadline() {
        let mut waiters = LeaseWaiters::default();
        waiters.wait(1, 100, "early");
        waiters.wait(1, 300, "late on the same counter");
        waiters.wait(2, 300, "late");
        assert_eq!(waiters.overdue(99), Vec::<u64>::new());
        let overdue = waiters.overdue(100);
        assert_eq!(overdue, vec![1], "a deadline reached counts as passed");
        assert_eq!(
            waiters.wake(Waking::Counters(&overdue)),
            vec!["early", "late on the same counter"],
            "every waiter of the counter runs again"
        );
        assert_eq!(waiters.overdue(300), vec![2]);
    }

    #[test]
    fn expired_leases_are_taken_once_and_the_rest_kept() {
        let mut held = HeldLeases::default();
        held.hold(lease(1, 100));
        held.hold(lease(2, 200));
        held.hold(lease(3, 100));
        assert!(held.take_expired(99).is_empty());
        let mut expired: Vec<u64> = held.take_expired(100).iter().map(|l| l.fingerprint).collect();
        expired.sort_unstable();
        assert_eq!(expired, vec![1, 3]);
        assert!(held.take_expired(150).is_empty(), "taken once");
        assert_eq!(held.take_expired(200), vec![lease(2, 200)]);
    }

    #[test]
    fn a_later_lease_of_a_counter_replaces_the_earlier() {
        let mut held = HeldLeases::default();
        held.hold(lease(1, 100));
        held.hold(lease(1, 500));
        assert!(held.take_expired(100).is_empty(), "the earlier one is forgotten");
        assert_eq!(held.take_expired(500), vec![lease(1, 500)]);
    }
}
