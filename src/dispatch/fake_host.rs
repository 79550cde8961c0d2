//! A host for the unit tests: a clock set by hand, shared data in a map, and a record of
//! everything the worker asked of it (calls, wake-ups, resumes and replies, and in
//! which context each happened), so a test can say that every paused request was
//! resumed or answered exactly once, in its own context, and calls made only in the
//! worker's.

use super::host::{CallRefused, Host, LogLevel, MetricKind};
use crate::attributes::fake::FakeRequest;
use crate::config::FilterConfig;
use crate::local::tests::MapStore;
use crate::plan::{plan, PlannedCheck};
use crate::response::LocalReply;
use crate::wire::BatchCheckRequest;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

/// What happened to a request, as the host saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happened {
    /// Let go on from its own callback (the worker returned `Flow::Continue` at once).
    Continued(u32),
    Resumed(u32),
    Replied(u32, u32),
    /// A call to the shim, by token, with the requests it carried.
    Sent(u32, usize),
}

#[derive(Default)]
pub(crate) struct FakeHost {
    pub slots: MapStore,
    pub now_ms: Cell<u64>,
    /// The request whose context is current; `None`: the worker's own.
    current: Cell<Option<u32>>,
    pub happened: RefCell<Vec<Happened>>,
    /// Each call's decoded body, by token.
    pub calls: RefCell<HashMap<u32, BatchCheckRequest>>,
    next_token: Cell<u32>,
    /// The host refuses to start calls.
    pub refuse_calls: Cell<bool>,
    pub wakes: Cell<usize>,
    pub logs: RefCell<Vec<(LogLevel, String)>>,
    metric_names: RefCell<Vec<String>>,
    metric_values: RefCell<HashMap<u32, u64>>,
    /// What the host was asked in the wrong context: calls in a request's, resumes and
    /// replies in none.
    pub misplaced: RefCell<Vec<String>>,
    /// Each request's headers (a `GET /`), as the worker set them.
    pub request_headers: RefCell<HashMap<u32, Vec<(String, String)>>>,
}

impl FakeHost {
    /// The value of the counter `name`, 0 if never added to.
    pub fn counter(&self, name: &str) -> u64 {
        let names = self.metric_names.borrow();
        let Some(id) = names.iter().position(|known| known == name) else {
            return 0;
        };
        self.metric_values
            .borrow()
            .get(&(id as u32))
            .copied()
            .unwrap_or(0)
    }

    /// What happened to the request `id`: its resumes and replies.
    pub fn outcomes_of(&self, id: u32) -> Vec<Happened> {
        self.happened
            .borrow()
            .iter()
            .filter(|happened| matches!(happened, Happened::Continued(of) | Happened::Resumed(of) | Happened::Replied(of, _) if *of == id))
            .cloned()
            .collect()
    }

    fn current_request(&self, what: &str) -> u32 {
        self.current.get().unwrap_or_else(|| {
            self.misplaced
                .borrow_mut()
                .push(format!("{what} outside a request"));
            0
        })
    }
}

impl Host for FakeHost {
    type RequestId = u32;
    type Slots = MapStore;

    fn slots(&self) -> &MapStore {
        &self.slots
    }

    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }

    fn now_us(&self) -> u64 {
        self.now_ms.get() * 1_000
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }

    fn define_metric(&self, _kind: MetricKind, name: &str) -> Option<u32> {
        let mut names = self.metric_names.borrow_mut();
        names.push(name.to_string());
        Some(names.len() as u32 - 1)
    }

    fn add_to_metric(&self, id: u32, amount: u64) {
        *self.metric_values.borrow_mut().entry(id).or_default() += amount;
    }

    fn record_in_metric(&self, _id: u32, _value: u64) {}

    fn send_call(
        &self,
        _cluster: &str,
        _headers: Vec<(&str, &str)>,
        body: &[u8],
        _timeout: Duration,
    ) -> Result<u32, CallRefused> {
        if let Some(request) = self.current.get() {
            self.misplaced
                .borrow_mut()
                .push(format!("a call made in request {request}'s context"));
        }
        if self.refuse_calls.get() {
            return Err(CallRefused {
                unknown_cluster: true,
                error: "BadArgument".into(),
            });
        }
        let token = self.next_token.get() + 1;
        self.next_token.set(token);
        let body: BatchCheckRequest = serde_json::from_slice(body).unwrap();
        self.happened
            .borrow_mut()
            .push(Happened::Sent(token, body.requests.len()));
        self.calls.borrow_mut().insert(token, body);
        Ok(token)
    }

    fn wake(&self) -> Result<(), String> {
        self.wakes.set(self.wakes.get() + 1);
        Ok(())
    }

    fn enter(&self, request: u32) -> bool {
        self.current.set(Some(request));
        true
    }

    fn leave(&self) {
        self.current.set(None);
    }

    fn resume(&self) -> Result<(), String> {
        let request = self.current_request("resume");
        self.happened.borrow_mut().push(Happened::Resumed(request));
        Ok(())
    }

    fn reply(&self, reply: &LocalReply) -> Result<(), String> {
        let request = self.current_request("reply");
        self.happened
            .borrow_mut()
            .push(Happened::Replied(request, reply.status));
        Ok(())
    }

    fn set_request_header(&self, name: &str, value: &str) -> Result<(), String> {
        let request = self.current_request("set_request_header");
        let mut all = self.request_headers.borrow_mut();
        let headers = all.entry(request).or_default();
        headers.retain(|(known, _)| known != name);
        headers.push((name.to_string(), value.to_string()));
        Ok(())
    }

    fn plan_request(&self, config: &FilterConfig) -> Vec<PlannedCheck> {
        let request = self.current_request("plan_request");
        let headers = self
            .request_headers
            .borrow()
            .get(&request)
            .cloned()
            .unwrap_or_default();
        let fake = headers.iter().fold(FakeRequest::get("/"), |fake, (name, value)| {
            fake.with_header(name, value)
        });
        plan(config, &fake)
    }
}
