//! A request's decision while it waits for the shim, shared between its HTTP context
//! and the dispatcher: applying a step means recording its events and carrying out its
//! [`Outcome`] (a local reply, or headers kept for the response).

use super::hostcalls::{log, send_http_response};
use super::Worker;
use crate::request::{RequestDecision, Transition};
use crate::response::{Headers, Outcome};
use crate::shim_call::RequestAnswer;
use proxy_wasm::types::{Action, LogLevel};

/// A request's decision in progress, and what it leaves for the response.
#[derive(Default)]
pub struct RequestState {
    pub decision: RequestDecision,
    /// Rate-limit headers to add to the allowed response.
    pub response_headers: Headers,
}

impl RequestState {
    /// Applies the shim's answer, or its failure: records the step and applies the
    /// outcome. The caller runs in this request's context.
    pub fn answered(&mut self, worker: &Worker, now: u64, answer: RequestAnswer) -> Action {
        let local = worker.local();
        let transition = match answer {
            Ok(results) => self.decision.on_answer(&local, &results, now),
            Err(failure) => self.decision.on_failure(&local, failure, now),
        };
        self.apply(worker, transition)
    }

    pub fn apply(&mut self, worker: &Worker, transition: Transition<Outcome>) -> Action {
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
