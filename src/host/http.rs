//! One HTTP request's context: plans its checks (through
//! [`plan_current`](super::current_request::plan_current)) and starts deciding it
//! ([`PendingRequest`]); adds the rate-limit headers to the response.

use super::current_request::plan_current;
use super::hostcalls::{
    add_response_header, header_map, log, property_bytes, response_body_part, set_request_header,
};
use super::wasm_host::Worker;
use crate::attributes::header_text;
use crate::dispatch::host::{Flow, Host};
use crate::dispatch::paused::PendingRequest;
use crate::plan::{reads_response_body, READABLE_BODY_HEADERS};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel, MapType};
use std::rc::Rc;

/// The proxy-wasm HTTP context of one request: reads it, runs its decision (through
/// [`PendingRequest`]) and applies the outcome to its headers and response.
pub struct HttpFilter {
    pub worker: Rc<Worker>,
    pub request: PendingRequest<u32>,
}

impl HttpFilter {
    /// The stream is over: the token usage Envoy published for it, if a rule reads it,
    /// is read before the request settles. Published at the stream's clean end, by a
    /// filter that may encode after this one, it is there by now.
    fn end_stream(&self) {
        let mut state = self.request.state.borrow_mut();
        if state.response_costs.reads_token_usage() {
            state.response_costs.read_token_usage(|namespace, path| {
                let mut property = vec!["metadata", "typed_filter_metadata", namespace];
                property.extend_from_slice(path);
                property_bytes(property)
            });
        }
        drop(state);
        self.request.end_stream(&self.worker);
    }
}

impl Context for HttpFilter {
    /// The stream is over, whatever ended it (response complete, upstream reset,
    /// timeout, client abort, a later filter's reply): the request gives back what it
    /// holds and settles what its response reported it cost. `on_log` does the same,
    /// whichever comes first: the second finds nothing left.
    fn on_done(&mut self) -> bool {
        self.end_stream();
        true
    }
}

impl HttpContext for HttpFilter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let worker = Rc::clone(&self.worker);
        let planned = plan_current(&worker.config);
        if planned.is_empty() {
            return Action::Continue;
        }
        if reads_response_body(&planned) {
            ask_for_a_readable_body();
        }
        let transition = self.request.start(&worker, planned, worker.host.now_ms());
        match worker.proceed(&self.request, transition) {
            Flow::Continue => Action::Continue,
            Flow::Pause => Action::Pause,
        }
    }

    /// The stream is over (see `on_done`).
    fn on_log(&mut self) {
        self.end_stream();
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let mut state = self.request.state.borrow_mut();
        for (name, value) in std::mem::take(&mut state.response_headers) {
            let _ = add_response_header(&name, &value);
        }
        if !state.response_costs.is_empty() {
            let headers = header_map(MapType::HttpResponseHeaders);
            state
                .response_costs
                .read_headers(|name| values_of(&headers, name), &self.worker.body_budget);
        }
        Action::Continue
    }

    /// Each chunk passes on at once; while a rule reads its cost from the body, the chunk
    /// is read in slices of at most `BODY_SLICE` bytes (so a large chunk never grows the
    /// VM's memory) and nothing of it is kept.
    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        let mut state = self.request.state.borrow_mut();
        let mut start = 0;
        while start < body_size && state.response_costs.wants_body() {
            let size = BODY_SLICE.min(body_size - start);
            state.response_costs.add_body(&response_body_part(start, size));
            start += size;
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        let mut state = self.request.state.borrow_mut();
        if !state.response_costs.is_empty() {
            let trailers = header_map(MapType::HttpResponseTrailers);
            state
                .response_costs
                .read_trailers(|name| values_of(&trailers, name));
        }
        Action::Continue
    }
}

/// The most of a response body copied into the VM at once.
const BODY_SLICE: usize = 16 * 1024;

/// Every value of a header (it may be repeated), as text.
fn values_of(map: &[(String, Vec<u8>)], name: &str) -> Vec<String> {
    map.iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, value)| header_text(value.clone()))
        .collect()
}

/// For a request whose cost is read from its response body: the whole body,
/// uncompressed ([`READABLE_BODY_HEADERS`]).
fn ask_for_a_readable_body() {
    for (name, value) in READABLE_BODY_HEADERS {
        if let Err(error) = set_request_header(name, value) {
            log(
                LogLevel::Warn,
                &format!("cannot set the request's {name}: {error}"),
            );
        }
    }
}
