//! One HTTP request's context: reads the request through Envoy ([`HostRequest`]), starts
//! the pure [`RequestDecision`], and either applies its outcome at once or queues the
//! checks for the shim and pauses; adds the rate-limit headers to the response.

use super::dispatcher::QueuedRequest;
use super::hostcalls::{self, add_response_header, now_ms, property_text};
use super::request_state::RequestState;
use super::Worker;
use crate::attributes::RequestAttributes;
use crate::plan::plan;
use crate::request::{RequestDecision, Start, Transition};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::cell::RefCell;
use std::rc::Rc;

pub struct RateLimitRequest {
    pub context_id: u32,
    pub worker: Rc<Worker>,
    /// Shared with the dispatcher while the request waits for the shim.
    pub state: Rc<RefCell<RequestState>>,
}

/// The current request as seen through Envoy's header map and properties.
struct HostRequest<'a> {
    jwt_payload_in_metadata: &'a str,
}

impl RequestAttributes for HostRequest<'_> {
    fn header(&self, name: &str) -> Option<String> {
        hostcalls::header(MapType::HttpRequestHeaders, name)
    }

    fn source_address(&self) -> Option<String> {
        property_text(vec!["source", "address"])
    }

    /// Only what `jwt_authn` verified and wrote to dynamic metadata; the Authorization
    /// header itself is never read.
    fn jwt_claim(&self, name: &str) -> Option<String> {
        property_text(vec![
            "metadata",
            "filter_metadata",
            "envoy.filters.http.jwt_authn",
            self.jwt_payload_in_metadata,
            name,
        ])
    }
}

impl Context for RateLimitRequest {}

impl HttpContext for RateLimitRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let worker = Rc::clone(&self.worker);
        let config = &worker.config;
        let request = HostRequest {
            jwt_payload_in_metadata: &config.jwt_payload_in_metadata,
        };
        let planned = plan(config, &request);
        if planned.is_empty() {
            return Action::Continue;
        }
        let now = now_ms();
        let (decision, transition) = RequestDecision::start(&worker.local(), planned, now);
        let mut state = self.state.borrow_mut();
        state.decision = decision;
        match transition.next {
            Start::Decided(outcome) => state.apply(
                &worker,
                Transition {
                    next: outcome,
                    events: transition.events,
                },
            ),
            Start::AskShim(checks) => {
                worker.record(transition.events);
                let queued = QueuedRequest {
                    context_id: self.context_id,
                    state: Rc::downgrade(&self.state),
                    checks,
                };
                let timeout_ms = u64::try_from(config.shim.timeout.as_millis()).unwrap_or(u64::MAX);
                worker.dispatcher.submit(queued, now.saturating_add(timeout_ms));
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let headers = std::mem::take(&mut self.state.borrow_mut().response_headers);
        for (name, value) in headers {
            let _ = add_response_header(&name, &value);
        }
        Action::Continue
    }
}
