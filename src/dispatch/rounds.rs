//! The worker's shim calls, round by round, over its host: who is sent, failed or run
//! again, and in which order, is the [`DispatchState`](super::state::DispatchState)'s
//! to decide; this carries it out through [`Host`]: it makes the calls, enters each
//! request to apply its answer (or the call's failure), resumes it, and runs the lease
//! waiters whose acquisition ended. It also takes the plugin's end (`fail_all`): no
//! paused request may outlive it.
//!
//! Calls are sent only on a wake-up, a tick or a call's answer, never from a request's
//! callback: a host may tie a call to the context that made it (proxy-wasm's SDK drops
//! the answer once that context is gone), and a batch's answer must outlive any one
//! request. (Sending a lone request's call from its own callback instead was measured
//! and did not shorten its wait: `bench/RESULTS.md`.)

use super::call::{answers_per_request, call_headers};
use super::host::{CallRefused, Flow, Host, LogLevel};
use super::leases::Waking;
use super::paused::{PendingRequest, RequestHandle};
use super::queued::{ended_acquisitions, QueuedRequest};
use super::state::Round;
use super::worker::Worker;
use crate::batch::{Batch, Call};
use crate::request::{Start, Transition};
use crate::shim_call::{read_batch_answer, RequestAnswer, ShimFailure};
use std::cell::Cell;
use std::time::Duration;

type Queued<H> = QueuedRequest<RequestHandle<<H as Host>::RequestId>>;

/// What came back for a call, read by the host in the callback that delivered it.
pub struct CallAnswer<'a> {
    /// The answer's `:status`; `None` when the call got no response.
    pub status: Option<&'a str>,
    /// The version the shim states in its answer's header.
    pub shim_version: Option<&'a str>,
    pub body: &'a [u8],
}

impl<H: Host> Worker<H> {
    /// Carries out where the local layer left a request: decided (applied now), or
    /// queued for the shim or for this worker's lease acquisition. The caller runs in
    /// the request's context; on [`Flow::Continue`] the host lets the request go on.
    pub fn proceed(&self, request: &PendingRequest<H::RequestId>, transition: Transition<Start>) -> Flow {
        let Transition { next, events } = transition;
        let deadline_ms = request.deadline_ms();
        match next {
            Start::Decided(outcome) => request.apply(
                self,
                Transition {
                    next: outcome,
                    events,
                },
            ),
            Start::AskShim { .. } if self.closing() => {
                // No call will be made any more: the rules' failure modes decide now.
                self.record(events);
                let now = self.host.now_ms();
                let answer = Err(ShimFailure::ShuttingDown);
                request.answered(self, now, answer)
            }
            Start::AskShim {
                checks,
                claims,
                slots,
            } => {
                self.record(events);
                let queued = QueuedRequest {
                    request: request.handle(),
                    checks,
                    claims,
                    slots,
                    queued_at_us: self.host.now_us(),
                };
                let wake = self.state.borrow_mut().submit(queued, deadline_ms);
                if wake {
                    self.wake();
                }
                Flow::Pause
            }
            // Never while closing: `run_local` and `start` then forbid waiting.
            Start::AwaitLease(fingerprint) => {
                self.record(events);
                self.state
                    .borrow_mut()
                    .await_lease(fingerprint, deadline_ms, request.handle());
                Flow::Pause
            }
        }
    }

    /// Runs again the requests waiting for these acquisitions: they spend the lease,
    /// acquire the next, or are checked exactly past their deadline.
    fn wake_lease_waiters(&self, which: Waking<'_>, now: u64) {
        let woken = self.state.borrow_mut().wake_lease_waiters(which);
        let contexts = Entered::new(&self.host);
        for waiter in woken {
            let Some(request) = waiter.upgrade().filter(|request| contexts.enter(request.id)) else {
                continue;
            };
            let transition = request.run_local(self, now);
            if let Flow::Continue = self.proceed(&request, transition) {
                self.resume();
            }
        }
    }

    /// The requests whose acquisitions ended with `finished`, run again.
    fn after_acquisitions(&self, finished: &[Queued<H>], now: u64) {
        let ended = ended_acquisitions(finished);
        if !ended.is_empty() {
            self.wake_lease_waiters(Waking::Counters(&ended), now);
        }
    }

    /// The host ran the wake-up asked for with [`Host::wake`].
    pub fn on_wake(&self) {
        self.state.borrow_mut().woken();
        self.dispatch_waiting();
    }

    /// The safety net, about twice per timeout: requests that wait without a wake-up
    /// (none should) are sent or failed within about one timeout, lease waiters past
    /// their deadline are checked exactly, and returns and settlements left behind go.
    pub fn on_tick(&self) {
        let now = self.host.now_ms();
        self.return_expired_leases(now);
        let send_adjustments = self.state.borrow_mut().tick_sends_adjustments();
        if send_adjustments {
            self.dispatch_waiting();
        }
        let overdue = self.state.borrow().overdue_lease_counters(now);
        if !overdue.is_empty() {
            self.wake_lease_waiters(Waking::Counters(&overdue), now);
        }
        let send_requests = self.state.borrow_mut().tick_sends_requests();
        if send_requests {
            self.dispatch_waiting();
        }
    }

    /// Sends what waits, round by round, while calls may start: each round's timed-out
    /// requests fail and its gone ones end their acquisitions before its call is sent.
    fn dispatch_waiting(&self) {
        if self.closing() {
            return;
        }
        loop {
            let now = self.host.now_ms();
            let round = self.state.borrow_mut().next_round(now, RequestHandle::is_live);
            let last = round.is_last();
            let Round {
                timed_out,
                gone,
                call,
            } = round;
            let timeouts = vec![Err(ShimFailure::Timeout); timed_out.len()];
            self.finish_all(&timed_out, timeouts, now);
            // A request that went away ends its acquisitions unanswered.
            for request in &gone {
                self.local(false).release(&request.claims);
            }
            self.after_acquisitions(&timed_out, now);
            self.after_acquisitions(&gone, now);
            if let Some(batch) = call {
                self.send(batch, now);
            }
            if last {
                return;
            }
        }
    }

    fn send(&self, batch: Batch<Queued<H>>, now: u64) {
        let call = self.state.borrow_mut().prepare_call(batch);
        let shim = &self.config.shim;
        let sent = call.body.and_then(|body| {
            let timeout = Duration::from_millis(call.timeout_ms);
            self.host
                .send_call(&shim.cluster, call_headers(shim), &body, timeout)
                .map_err(|refused| self.call_refused(&shim.cluster, refused))
        });
        let requests = call.requests;
        match sent {
            Ok(token) => {
                let sent_at_us = self.host.now_us();
                self.metrics.shim_call_carried(&self.host, requests.len());
                for request in &requests {
                    let waited = sent_at_us.saturating_sub(request.queued_at_us);
                    self.metrics.waited_in_queue(&self.host, waited);
                }
                self.state.borrow_mut().sent(
                    token,
                    Call {
                        members: requests,
                        sent_at_us,
                        adjustments: call.adjustments,
                    },
                );
            }
            Err(failure) => {
                self.metrics.adjustments_lost(&self.host, call.adjustments);
                let answers = answers_per_request(Err(failure), requests.len());
                self.finish_all(&requests, answers.each, now);
                self.after_acquisitions(&requests, now);
            }
        }
    }

    /// The host refused to start a call: the failure its requests get, logged once.
    fn call_refused(&self, cluster: &str, refused: CallRefused) -> ShimFailure {
        let refused = self
            .state
            .borrow_mut()
            .call_refused(cluster, refused.unknown_cluster, &refused.error);
        if let Some(line) = refused.log_line {
            self.host.log(LogLevel::Error, &line);
        }
        refused.failure
    }

    /// The answer to the call with this token (or its failure) arrived.
    pub fn on_call_response(&self, token: u32, answer: CallAnswer<'_>) {
        let Some(call) = self.state.borrow_mut().answered(token) else {
            return;
        };
        let took = self.host.now_us().saturating_sub(call.sent_at_us);
        self.metrics.shim_call_took(&self.host, took);
        let now = self.host.now_ms();
        let outcome = read_batch_answer(answer.status, answer.body, call.members.len());
        let outcome = self.note_shim_answer(answer.shim_version, outcome);
        let answers = answers_per_request(outcome, call.members.len());
        if answers.adjustments_lost {
            self.metrics.adjustments_lost(&self.host, call.adjustments);
        }
        self.finish_all(&call.members, answers.each, now);
        self.after_acquisitions(&call.members, now);
        self.dispatch_waiting();
    }

    /// The plugin is going away (reconfigured or removed), and with it its calls: every
    /// request waiting or in flight fails as shutting down, its rule's failure mode
    /// deciding, then every lease waiter runs once more, no longer allowed to wait, and
    /// what it would ask the shim fails the same way. An answer arriving later finds its
    /// call gone.
    pub fn fail_all(&self) {
        self.close();
        let now = self.host.now_ms();
        let left = self.state.borrow_mut().take_all_requests();
        let failures = vec![Err(ShimFailure::ShuttingDown); left.len()];
        self.finish_all(&left, failures, now);
        for request in &left {
            self.local(false).release(&request.claims);
        }
        self.wake_lease_waiters(Waking::All, now);
        // No call will carry what waits to go back.
        let unsent = self.state.borrow_mut().discard_adjustments();
        self.metrics.adjustments_lost(&self.host, unsent);
    }

    /// Applies each request's answer in the request's own context, then resumes or
    /// answers it; back in the worker's context when done.
    fn finish_all(&self, requests: &[Queued<H>], answers: Vec<RequestAnswer>, now: u64) {
        let contexts = Entered::new(&self.host);
        for (request, answer) in requests.iter().zip(answers) {
            self.finish(&contexts, request, now, answer);
        }
    }

    fn finish(&self, contexts: &Entered<'_, H>, queued: &Queued<H>, now: u64, answer: RequestAnswer) {
        let entered = queued
            .request
            .upgrade()
            .filter(|request| contexts.enter(request.id));
        let Some(request) = entered else {
            // The client went away while it waited: what the answer granted goes back
            // at once, queued for the next call.
            let released = queued.released_when_gone(&answer);
            if !released.is_empty() {
                self.record(released);
            }
            return;
        };
        let flow = request.answered(self, now, answer);
        if let Flow::Continue = flow {
            self.resume();
        }
    }

    /// Resumes the current request.
    fn resume(&self) {
        if let Err(error) = self.host.resume() {
            self.host
                .log(LogLevel::Error, &format!("could not resume request: {error}"));
        }
    }
}

/// Requests entered one after the other, and the worker's own context again when
/// dropped: one switch back for a whole batch (each is a host call).
struct Entered<'a, H: Host> {
    host: &'a H,
    switched: Cell<bool>,
}

impl<'a, H: Host> Entered<'a, H> {
    fn new(host: &'a H) -> Self {
        Entered {
            host,
            switched: Cell::new(false),
        }
    }

    fn enter(&self, request: H::RequestId) -> bool {
        let entered = self.host.enter(request);
        if entered {
            self.switched.set(true);
        }
        entered
    }
}

impl<H: Host> Drop for Entered<'_, H> {
    fn drop(&mut self) {
        if self.switched.get() {
            self.host.leave();
        }
    }
}

#[cfg(test)]
mod tests;
