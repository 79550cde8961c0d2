//! One request's steps through its worker: started, run again after a lease
//! acquisition, answered (or failed), and its stream's end. Applying an outcome means
//! recording the step's events, then answering with a local reply or keeping the
//! headers for the response; where a request waits is `rounds`'s business.

use super::host::{Flow, Host, LogLevel};
use super::paused::{PendingRequest, RequestState};
use super::worker::Worker;
use crate::plan::PlannedCheck;
use crate::request::{RequestDecision, Start, Transition};
use crate::response::Outcome;
use crate::settlement::ResponseCosts;
use crate::shim_call::RequestAnswer;

impl<Id: Copy> PendingRequest<Id> {
    /// Starts deciding a request with a non-empty plan. The caller runs in its context.
    pub fn start<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        planned: Vec<PlannedCheck>,
        now: u64,
    ) -> Transition<Start> {
        let local = worker.local(!worker.closing());
        let (decision, transition) = RequestDecision::start(&local, planned, now);
        let mut state = self.state.borrow_mut();
        state.decision = decision;
        state.deadline_ms = now.saturating_add(worker.config.shim.timeout_ms());
        transition
    }

    /// Runs the local layer again after a lease acquisition ended; past its deadline, or
    /// once the worker is closing, the request no longer waits for one. The caller runs
    /// in the request's context.
    pub(super) fn run_local<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        now: u64,
    ) -> Transition<Start> {
        let may_await = now < self.deadline_ms() && !worker.closing();
        self.state
            .borrow_mut()
            .decision
            .run_local(&worker.local(may_await), now)
    }

    /// Records the step and applies its outcome.
    pub(super) fn apply<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        transition: Transition<Outcome>,
    ) -> Flow {
        self.state.borrow_mut().apply(worker, transition)
    }

    /// The request's stream ended, however: what it holds goes back, and its response's
    /// costs are settled, with the worker's next call, sent now if none is due.
    pub fn end_stream<H: Host<RequestId = Id>>(&self, worker: &Worker<H>) {
        let events = self.state.borrow_mut().decision.end_stream(&worker.local(false));
        if !events.is_empty() {
            worker.record(events);
            worker.flush_adjustments();
        }
        // Settled on the stream's end, not the client's: a client gone mid-response is
        // charged what the response reported so far (or its rule's unreported_cost).
        let costs = std::mem::take(&mut self.state.borrow_mut().response_costs);
        if !costs.is_empty() {
            let (settlements, counts) = costs.finish(&worker.body_budget);
            worker.count(counts);
            worker.settle(settlements);
        }
    }
}

impl RequestState {
    /// Applies the shim's answer, or its failure: records the step and applies the
    /// outcome. The caller runs in this request's context.
    pub(super) fn answered<H: Host>(&mut self, worker: &Worker<H>, now: u64, answer: RequestAnswer) -> Flow {
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
            worker.flush_adjustments();
            return Flow::Pause;
        }
        self.apply(worker, transition)
    }

    fn apply<H: Host>(&mut self, worker: &Worker<H>, transition: Transition<Outcome>) -> Flow {
        worker.record(transition.events);
        match transition.next {
            Outcome::Allow { headers } => {
                self.response_headers = headers;
                self.response_costs = ResponseCosts::new(self.decision.take_settlements());
                Flow::Continue
            }
            Outcome::Reply(reply) => {
                if let Err(error) = worker.host.reply(&reply) {
                    worker
                        .host
                        .log(LogLevel::Error, &format!("could not send local reply: {error}"));
                }
                Flow::Pause
            }
        }
    }
}
