//! A request while the worker holds it: its decision in progress and what it leaves for
//! the response ([`RequestState`]), shared between the host's context of the request
//! ([`PendingRequest`]) and the worker's queues ([`RequestHandle`], which does not keep
//! the request alive: once its stream is gone, its answer is dropped).

use crate::judged::Headers;
use crate::request::RequestDecision;
use crate::settlement::ResponseCosts;
use std::cell::RefCell;
use std::rc::{Rc, Weak};

/// A request's decision in progress, and what it leaves for the response.
#[derive(Default)]
pub struct RequestState {
    pub(super) decision: RequestDecision,
    /// When the request stops waiting: `timeout` after it arrived.
    pub(super) deadline_ms: u64,
    /// Rate-limit headers to add to the allowed response.
    pub response_headers: Headers,
    /// The charges the response settles, with what it reports so far.
    pub response_costs: ResponseCosts,
}

/// A request in flight through the host: how the host knows it, and its state.
pub struct PendingRequest<Id> {
    pub id: Id,
    pub state: Rc<RefCell<RequestState>>,
}

impl<Id: Copy> PendingRequest<Id> {
    pub fn new(id: Id) -> PendingRequest<Id> {
        PendingRequest {
            id,
            state: Rc::default(),
        }
    }

    pub fn deadline_ms(&self) -> u64 {
        self.state.borrow().deadline_ms
    }

    pub(super) fn handle(&self) -> RequestHandle<Id> {
        RequestHandle {
            id: self.id,
            state: Rc::downgrade(&self.state),
        }
    }
}

/// How the worker finds a paused request again.
pub struct RequestHandle<Id> {
    pub(super) id: Id,
    /// Dead once the request's stream is gone.
    pub(super) state: Weak<RefCell<RequestState>>,
}

impl<Id: Copy> RequestHandle<Id> {
    /// The request again, if its stream is still there.
    pub(super) fn upgrade(&self) -> Option<PendingRequest<Id>> {
        Some(PendingRequest {
            id: self.id,
            state: self.state.upgrade()?,
        })
    }

    pub(super) fn is_live(&self) -> bool {
        self.state.strong_count() > 0
    }
}
