//! The few things a host does for the filter, as a trait: proxy-wasm's is `host/` (the
//! only one linked into the `.wasm`), and the unit tests drive the worker through a fake
//! one. Everything a worker decides is written against [`Host`]; what a host must keep
//! (which context a call belongs to, how a paused request is found again) is said here.

use crate::config::FilterConfig;
use crate::local::SlotStore;
use crate::plan::PlannedCheck;
use crate::response::LocalReply;
use std::time::Duration;

/// Whether a request goes on to the upstream now or stays paused (answered by a local
/// reply, or waiting for the shim or a lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Pause,
}

/// How loud a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Info,
    Warn,
    Error,
}

/// A stat the host keeps: a counter adds, a histogram records each value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Histogram,
}

/// The host refused to start a call to the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRefused {
    /// The host knows no cluster of that name: a configuration mistake.
    pub unknown_cluster: bool,
    /// The host's own word for it.
    pub error: String,
}

/// What a worker needs from its host. One worker runs on one thread; nothing here needs
/// to be `Send`.
pub trait Host {
    /// How the host finds a paused request again (proxy-wasm: its context id).
    type RequestId: Copy;
    /// The local layer's slot table, read and written with compare-and-swap, shared by
    /// every worker of the Envoy.
    type Slots: SlotStore;

    fn slots(&self) -> &Self::Slots;

    /// Wall-clock time in Unix milliseconds (0 if it cannot be read).
    fn now_ms(&self) -> u64;
    /// Wall-clock time in Unix microseconds, for the latency histograms.
    fn now_us(&self) -> u64;

    /// Best effort: a host that cannot log has nowhere to say so.
    fn log(&self, level: LogLevel, message: &str);

    /// Defines a stat; `None` if the host refuses (it is then not counted).
    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32>;
    /// Adds to a counter, or records a value in a histogram. Best effort: a stat must
    /// never fail a request.
    fn add_to_metric(&self, id: u32, amount: u64);
    fn record_in_metric(&self, id: u32, value: u64);

    /// Starts a call to the shim's `cluster`, belonging to the worker (not to whichever
    /// request is current), so that its answer outlives any one request: it comes back
    /// to `Worker::on_call_response` under the returned token.
    fn send_call(
        &self,
        cluster: &str,
        headers: Vec<(&str, &str)>,
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, CallRefused>;

    /// Asks the host to run `Worker::on_wake` soon, where a call may be started (see
    /// [`Host::send_call`]); may be called from a request's callback.
    fn wake(&self) -> Result<(), String>;

    /// Makes `request` the current one, for [`Host::resume`] and [`Host::reply`]; false
    /// if it is gone. The worker calls [`Host::leave`] before it sends a call again.
    fn enter(&self, request: Self::RequestId) -> bool;
    /// Back to the worker's own context, after [`Host::enter`].
    fn leave(&self);

    /// Lets the current request, paused, go on to the upstream.
    fn resume(&self) -> Result<(), String>;
    /// Answers the current request with a local reply instead of the upstream's.
    fn reply(&self, reply: &LocalReply) -> Result<(), String>;
    /// Sets a header of the current request (replacing its values), so that Envoy
    /// routes the request again on it.
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), String>;
    /// The checks `config` plans for the current request, read as it is now.
    fn plan_request(&self, config: &FilterConfig) -> Vec<PlannedCheck>;
}
