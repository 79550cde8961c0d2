//! What a worker's dispatch decides, as state: which requests wait for the shim and
//! which for this worker's lease acquisitions, what each call carries (a batch of
//! requests, [`crate::batch`]'s bookkeeping, with the returns and settlements waiting),
//! when the host must be woken to send, and who runs again when a call or an
//! acquisition ends. The worker (`super::worker`, `super::rounds`) keeps one
//! [`DispatchState`] and does what it says. `H` is the worker's handle to a request;
//! here it is only carried, and asked whether the request is still there.

use super::adjustments::Adjustments;
use super::call::{refusal_reason, OutgoingCall};
use super::leases::{HeldLeases, LeaseWaiters, Waking};
use super::queued::QueuedRequest;
use crate::batch::{Batch, Batcher, Call};
use crate::local::HeldLease;
use crate::shim_call::ShimFailure;
use crate::wire::{Settlement, TokenReturn};
use std::fmt::Display;

/// One worker's dispatch: the queue for the shim and the calls in flight, the lease
/// waiters, the leases held and the adjustments waiting for a call.
pub struct DispatchState<H> {
    batcher: Batcher<QueuedRequest<H>>,
    lease_waiters: LeaseWaiters<H>,
    held_leases: HeldLeases,
    adjustments: Adjustments,
    /// A call of adjustments alone has no request's deadline to shorten it.
    timeout_ms: u64,
    call_refusal_said: bool,
}

/// What one round of sending hands the host, to apply in this order.
pub struct Round<H> {
    /// Requests whose deadline passed while they waited: they fail as timed out.
    pub timed_out: Vec<QueuedRequest<H>>,
    /// Requests whose stream went away while they waited: their lease acquisitions end
    /// unanswered.
    pub gone: Vec<QueuedRequest<H>>,
    /// The call to make now: waiting requests, or returns and settlements alone.
    pub call: Option<Batch<QueuedRequest<H>>>,
}

impl<H> Round<H> {
    /// Nothing more can be sent until a call ends or something new waits.
    pub fn is_last(&self) -> bool {
        self.call.is_none() && self.timed_out.is_empty() && self.gone.is_empty()
    }
}

/// Envoy refused to start a call.
#[derive(Debug, PartialEq, Eq)]
pub struct RefusedCall {
    /// What every request of the call gets.
    pub failure: ShimFailure,
    /// Said once per worker, at error level: refusing every call is a configuration
    /// mistake, and each failed request is still counted in `shim_errors`.
    pub log_line: Option<String>,
}

impl<H> DispatchState<H> {
    /// At most `calls_in_flight` calls at once; `timeout_ms` is each request's allowance.
    pub fn new(calls_in_flight: usize, timeout_ms: u64) -> Self {
        DispatchState {
            batcher: Batcher::new(calls_in_flight, timeout_ms),
            lease_waiters: LeaseWaiters::default(),
            held_leases: HeldLeases::default(),
            adjustments: Adjustments::default(),
            timeout_ms,
            call_refusal_said: false,
        }
    }

    /// Queues a request for the shim. True when the host must wake the root to send it.
    pub fn submit(&mut self, request: QueuedRequest<H>, deadline_ms: u64) -> bool {
        self.batcher.push(request, deadline_ms)
    }

    /// The request waits for this worker's acquisition of the counter `fingerprint`.
    pub fn await_lease(&mut self, fingerprint: u64, deadline_ms: u64, request: H) {
        self.lease_waiters.wait(fingerprint, deadline_ms, request);
    }

    /// Removes the lease waiters to run again.
    pub fn wake_lease_waiters(&mut self, which: Waking<'_>) -> Vec<H> {
        self.lease_waiters.wake(which)
    }

    /// The counters with a lease waiter past its deadline (see [`LeaseWaiters::overdue`]).
    pub fn overdue_lease_counters(&self, now_ms: u64) -> Vec<u64> {
        self.lease_waiters.overdue(now_ms)
    }

    /// Remembers a lease this worker acquired, to give back what it leaves.
    pub fn hold_lease(&mut self, lease: HeldLease) {
        self.held_leases.hold(lease);
    }

    /// The leases expired by `now_ms`, forgotten: the host gives back what they left.
    pub fn take_expired_leases(&mut self, now_ms: u64) -> Vec<HeldLease> {
        self.held_leases.take_expired(now_ms)
    }

    /// Queues tokens for the next call.
    pub fn give_back(&mut self, back: TokenReturn) {
        self.adjustments.give_back(back);
    }

    /// Queues requests' real costs to settle, sent soon (see
    /// [`DispatchState::flush_adjustments`]). True when the host must wake the root.
    pub fn settle(&mut self, settlements: Vec<Settlement>) -> bool {
        if settlements.is_empty() {
            return false;
        }
        self.adjustments.settle(settlements);
        self.flush_adjustments()
    }

    /// Makes what waits to go back leave now rather than with the next request's call.
    /// True when the host must wake the root, which sends it (alone, if no request
    /// waits); with every call in flight, the first to end sends it.
    pub fn flush_adjustments(&mut self) -> bool {
        !self.adjustments.is_empty() && self.batcher.wake_for_adjustments()
    }

    /// The wake-up reached the root, or could not be sent (the tick sends instead).
    pub fn woken(&mut self) {
        self.batcher.woken();
    }

    /// On the tick, whether to send the adjustments waiting. A lost wake-up would hold
    /// back every later one, so the pending one is forgotten when they wait.
    pub fn tick_sends_adjustments(&mut self) -> bool {
        self.sends_on_tick(!self.adjustments.is_empty())
    }

    /// On the tick, whether to send the requests waiting (none should wait without a
    /// wake-up); as [`DispatchState::tick_sends_adjustments`].
    pub fn tick_sends_requests(&mut self) -> bool {
        self.sends_on_tick(self.batcher.has_waiting())
    }

    fn sends_on_tick(&mut self, something_waits: bool) -> bool {
        if something_waits {
            self.batcher.woken();
        }
        something_waits
    }

    /// The next round of sending at `now_ms`; the host sends round after round until
    /// [`Round::is_last`]. `is_live` tells the requests whose stream is still there.
    pub fn next_round(&mut self, now_ms: u64, is_live: impl Fn(&H) -> bool) -> Round<H> {
        let next = self.batcher.next(now_ms, |queued| is_live(&queued.request));
        let mut round = Round {
            timed_out: next.expired,
            gone: next.dropped,
            call: next.batch,
        };
        let idle = !self.batcher.has_waiting() && self.batcher.may_call();
        if round.is_last() && idle && !self.adjustments.is_empty() {
            // No request to carry the returns and settlements: they go alone, so a
            // released slot is free again within a round trip.
            round.call = Some(Batch {
                members: Vec::new(),
                timeout_ms: self.timeout_ms,
            });
        }
        round
    }

    /// The call for `batch`, carrying the oldest adjustments waiting. Taken as it is
    /// sent, not when the round was decided: what the round's failures gave back since
    /// goes with it.
    pub fn prepare_call(&mut self, batch: Batch<QueuedRequest<H>>) -> OutgoingCall<H> {
        OutgoingCall::new(batch, self.adjustments.take_for_call())
    }

    /// Records a call the host accepted, under its token.
    pub fn sent(&mut self, token: u32, call: Call<QueuedRequest<H>>) {
        self.batcher.sent(token, call);
    }

    /// The call with this token, answered (or failed); `None` if unknown or taken.
    pub fn answered(&mut self, token: u32) -> Option<Call<QueuedRequest<H>>> {
        self.batcher.answered(token)
    }

    /// Envoy refused to start a call to `cluster`.
    pub fn call_refused(&mut self, cluster: &str, unknown_cluster: bool, error: &dyn Display) -> RefusedCall {
        let reason = refusal_reason(cluster, unknown_cluster, error);
        let first = !std::mem::replace(&mut self.call_refusal_said, true);
        RefusedCall {
            log_line: first.then(|| format!("calls to the shim fail: {reason}")),
            failure: ShimFailure::Unreachable(reason),
        }
    }

    /// Every request waiting or in flight, removed: the dispatcher is going away.
    pub fn take_all_requests(&mut self) -> Vec<QueuedRequest<H>> {
        self.batcher.take_all()
    }

    /// Drops the returns and settlements no call will carry; how many.
    pub fn discard_adjustments(&mut self) -> usize {
        self.adjustments.discard()
    }
}

#[cfg(test)]
mod tests;
