//! One request's steps through its worker: started, run again after a lease
//! acquisition, answered (or failed), and its stream's end. Applying an outcome means
//! recording the step's events, then answering with a local reply, keeping the headers
//! for the response, or spilling the request over (its headers set, then planned and
//! started again); where a request waits is `rounds`'s business.

use super::host::{Flow, Host, LogLevel};
use super::paused::{PendingRequest, RequestState};
use super::worker::Worker;
use crate::plan::PlannedCheck;
use crate::request::{RequestDecision, Start, Transition};
use crate::response::{LocalReply, Outcome};
use crate::settlement::ResponseCosts;
use crate::shim_call::RequestAnswer;
use crate::spill::Spill;

impl<Id: Copy> PendingRequest<Id> {
    /// Starts deciding a request with a non-empty plan. The caller runs in its context.
    pub fn start<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        planned: Vec<PlannedCheck>,
        now: u64,
    ) -> Transition<Start> {
        self.start_spilled(worker, planned, None, now)
    }

    /// Starts deciding a request: its first plan, or (with `spilled`) its plan once
    /// spilled over.
    fn start_spilled<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        planned: Vec<PlannedCheck>,
        spilled: Option<Spill>,
        now: u64,
    ) -> Transition<Start> {
        let local = worker.local(!worker.closing());
        let (decision, transition) = RequestDecision::start_spilled(&local, planned, spilled, now);
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

    /// Records the step and applies its outcome. The caller runs in the request's
    /// context.
    pub(super) fn apply<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        transition: Transition<Outcome>,
    ) -> Flow {
        worker.record(transition.events);
        match transition.next {
            Outcome::Allow { headers } => self.state.borrow_mut().allow(headers),
            Outcome::Reply(local_reply) => reply(worker, &local_reply),
            Outcome::Spill(spill) => self.spill(worker, spill),
        }
    }

    /// Applies the shim's answer, or its failure. The caller runs in the request's
    /// context.
    pub(super) fn answered<H: Host<RequestId = Id>>(
        &self,
        worker: &Worker<H>,
        now: u64,
        answer: RequestAnswer,
    ) -> Flow {
        let Some(transition) = self.state.borrow_mut().answered(worker, now, answer) else {
            return Flow::Pause;
        };
        self.apply(worker, transition)
    }

    /// Sets the spill-over's headers, plans the request again without the rules that
    /// spilled it, and checks it so; with nothing left to check it goes on at once.
    fn spill<H: Host<RequestId = Id>>(&self, worker: &Worker<H>, spill: Spill) -> Flow {
        for (name, value) in &spill.request_headers {
            if let Err(error) = worker.host.set_request_header(name, value) {
                let message = format!("cannot set the spill-over header {name}: {error}");
                worker.host.log(LogLevel::Error, &message);
            }
        }
        let planned: Vec<PlannedCheck> = worker
            .host
            .plan_request(&worker.config)
            .into_iter()
            .filter(|check| !spill.rules.contains(&check.rule_index))
            .collect();
        if planned.is_empty() {
            return self.state.borrow_mut().allow(vec![spill.response_header()]);
        }
        let now = worker.host.now_ms();
        let transition = self.start_spilled(worker, planned, Some(spill), now);
        worker.proceed(self, transition)
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
    /// The step the shim's answer (or its failure) takes the decision to; `None` when
    /// the stream is gone (its events, recorded here, give back what the answer
    /// granted).
    fn answered<H: Host>(
        &mut self,
        worker: &Worker<H>,
        now: u64,
        answer: RequestAnswer,
    ) -> Option<Transition<Outcome>> {
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
            return None;
        }
        Some(transition)
    }

    /// Keeps the headers and the charges for the admitted request's response.
    fn allow(&mut self, headers: crate::judged::Headers) -> Flow {
        self.response_headers = headers;
        self.response_costs = ResponseCosts::new(self.decision.take_settlements());
        Flow::Continue
    }
}

/// Answers the current request with `reply`.
fn reply<H: Host>(worker: &Worker<H>, reply: &LocalReply) -> Flow {
    if let Err(error) = worker.host.reply(reply) {
        worker
            .host
            .log(LogLevel::Error, &format!("could not send local reply: {error}"));
    }
    Flow::Pause
}
