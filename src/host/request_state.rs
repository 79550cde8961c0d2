//! A request's decision while it waits (for the shim, or for this worker's lease
//! acquisition), shared between its HTTP context and the dispatcher. Carrying out a step
//! means recording its events, then applying its [`Outcome`] (a local reply, or headers
//! kept for the response) or queueing the request where the step says.

use super::dispatcher::{LeaseWaiter, QueuedRequest};
use super::hostcalls::{log, send_http_response};
use super::Worker;
use crate::plan::PlannedCheck;
use crate::request::{RequestDecision, Start, Transition};
use crate::response::{Headers, Outcome};
use crate::shim_call::RequestAnswer;
use proxy_wasm::types::{Action, LogLevel};
use std::cell::RefCell;
use std::rc::Rc;

/// A request's decision in progress, and what it leaves for the response.
#[derive(Default)]
pub struct RequestState {
    decision: RequestDecision,
    /// When the request stops waiting: `timeout` after it arrived.
    deadline_ms: u64,
    /// Rate-limit headers to add to the allowed response.
    pub response_headers: Headers,
}

/// A request in flight through the host: its context and its shared state.
pub struct PendingRequest {
    pub context_id: u32,
    pub state: Rc<RefCell<RequestState>>,
}

impl PendingRequest {
    /// Starts deciding a request with a non-empty plan. The caller runs in its context.
    pub fn start(&self, worker: &Worker, planned: Vec<PlannedCheck>, now: u64) -> Action {
        let (decision, transition) = RequestDecision::start(&worker.local(true), planned, now);
        {
            let mut state = self.state.borrow_mut();
            state.decision = decision;
            state.deadline_ms = now.saturating_add(worker.config.shim.timeout_ms());
        }
        self.proceed(worker, transition)
    }

    /// Runs the local layer again after a lease acquisition ended; past its deadline the
    /// request no longer waits for one. The caller runs in the request's context.
    pub fn run_local(&self, worker: &Worker, now: u64) -> Action {
        let may_await = now < self.state.borrow().deadline_ms;
        let transition = self
            .state
            .borrow_mut()
            .decision
            .run_local(&worker.local(may_await), now);
        self.proceed(worker, transition)
    }

    /// Carries out where the local layer left the request.
    fn proceed(&self, worker: &Worker, transition: Transition<Start>) -> Action {
        let Transition { next, events } = transition;
        let deadline_ms = self.state.borrow().deadline_ms;
        match next {
            Start::Decided(outcome) => self.state.borrow_mut().apply(
                worker,
                Transition {
                    next: outcome,
                    events,
                },
            ),
            Start::AskShim { checks, claims } => {
                worker.record(events);
                let queued = QueuedRequest {
                    context_id: self.context_id,
                    state: Rc::downgrade(&self.state),
                    checks,
                    claims,
                };
                worker.dispatcher.submit(queued, deadline_ms);
                Action::Pause
            }
            Start::AwaitLease(fingerprint) => {
                worker.record(events);
                worker.dispatcher.await_lease(LeaseWaiter {
                    fingerprint,
                    context_id: self.context_id,
                    state: Rc::downgrade(&self.state),
                    deadline_ms,
                });
                Action::Pause
            }
        }
    }
}

impl RequestState {
    /// Applies the shim's answer, or its failure: records the step and applies the
    /// outcome. The caller runs in this request's context.
    pub fn answered(&mut self, worker: &Worker, now: u64, answer: RequestAnswer) -> Action {
        let local = worker.local(false);
        let transition = match answer {
            Ok(results) => self.decision.on_answer(&local, &results, now),
            Err(failure) => self.decision.on_failure(&local, failure, now),
        };
        self.apply(worker, transition)
    }

    fn apply(&mut self, worker: &Worker, transition: Transition<Outcome>) -> Action {
        worker.record(transition.events);
        match transition.next {
            Outcome::Allow { headers } => {
                self.response_headers = headers;
                Action::Continue
            }
            Outcome::Reply(reply) => {
                let headers: Vec<(&str, &str)> = reply
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                if let Err(error) = send_http_response(reply.status, headers, reply.body.as_bytes()) {
                    log(LogLevel::Error, &format!("could not send local reply: {error}"));
                }
                Action::Pause
            }
        }
    }
}
