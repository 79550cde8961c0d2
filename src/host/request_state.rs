//! A request's decision while it waits (for the shim, or for this worker's lease
//! acquisition), shared between its HTTP context and the dispatcher. Applying an
//! outcome means recording the step's events, then sending a local reply or keeping the
//! headers for the response; where a request waits is the dispatcher's business.

use super::hostcalls::{log, send_http_response};
use super::Worker;
use crate::judged::Headers;
use crate::plan::PlannedCheck;
use crate::request::{RequestDecision, Start, Transition};
use crate::response::Outcome;
use crate::settlement::ResponseCosts;
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
    /// The charges the response settles, with what it reports so far.
    pub response_costs: ResponseCosts,
}

/// A request in flight through the host: its context and its shared state.
pub struct PendingRequest {
    pub context_id: u32,
    pub state: Rc<RefCell<RequestState>>,
}

impl PendingRequest {
    /// Starts deciding a request with a non-empty plan. The caller runs in its context.
    pub fn start(&self, worker: &Worker, planned: Vec<PlannedCheck>, now: u64) -> Transition<Start> {
        let (decision, transition) = RequestDecision::start(&worker.local(true), planned, now);
        let mut state = self.state.borrow_mut();
        state.decision = decision;
        state.deadline_ms = now.saturating_add(worker.config.shim.timeout_ms());
        transition
    }

    /// Runs the local layer again after a lease acquisition ended; past its deadline the
    /// request no longer waits for one. The caller runs in the request's context.
    pub fn run_local(&self, worker: &Worker, now: u64) -> Transition<Start> {
        let may_await = now < self.deadline_ms();
        self.state
            .borrow_mut()
            .decision
            .run_local(&worker.local(may_await), now)
    }

    pub fn deadline_ms(&self) -> u64 {
        self.state.borrow().deadline_ms
    }

    /// Records the step and applies its outcome.
    pub fn apply(&self, worker: &Worker, transition: Transition<Outcome>) -> Action {
        self.state.borrow_mut().apply(worker, transition)
    }

    /// The request's stream ended, however: what it holds goes back, and its response's
    /// costs are settled, with the worker's next call, sent now if none is due.
    pub fn end_stream(&self, worker: &Worker) {
        let events = self.state.borrow_mut().decision.end_stream(&worker.local(false));
        if !events.is_empty() {
            worker.record(events);
            worker.dispatcher.flush_adjustments();
        }
        // Settled on the stream's end, not the client's: a client gone mid-response is
        // charged what the response reported so far (or its rule's unreported_cost).
        let costs = std::mem::take(&mut self.state.borrow_mut().response_costs);
        if !costs.is_empty() {
            let (settlements, counts) = costs.finish(&worker.body_budget);
            worker.count(counts);
            worker.dispatcher.settle(settlements);
        }
    }
}

impl RequestState {
    /// Applies the shim's answer, or its failure: records the step and applies the
    /// outcome. The caller runs in this request's context.
    pub fn answered(&mut self, worker: &Worker, now: u64, answer: RequestAnswer) -> Action {
        let local = worker.local(false);
        let transition = match answer {
            Ok(answered) => {
                self.decision
                    .on_answer_in_part(&local, &answered.results, &answered.unsupported, now)
            }
            Err(failure) => self.decision.on_failure(&local, failure, now),
        };
        if self.decision.stream_ended() {
            // Nobody to answer: the step's events give back what the answer granted.
            worker.record(transition.events);
            worker.dispatcher.flush_adjustments();
            return Action::Pause;
        }
        self.apply(worker, transition)
    }

    fn apply(&mut self, worker: &Worker, transition: Transition<Outcome>) -> Action {
        worker.record(transition.events);
        match transition.next {
            Outcome::Allow { headers } => {
                self.response_headers = headers;
                self.response_costs = ResponseCosts::new(self.decision.take_settlements());
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
