//! The worker's shim calls, as the host carries them out: what to send and when, who
//! waits and who runs again is decided by the pure [`DispatchState`]; this makes the
//! `dispatch_http_call`s, wakes the root, enters the requests' contexts to apply each
//! answer (or the call's failure), and resumes them.
//!
//! The root context makes the calls. Envoy attaches every call to the root context
//! whoever makes it, but the SDK delivers the answer to the context whose callback made
//! the call, and drops it once that context is gone: only a root callback can start a
//! call whose answer outlives any one request. A request wakes the root through a shared
//! queue when a call may start. (Sending a lone request's call from its own callback
//! instead was measured and did not shorten its wait: `bench/RESULTS.md`.)

use super::hostcalls::{
    self, dispatch_http_call, enqueue_shared_queue, http_call_response_body, log, now_ms, now_us, HostError,
    RequestContexts,
};
use super::request_state::{PendingRequest, RequestState};
use super::Worker;
use crate::batch::{Batch, Call};
use crate::dispatch::call::{answers_per_request, call_headers};
use crate::dispatch::leases::Waking;
use crate::dispatch::queued::{ended_acquisitions, QueuedRequest};
use crate::dispatch::{DispatchState, Round};
use crate::local::HeldLease;
use crate::request::{Start, Transition};
use crate::shim_call::{read_batch_answer, RequestAnswer, ShimFailure};
use crate::wire::{Settlement, TokenReturn, VERSION_HEADER};
use proxy_wasm::types::{Action, LogLevel, MapType, Status};
use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::Duration;

/// How the dispatcher finds a paused request again.
pub struct RequestHandle {
    context_id: u32,
    /// Dead once the request's stream is gone; its answer is then dropped.
    state: Weak<RefCell<RequestState>>,
}

impl RequestHandle {
    fn of(request: &PendingRequest) -> RequestHandle {
        RequestHandle {
            context_id: request.context_id,
            state: Rc::downgrade(&request.state),
        }
    }
}

type Queued = QueuedRequest<RequestHandle>;

pub struct Dispatcher {
    /// The root context, which makes every shim call.
    root_id: u32,
    /// The shared queue through which a request wakes the root to send the batch.
    wake_queue: u32,
    /// Borrowed only between host calls, never across one that applies an answer:
    /// applying re-enters the dispatcher (tokens given back, a woken waiter queued).
    state: RefCell<DispatchState<RequestHandle>>,
}

impl Dispatcher {
    pub fn new(root_id: u32, wake_queue: u32, calls_in_flight: usize, timeout_ms: u64) -> Dispatcher {
        Dispatcher {
            root_id,
            wake_queue,
            state: RefCell::new(DispatchState::new(calls_in_flight, timeout_ms)),
        }
    }

    /// Remembers a lease this worker acquired, to give back what it leaves.
    pub fn hold_lease(&self, lease: HeldLease) {
        self.state.borrow_mut().hold_lease(lease);
    }

    /// Queues unspent tokens for the next call.
    pub fn give_back(&self, back: TokenReturn) {
        self.state.borrow_mut().give_back(back);
    }

    /// Queues requests' real costs to settle, sent soon (see `flush_adjustments`).
    pub fn settle(&self, settlements: Vec<Settlement>) {
        let wake = self.state.borrow_mut().settle(settlements);
        if wake {
            self.wake_root();
        }
    }

    /// Makes the queued returns and settlements leave now rather than with the next
    /// request's call. Any context may call this; the call itself is the root's.
    pub fn flush_adjustments(&self) {
        let wake = self.state.borrow_mut().flush_adjustments();
        if wake {
            self.wake_root();
        }
    }

    /// Wakes the root through the shared queue, to send what waits.
    fn wake_root(&self) {
        if let Err(error) = enqueue_shared_queue(self.wake_queue, b"1") {
            // The root's tick sends it (or fails it past its deadline) instead.
            self.state.borrow_mut().woken();
            log(
                LogLevel::Warn,
                &format!("cannot wake the worker's dispatcher: {error}"),
            );
        }
    }

    /// Queues what expired leases left, to go back (see `on_tick`).
    fn return_expired_leases(&self, worker: &Worker, now: u64) {
        let expired = self.state.borrow_mut().take_expired_leases(now);
        let local = worker.local(false);
        for lease in &expired {
            if let Some(back) = local.take_leftover(lease, now) {
                self.give_back(back);
            }
        }
    }

    /// Carries out where the local layer left a request: decided (applied now), or
    /// queued for the shim or for this worker's lease acquisition. The caller runs in
    /// the request's context.
    pub fn proceed(
        &self,
        worker: &Worker,
        request: &PendingRequest,
        transition: Transition<Start>,
    ) -> Action {
        let Transition { next, events } = transition;
        let deadline_ms = request.deadline_ms();
        match next {
            Start::Decided(outcome) => request.apply(
                worker,
                Transition {
                    next: outcome,
                    events,
                },
            ),
            Start::AskShim {
                checks,
                claims,
                slots,
            } => {
                worker.record(events);
                let queued = QueuedRequest {
                    request: RequestHandle::of(request),
                    checks,
                    claims,
                    slots,
                    queued_at_us: now_us(),
                };
                let wake = self.state.borrow_mut().submit(queued, deadline_ms);
                if wake {
                    self.wake_root();
                }
                Action::Pause
            }
            Start::AwaitLease(fingerprint) => {
                worker.record(events);
                self.state
                    .borrow_mut()
                    .await_lease(fingerprint, deadline_ms, RequestHandle::of(request));
                Action::Pause
            }
        }
    }

    /// Runs again the requests waiting for these acquisitions: they spend the lease,
    /// acquire the next, or are checked exactly past their deadline.
    fn wake_lease_waiters(&self, worker: &Worker, which: Waking<'_>, now: u64) {
        let woken = self.state.borrow_mut().wake_lease_waiters(which);
        let contexts = RequestContexts::new(self.root_id);
        for waiter in woken {
            let Some(state) = waiter.state.upgrade() else {
                continue;
            };
            if contexts.enter(waiter.context_id).is_err() {
                continue;
            }
            let request = PendingRequest {
                context_id: waiter.context_id,
                state,
            };
            let transition = request.run_local(worker, now);
            if let Action::Continue = self.proceed(worker, &request, transition) {
                resume_http_request();
            }
        }
    }

    /// The requests whose acquisitions ended with `finished`, run again.
    fn after_acquisitions(&self, worker: &Worker, finished: &[Queued], now: u64) {
        let ended = ended_acquisitions(finished);
        if !ended.is_empty() {
            self.wake_lease_waiters(worker, Waking::Counters(&ended), now);
        }
    }

    /// The root was woken through the queue.
    pub fn on_wake(&self, worker: &Worker) {
        hostcalls::drain_shared_queue(self.wake_queue);
        self.state.borrow_mut().woken();
        self.dispatch_waiting(worker);
    }

    /// The safety net: requests that wait without a wake-up (none should) are sent or
    /// failed within about one timeout, and returns and settlements left behind go.
    pub fn on_tick(&self, worker: &Worker) {
        let now = now_ms();
        self.return_expired_leases(worker, now);
        let send_adjustments = self.state.borrow_mut().tick_sends_adjustments();
        if send_adjustments {
            self.dispatch_waiting(worker);
        }
        let overdue = self.state.borrow().overdue_lease_counters(now);
        if !overdue.is_empty() {
            self.wake_lease_waiters(worker, Waking::Counters(&overdue), now);
        }
        let send_requests = self.state.borrow_mut().tick_sends_requests();
        if send_requests {
            self.dispatch_waiting(worker);
        }
    }

    /// Sends what waits, round by round, while calls may start. Runs in a root
    /// callback, so the calls belong to the root context.
    fn dispatch_waiting(&self, worker: &Worker) {
        loop {
            let now = now_ms();
            let round = self
                .state
                .borrow_mut()
                .next_round(now, |request| request.state.strong_count() > 0);
            let last = round.is_last();
            let Round {
                timed_out,
                gone,
                call,
            } = round;
            self.finish_all(
                worker,
                &timed_out,
                vec![Err(ShimFailure::Timeout); timed_out.len()],
                now,
            );
            // A request that went away ends its acquisitions unanswered.
            for request in &gone {
                worker.local(false).release(&request.claims);
            }
            self.after_acquisitions(worker, &timed_out, now);
            self.after_acquisitions(worker, &gone, now);
            if let Some(batch) = call {
                self.send(worker, batch, now);
            }
            if last {
                return;
            }
        }
    }

    fn send(&self, worker: &Worker, batch: Batch<Queued>, now: u64) {
        let call = self.state.borrow_mut().prepare_call(batch);
        let shim = &worker.config.shim;
        let sent = call.body.and_then(|body| {
            dispatch_http_call(
                &shim.cluster,
                call_headers(shim),
                &body,
                Duration::from_millis(call.timeout_ms),
            )
            .map_err(|error| self.call_refused(&shim.cluster, error))
        });
        let requests = call.requests;
        match sent {
            Ok(token) => {
                let sent_at_us = now_us();
                worker.stats.shim_call_carried(requests.len());
                for request in &requests {
                    worker
                        .stats
                        .waited_in_queue(sent_at_us.saturating_sub(request.queued_at_us));
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
                worker.stats.adjustments_lost(call.adjustments);
                let answers = answers_per_request(Err(failure), requests.len());
                self.finish_all(worker, &requests, answers.each, now);
                self.after_acquisitions(worker, &requests, now);
            }
        }
    }

    /// Envoy refused to start a call: the failure its requests get, logged once.
    fn call_refused(&self, cluster: &str, error: HostError) -> ShimFailure {
        let unknown_cluster = matches!(error.0, Status::BadArgument);
        let refused = self
            .state
            .borrow_mut()
            .call_refused(cluster, unknown_cluster, &error);
        if let Some(line) = refused.log_line {
            log(LogLevel::Error, &line);
        }
        refused.failure
    }

    /// The answer to the call with this token (or its failure) arrived.
    pub fn on_call_response(&self, worker: &Worker, token: u32, body_size: usize) {
        let Some(call) = self.state.borrow_mut().answered(token) else {
            return;
        };
        worker
            .stats
            .shim_call_took(now_us().saturating_sub(call.sent_at_us));
        let now = now_ms();
        // Read before switching to the requests' contexts: the answer is the root's.
        let status = hostcalls::header(MapType::HttpCallResponseHeaders, ":status");
        let shim_version = hostcalls::header(MapType::HttpCallResponseHeaders, VERSION_HEADER);
        let body = http_call_response_body(body_size);
        let outcome = read_batch_answer(status.as_deref(), &body, call.members.len());
        let outcome = worker.note_shim_answer(shim_version.as_deref(), outcome);
        let answers = answers_per_request(outcome, call.members.len());
        if answers.adjustments_lost {
            worker.stats.adjustments_lost(call.adjustments);
        }
        self.finish_all(worker, &call.members, answers.each, now);
        self.after_acquisitions(worker, &call.members, now);
        self.dispatch_waiting(worker);
    }

    /// The plugin is going away (reconfigured or removed), and with the root its calls:
    /// no request may stay paused behind them.
    pub fn fail_all(&self, worker: &Worker) {
        let now = now_ms();
        // The waiters run once more; what they would ask the shim fails with the rest.
        self.wake_lease_waiters(worker, Waking::All, now);
        let left = self.state.borrow_mut().take_all_requests();
        let failures = vec![Err(ShimFailure::ShuttingDown); left.len()];
        self.finish_all(worker, &left, failures, now);
        // No call will carry what waits to go back.
        let unsent = self.state.borrow_mut().discard_adjustments();
        worker.stats.adjustments_lost(unsent);
    }

    /// Applies each request's answer in the request's own context, then resumes or
    /// answers it; back in the root's context when done.
    fn finish_all(&self, worker: &Worker, requests: &[Queued], answers: Vec<RequestAnswer>, now: u64) {
        let contexts = RequestContexts::new(self.root_id);
        for (request, answer) in requests.iter().zip(answers) {
            self.finish(&contexts, worker, request, now, answer);
        }
    }

    fn finish(
        &self,
        contexts: &RequestContexts,
        worker: &Worker,
        request: &Queued,
        now: u64,
        answer: RequestAnswer,
    ) {
        let handle = &request.request;
        let entered = handle
            .state
            .upgrade()
            .filter(|_| contexts.enter(handle.context_id).is_ok());
        let Some(state) = entered else {
            // The client went away while it waited: what the answer granted goes back
            // at once, queued for the next call.
            let released = request.released_when_gone(&answer);
            if !released.is_empty() {
                worker.record(released);
            }
            return;
        };
        let action = state.borrow_mut().answered(worker, now, answer);
        if let Action::Continue = action {
            resume_http_request();
        }
    }
}

/// Resumes the request of the current context.
fn resume_http_request() {
    if let Err(error) = hostcalls::resume_http_request() {
        log(LogLevel::Error, &format!("could not resume request: {error}"));
    }
}
