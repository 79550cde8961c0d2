//! One stream's filter: plans its request's checks and starts deciding it (through
//! [`PendingRequest`], as the Wasm filter's `HttpFilter` does), keeps it paused while it
//! waits, adds the rate-limit headers to its response, reads what the response reports
//! it cost, and gives back what it holds when the stream ends. It also delivers to the
//! worker what arrives on this stream for the worker: a wake-up (its scheduler) and the
//! answers of the shim calls it carries.
//!
//! Every hook runs inside [`Filter::in_hook`]: this stream is the hook's own, and the
//! resumes and replies the worker asked for are carried out once it has returned.

use crate::abi;
use crate::envoy::Stream;
use crate::native_host::Worker;
use crate::request_view::plan_stream;
use ratelimit_wasm::attributes::header_text;
use ratelimit_wasm::dispatch::host::{Flow, Host, LogLevel};
use ratelimit_wasm::dispatch::paused::PendingRequest;
use ratelimit_wasm::dispatch::rounds::CallAnswer;
use ratelimit_wasm::plan::{reads_response_body, READABLE_BODY_HEADERS};
use ratelimit_wasm::wire::VERSION_HEADER;
use std::cell::Cell;
use std::rc::Rc;

thread_local! {
    static NEXT_STREAM: Cell<u64> = const { Cell::new(0) };
}

pub struct Filter {
    worker: Rc<Worker>,
    id: u64,
    stream: Stream,
    request: PendingRequest<u64>,
}

impl Filter {
    pub fn new(worker: Rc<Worker>, stream: Stream) -> Filter {
        let id = NEXT_STREAM.with(|next| {
            next.set(next.get() + 1);
            next.get()
        });
        worker.host.streams.borrow_mut().register(id, stream);
        Filter {
            worker,
            id,
            stream,
            request: PendingRequest::new(id),
        }
    }

    /// Runs `f` as this stream's hook (`own`: whether the stream is still there), then
    /// carries out the resumes and replies it asked for.
    fn in_hook<R>(&self, own: bool, f: impl FnOnce(&Worker) -> R) -> R {
        let host = &self.worker.host;
        let before = host.streams.borrow_mut().enter_hook(own.then_some(self.id));
        // The answers of calls the main thread carried, since this worker last ran.
        for answer in host.main_thread.take_answers(host.worker_id) {
            let call_answer = CallAnswer {
                status: answer.status.as_deref(),
                shim_version: answer.shim_version.as_deref(),
                body: &answer.body,
            };
            self.worker.on_call_response(answer.token, call_answer);
        }
        let result = f(&self.worker);
        host.streams.borrow_mut().leave_hook(before);
        host.run_actions();
        result
    }

    pub fn on_request_headers(&self) -> u32 {
        self.in_hook(true, |worker| {
            // A wake-up the worker counts on, which found no stream to go through.
            let owed = worker.host.streams.borrow().wake_owed;
            if owed && worker.host.wake().is_err() {
                worker
                    .host
                    .log(LogLevel::Warn, "cannot wake the worker's dispatcher");
            }
            let planned = plan_stream(&worker.config, self.stream);
            if planned.is_empty() {
                return abi::HEADERS_CONTINUE;
            }
            if reads_response_body(&planned) {
                self.ask_for_a_readable_body();
            }
            // Paused before the worker runs, so that a call it makes now for this
            // request is carried by this stream.
            worker.host.streams.borrow_mut().paused(self.id);
            let transition = self.request.start(worker, planned, worker.host.now_ms());
            match worker.proceed(&self.request, transition) {
                Flow::Continue => {
                    worker.host.streams.borrow_mut().unpaused(self.id);
                    abi::HEADERS_CONTINUE
                }
                Flow::Pause => abi::HEADERS_STOP_ITERATION,
            }
        })
    }

    /// While the request waits, its body and trailers wait with it.
    pub fn waits(&self) -> bool {
        self.worker.host.streams.borrow().is_paused(self.id)
    }

    pub fn on_response_headers(&self) {
        let mut state = self.request.state.borrow_mut();
        for (name, value) in std::mem::take(&mut state.response_headers) {
            self.stream.add_header(abi::RESPONSE_HEADERS, &name, &value);
        }
        if !state.response_costs.is_empty() {
            let headers = self.stream.headers(abi::RESPONSE_HEADERS);
            state
                .response_costs
                .read_headers(|name| values_of(&headers, name), &self.worker.body_budget);
        }
    }

    /// Each chunk passes on at once; read in place while a rule reads its cost from
    /// the body, nothing of it kept.
    pub fn on_response_body(&self) {
        let mut state = self.request.state.borrow_mut();
        if !state.response_costs.wants_body() {
            return;
        }
        self.stream.received_response_body(|chunk| {
            if state.response_costs.wants_body() {
                state.response_costs.add_body(chunk);
            }
        });
    }

    pub fn on_response_trailers(&self) {
        let mut state = self.request.state.borrow_mut();
        if !state.response_costs.is_empty() {
            let trailers = self.stream.headers(abi::RESPONSE_TRAILERS);
            state
                .response_costs
                .read_trailers(|name| values_of(&trailers, name));
        }
    }

    /// The stream is over, whatever ended it: the request gives back what it holds and
    /// settles what its response reported it cost (a second call finds nothing left).
    /// With no other stream to wake the worker through, that leaves now, carried by the
    /// main thread, rather than with the next request.
    pub fn on_stream_complete(&self) {
        self.worker.host.streams.borrow_mut().ended(self.id);
        self.in_hook(true, |worker| {
            self.request.end_stream(worker);
            self.wake_if_stranded(worker);
        });
    }

    /// A wake-up the worker counts on that no stream will deliver (none was left, or it
    /// went through this one, which ended): the worker runs now instead, in this hook.
    fn wake_if_stranded(&self, worker: &Worker) {
        let mut streams = worker.host.streams.borrow_mut();
        if streams.wake_owed || streams.wake_via == Some(self.id) {
            streams.wake_owed = false;
            streams.wake_via = None;
            drop(streams);
            worker.on_wake();
        }
    }

    /// The filter is going away: the calls this stream carried end with it (their
    /// requests get a failed call: each rule's failure mode decides), and a wake-up it
    /// was to deliver goes through another stream.
    pub fn on_destroy(&self) {
        self.on_stream_complete();
        let (entry, carried, was_waking) = self.worker.host.streams.borrow_mut().unregister(self.id);
        if let Some(scheduler) = entry.and_then(|entry| entry.scheduler) {
            scheduler.delete();
        }
        self.in_hook(false, |worker| {
            for token in carried {
                let failed = CallAnswer {
                    status: None,
                    shim_version: None,
                    body: &[],
                };
                worker.on_call_response(token, failed);
            }
            if was_waking && worker.host.wake().is_err() {
                worker
                    .host
                    .log(LogLevel::Warn, "cannot wake the worker's dispatcher");
            }
            self.wake_if_stranded(worker);
        });
    }

    /// The worker's wake-up, through this stream's scheduler.
    pub fn on_scheduled(&self) {
        self.in_hook(true, |worker| {
            worker.host.streams.borrow_mut().wake_via = None;
            worker.on_wake();
        });
    }

    /// The answer to a shim call this stream carried (`status`: `None` if it failed).
    pub fn on_callout_done(&self, callout: u64, headers: &[(String, Vec<u8>)], status_ok: bool, body: &[u8]) {
        self.in_hook(true, |worker| {
            let token = worker.host.streams.borrow_mut().call_answered(self.id, callout);
            let Some(token) = token else {
                return;
            };
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, value)| header_text(value.clone()))
            };
            let status = header(":status").filter(|_| status_ok);
            let shim_version = header(VERSION_HEADER);
            let answer = CallAnswer {
                status: status.as_deref(),
                shim_version: shim_version.as_deref(),
                body,
            };
            worker.on_call_response(token, answer);
        });
    }

    /// For a request whose cost is read from its response body: nothing the client
    /// sends may make that body unreadable (as the Wasm filter's `http.rs`).
    fn ask_for_a_readable_body(&self) {
        for (name, value) in READABLE_BODY_HEADERS {
            if !self.stream.set_header(abi::REQUEST_HEADERS, name, value) {
                crate::envoy::log(abi::LOG_WARN, &format!("cannot set the request's {name}"));
            }
        }
    }
}

/// Every value of a header (it may be repeated), as text.
fn values_of(map: &[(String, Vec<u8>)], name: &str) -> Vec<String> {
    map.iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, value)| header_text(value.clone()))
        .collect()
}
