//! The worker's shim calls: requests queued for the shim are sent as batched
//! `dispatch_http_call`s (the bookkeeping is [`Batcher`]'s), and each answer, or the
//! call's failure, is applied to every request it carried.
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
use crate::batch::{Batch, Batcher, Call};
use crate::local::{Claim, HeldLease};
use crate::request::{Start, Transition};
use crate::shim_call::{batch_body, read_batch_answer, RequestAnswer, ShimFailure};
use crate::stream_end::{granted_to_gone, Held, SlotAsked};
use crate::wire::{Check, Settlement, TokenReturn, CHECK_BATCH_PATH, MAX_BATCH, TOKEN_HEADER};
use proxy_wasm::types::{Action, LogLevel, MapType, Status};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

/// A request waiting for the shim: where to apply the answer, and what to ask.
pub struct QueuedRequest {
    pub context_id: u32,
    /// Dead once the request's stream is gone; the answer is then dropped.
    pub state: Weak<RefCell<RequestState>>,
    pub checks: Vec<Check>,
    /// The lease acquisitions it makes: when it ends, the requests waiting for them run
    /// again.
    pub claims: Vec<Claim>,
    /// The checks that can grant it a concurrency slot: released at once when the answer
    /// finds the stream gone.
    pub slots: Vec<SlotAsked>,
    /// When it joined the queue, in µs: the queued_us histogram.
    pub queued_at_us: u64,
}

/// A request waiting for this worker's acquisition of a counter's lease.
pub struct LeaseWaiter {
    pub fingerprint: u64,
    pub context_id: u32,
    pub state: Weak<RefCell<RequestState>>,
    pub deadline_ms: u64,
}

pub struct Dispatcher {
    /// The root context, which makes every shim call.
    root_id: u32,
    /// The shared queue through which a request wakes the root to send the batch.
    wake_queue: u32,
    batcher: RefCell<Batcher<QueuedRequest>>,
    lease_waiters: RefCell<Vec<LeaseWaiter>>,
    /// Leases this worker acquired for the Envoy, by counter, until they expire.
    held_leases: RefCell<HashMap<u64, HeldLease>>,
    /// Tokens to give back with the next call: unspent leased tokens, released
    /// concurrency slots.
    returns: RefCell<Vec<TokenReturn>>,
    /// Earlier requests' real costs, to settle with the next call.
    settlements: RefCell<Vec<Settlement>>,
    call_refused_logged: Cell<bool>,
}

impl Dispatcher {
    pub fn new(root_id: u32, wake_queue: u32, calls_in_flight: usize, timeout_ms: u64) -> Dispatcher {
        Dispatcher {
            root_id,
            wake_queue,
            batcher: RefCell::new(Batcher::new(calls_in_flight, timeout_ms)),
            lease_waiters: RefCell::new(Vec::new()),
            held_leases: RefCell::new(HashMap::new()),
            returns: RefCell::new(Vec::new()),
            settlements: RefCell::new(Vec::new()),
            call_refused_logged: Cell::new(false),
        }
    }

    /// Remembers a lease this worker acquired, to give back what it leaves.
    pub fn hold_lease(&self, lease: HeldLease) {
        self.held_leases.borrow_mut().insert(lease.fingerprint, lease);
    }

    /// Queues unspent tokens for the next call.
    pub fn give_back(&self, back: TokenReturn) {
        self.returns.borrow_mut().push(back);
    }

    /// Queues requests' real costs to settle, sent soon (see `flush_adjustments`).
    pub fn settle(&self, settlements: Vec<Settlement>) {
        if settlements.is_empty() {
            return;
        }
        self.settlements.borrow_mut().extend(settlements);
        self.flush_adjustments();
    }

    /// Whether tokens or settlements wait to go back to the shim.
    fn has_adjustments(&self) -> bool {
        !self.returns.borrow().is_empty() || !self.settlements.borrow().is_empty()
    }

    /// Sends the waiting returns and settlements in a call of their own (a batch's worth)
    /// when no request waits to carry them and a call may start; true if it did.
    fn send_adjustments_when_idle(&self, worker: &Worker, now: u64) -> bool {
        let idle = !self.batcher.borrow().has_waiting() && self.batcher.borrow().may_call();
        if !idle || !self.has_adjustments() {
            return false;
        }
        let adjustments_only = Batch {
            members: Vec::new(),
            timeout_ms: worker.config.shim.timeout_ms(),
        };
        self.send(worker, adjustments_only, now);
        true
    }

    /// Wakes the root through the shared queue, to send what waits.
    fn wake_root(&self) {
        if let Err(error) = enqueue_shared_queue(self.wake_queue, b"1") {
            // The root's tick sends it (or fails it past its deadline) instead.
            self.batcher.borrow_mut().woken();
            log(
                LogLevel::Warn,
                &format!("cannot wake the worker's dispatcher: {error}"),
            );
        }
    }

    /// Makes the queued returns and settlements leave now rather than with the next
    /// request's call: wakes the root, which sends them (alone, if no request waits) as
    /// soon as a call may start. With every call in flight, the first to end sends them.
    /// Any context may call this; the call itself is the root's.
    pub fn flush_adjustments(&self) {
        if !self.has_adjustments() {
            return;
        }
        let wake = self.batcher.borrow_mut().wake_for_adjustments();
        if wake {
            self.wake_root();
        }
    }

    /// Takes what expired leases left, queued to go back (see `on_tick`).
    fn return_expired_leases(&self, worker: &Worker, now: u64) {
        let expired: Vec<HeldLease> = {
            let mut held = self.held_leases.borrow_mut();
            let expired: Vec<u64> = held
                .values()
                .filter(|lease| lease.expires_ms <= now)
                .map(|lease| lease.fingerprint)
                .collect();
            expired.iter().filter_map(|f| held.remove(f)).collect()
        };
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
                    context_id: request.context_id,
                    state: Rc::downgrade(&request.state),
                    checks,
                    claims,
                    slots,
                    queued_at_us: now_us(),
                };
                self.submit(queued, deadline_ms);
                Action::Pause
            }
            Start::AwaitLease(fingerprint) => {
                worker.record(events);
                self.lease_waiters.borrow_mut().push(LeaseWaiter {
                    fingerprint,
                    context_id: request.context_id,
                    state: Rc::downgrade(&request.state),
                    deadline_ms,
                });
                Action::Pause
            }
        }
    }

    /// Runs again the requests waiting for these acquisitions (all of them when
    /// `fingerprints` is `None`): they spend the lease, acquire the next, or are checked
    /// exactly past their deadline.
    fn wake_lease_waiters(&self, worker: &Worker, fingerprints: Option<&[u64]>, now: u64) {
        let woken: Vec<LeaseWaiter> = {
            let mut waiters = self.lease_waiters.borrow_mut();
            let (woken, waiting) = std::mem::take(&mut *waiters)
                .into_iter()
                .partition(|waiter| fingerprints.is_none_or(|f| f.contains(&waiter.fingerprint)));
            *waiters = waiting;
            woken
        };
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
    fn after_acquisitions(&self, worker: &Worker, finished: &[QueuedRequest], now: u64) {
        let fingerprints: Vec<u64> = finished
            .iter()
            .flat_map(|request| request.claims.iter().map(|claim| claim.fingerprint))
            .collect();
        if !fingerprints.is_empty() {
            self.wake_lease_waiters(worker, Some(&fingerprints), now);
        }
    }

    /// Queues a request for the shim and, when a call may start, wakes the root.
    fn submit(&self, request: QueuedRequest, deadline_ms: u64) {
        let wake = self.batcher.borrow_mut().push(request, deadline_ms);
        if wake {
            self.wake_root();
        }
    }

    /// The root was woken through the queue.
    pub fn on_wake(&self, worker: &Worker) {
        hostcalls::drain_shared_queue(self.wake_queue);
        self.batcher.borrow_mut().woken();
        self.dispatch_waiting(worker);
    }

    /// The safety net: requests that wait without a wake-up (none should) are sent or
    /// failed within about one timeout, and returns and settlements left behind go.
    pub fn on_tick(&self, worker: &Worker) {
        let now = now_ms();
        self.return_expired_leases(worker, now);
        if self.has_adjustments() {
            self.batcher.borrow_mut().woken();
            self.dispatch_waiting(worker);
        }
        let overdue: Vec<u64> = self
            .lease_waiters
            .borrow()
            .iter()
            .filter(|waiter| waiter.deadline_ms <= now)
            .map(|waiter| waiter.fingerprint)
            .collect();
        if !overdue.is_empty() {
            self.wake_lease_waiters(worker, Some(&overdue), now);
        }
        if self.batcher.borrow().has_waiting() {
            // Were a wake-up lost, the pending flag would hold back every later one.
            self.batcher.borrow_mut().woken();
            self.dispatch_waiting(worker);
        }
    }

    /// Sends what waits, call by call, while calls may start. Runs in a root callback,
    /// so the calls belong to the root context.
    fn dispatch_waiting(&self, worker: &Worker) {
        loop {
            let now = now_ms();
            let next = self
                .batcher
                .borrow_mut()
                .next(now, |request| request.state.strong_count() > 0);
            let expired = !next.expired.is_empty();
            {
                let contexts = RequestContexts::new(self.root_id);
                for request in &next.expired {
                    self.finish(&contexts, worker, request, now, Err(ShimFailure::Timeout));
                }
            }
            // A request that went away ends its acquisitions unanswered.
            for request in &next.dropped {
                worker.local(false).release(&request.claims);
            }
            self.after_acquisitions(worker, &next.expired, now);
            self.after_acquisitions(worker, &next.dropped, now);
            let Some(batch) = next.batch else {
                if expired || !next.dropped.is_empty() {
                    continue;
                }
                // No request to carry the returns and settlements: they go alone, so a
                // released slot is free again within a round trip.
                if self.send_adjustments_when_idle(worker, now) {
                    continue;
                }
                return;
            };
            self.send(worker, batch, now);
        }
    }

    fn send(&self, worker: &Worker, batch: Batch<QueuedRequest>, now: u64) {
        let Batch {
            members: mut requests,
            timeout_ms,
        } = batch;
        let shim = &worker.config.shim;
        let returns = take_up_to_a_batch(&self.returns);
        let settlements = take_up_to_a_batch(&self.settlements);
        let adjustments = returns.len() + settlements.len();
        let body = batch_body(
            requests
                .iter_mut()
                .map(|request| std::mem::take(&mut request.checks))
                .collect(),
            returns,
            settlements,
        );
        let sent = body.and_then(|body| {
            let mut headers = vec![
                (":method", "POST"),
                (":path", CHECK_BATCH_PATH),
                (":authority", shim.authority.as_str()),
                ("content-type", "application/json"),
            ];
            if let Some(token) = &shim.token {
                headers.push((TOKEN_HEADER, token.as_str()));
            }
            dispatch_http_call(&shim.cluster, headers, &body, Duration::from_millis(timeout_ms))
                .map_err(|error| self.call_refused(&shim.cluster, error))
        });
        match sent {
            Ok(token) => {
                let sent_at_us = now_us();
                worker.stats.shim_call_carried(requests.len());
                for request in &requests {
                    worker
                        .stats
                        .waited_in_queue(sent_at_us.saturating_sub(request.queued_at_us));
                }
                self.batcher.borrow_mut().sent(
                    token,
                    Call {
                        members: requests,
                        sent_at_us,
                        adjustments,
                    },
                );
            }
            Err(failure) => {
                worker.stats.adjustments_lost(adjustments);
                {
                    let contexts = RequestContexts::new(self.root_id);
                    for request in &requests {
                        self.finish(&contexts, worker, request, now, Err(failure.clone()));
                    }
                }
                self.after_acquisitions(worker, &requests, now);
            }
        }
    }

    /// Envoy refused to start a call. Refusing every call is a configuration mistake (a
    /// `shim_cluster` this Envoy does not define): said once, loudly, at error level; each
    /// failed request is still counted in `shim_errors`.
    fn call_refused(&self, cluster: &str, error: HostError) -> ShimFailure {
        let reason = match error.0 {
            Status::BadArgument => format!("no cluster named {cluster:?} in this Envoy (shim_cluster)"),
            _ => format!("cannot call cluster {cluster:?}: {error}"),
        };
        if !self.call_refused_logged.replace(true) {
            log(LogLevel::Error, &format!("calls to the shim fail: {reason}"));
        }
        ShimFailure::Unreachable(reason)
    }

    /// The answer to the call with this token (or its failure) arrived.
    pub fn on_call_response(&self, worker: &Worker, token: u32, body_size: usize) {
        let Some(call) = self.batcher.borrow_mut().answered(token) else {
            return;
        };
        worker
            .stats
            .shim_call_took(now_us().saturating_sub(call.sent_at_us));
        let now = now_ms();
        // Read before switching to the requests' contexts: the answer is the root's.
        let status = hostcalls::header(MapType::HttpCallResponseHeaders, ":status");
        let body = http_call_response_body(body_size);
        {
            let contexts = RequestContexts::new(self.root_id);
            match read_batch_answer(status.as_deref(), &body, call.members.len()) {
                Ok(answers) => {
                    for (request, answer) in call.members.iter().zip(answers) {
                        self.finish(&contexts, worker, request, now, answer);
                    }
                }
                Err(failure) => {
                    worker.stats.adjustments_lost(call.adjustments);
                    for request in &call.members {
                        self.finish(&contexts, worker, request, now, Err(failure.clone()));
                    }
                }
            }
        }
        self.after_acquisitions(worker, &call.members, now);
        self.dispatch_waiting(worker);
    }

    /// The plugin is going away (reconfigured or removed), and with the root its calls:
    /// no request may stay paused behind them.
    pub fn fail_all(&self, worker: &Worker) {
        let now = now_ms();
        // Waiting for nothing now: they run once more without waiting, and what they
        // would ask the shim fails with the rest.
        self.lease_waiters
            .borrow_mut()
            .iter_mut()
            .for_each(|waiter| waiter.deadline_ms = 0);
        self.wake_lease_waiters(worker, None, now);
        let left = self.batcher.borrow_mut().take_all();
        let contexts = RequestContexts::new(self.root_id);
        for request in &left {
            self.finish(&contexts, worker, request, now, Err(ShimFailure::ShuttingDown));
        }
        // No call will carry what waits to go back.
        let unsent = self.returns.take().len() + self.settlements.take().len();
        worker.stats.adjustments_lost(unsent);
    }

    /// Applies the shim's answer for one request, or the failure of its call, in the
    /// request's own context, then resumes or answers it.
    fn finish(
        &self,
        contexts: &RequestContexts,
        worker: &Worker,
        request: &QueuedRequest,
        now: u64,
        answer: RequestAnswer,
    ) {
        let Some(state) = request.state.upgrade() else {
            self.release_for_gone_stream(worker, request, &answer);
            return;
        };
        if contexts.enter(request.context_id).is_err() {
            self.release_for_gone_stream(worker, request, &answer);
            return;
        }
        let action = state.borrow_mut().answered(worker, now, answer);
        if let Action::Continue = action {
            resume_http_request();
        }
    }

    /// The answer found the request's stream gone (the client went away while it
    /// waited): what it granted goes back at once, queued for the next call.
    fn release_for_gone_stream(&self, worker: &Worker, request: &QueuedRequest, answer: &RequestAnswer) {
        let Ok(results) = answer else {
            return;
        };
        let released = granted_to_gone(&request.slots, results);
        if !released.is_empty() {
            worker.record(released.into_iter().flat_map(Held::into_events).collect());
        }
    }
}

/// The first [`MAX_BATCH`] of `queue`, which one call carries.
fn take_up_to_a_batch<T>(queue: &RefCell<Vec<T>>) -> Vec<T> {
    let mut queue = queue.borrow_mut();
    let count = queue.len().min(MAX_BATCH);
    queue.drain(..count).collect()
}

/// Resumes the request of the current context.
fn resume_http_request() {
    if let Err(error) = hostcalls::resume_http_request() {
        log(LogLevel::Error, &format!("could not resume request: {error}"));
    }
}
