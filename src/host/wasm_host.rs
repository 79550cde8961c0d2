//! proxy-wasm as the worker's [`Host`]: calls are the root context's, a paused request is
//! entered by switching the effective context to its own, the root is woken through a
//! shared queue, and the slot table is Envoy shared data.
//!
//! Envoy attaches every call to the root context whoever makes it, but the SDK delivers
//! the answer to the context whose callback made the call, and drops it once that
//! context is gone: so calls are made only in root callbacks (`crate::dispatch::rounds`
//! sends only on a wake-up, a tick or an answer), and a request wakes the root through
//! its queue.

use super::current_request::plan_current;
use super::hostcalls::{log, set_request_header, SharedData};
use crate::config::FilterConfig;
use crate::dispatch::host::{CallRefused, Host, LogLevel, MetricKind};
use crate::plan::PlannedCheck;
use crate::response::LocalReply;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{self, MetricType, Status};
use std::time::{Duration, UNIX_EPOCH};

/// One plugin instance on one worker, over proxy-wasm.
pub type Worker = crate::dispatch::worker::Worker<WasmHost>;

pub struct WasmHost {
    /// The root context, which makes every shim call.
    pub root_id: u32,
    /// The shared queue through which a request wakes the root to send the batch.
    pub wake_queue: u32,
}

/// The host's wall clock since the Unix epoch, if it can be read.
fn since_epoch() -> Option<Duration> {
    hostcalls::get_current_time()
        .ok()
        .and_then(|now| now.duration_since(UNIX_EPOCH).ok())
}

impl Host for WasmHost {
    type RequestId = u32;
    type Slots = SharedData;

    fn slots(&self) -> &SharedData {
        &SharedData
    }

    fn now_ms(&self) -> u64 {
        since_epoch().map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }

    fn now_us(&self) -> u64 {
        since_epoch().map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }

    fn log(&self, level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Info => types::LogLevel::Info,
            LogLevel::Warn => types::LogLevel::Warn,
            LogLevel::Error => types::LogLevel::Error,
        };
        log(level, message);
    }

    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32> {
        let kind = match kind {
            MetricKind::Counter => MetricType::Counter,
            MetricKind::Histogram => MetricType::Histogram,
        };
        hostcalls::define_metric(kind, name).ok()
    }

    fn add_to_metric(&self, id: u32, amount: u64) {
        let _ = hostcalls::increment_metric(id, i64::try_from(amount).unwrap_or(i64::MAX));
    }

    fn record_in_metric(&self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }

    fn send_call(
        &self,
        cluster: &str,
        headers: Vec<(&str, &str)>,
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, CallRefused> {
        hostcalls::dispatch_http_call(cluster, headers, Some(body), Vec::new(), timeout).map_err(|status| {
            CallRefused {
                unknown_cluster: matches!(status, Status::BadArgument),
                error: format!("{status:?}"),
            }
        })
    }

    fn wake(&self) -> Result<(), String> {
        hostcalls::enqueue_shared_queue(self.wake_queue, Some(b"1")).map_err(|status| format!("{status:?}"))
    }

    fn enter(&self, request: u32) -> bool {
        hostcalls::set_effective_context(request).is_ok()
    }

    fn leave(&self) {
        let _ = hostcalls::set_effective_context(self.root_id);
    }

    fn resume(&self) -> Result<(), String> {
        hostcalls::resume_http_request().map_err(|status| format!("{status:?}"))
    }

    fn reply(&self, reply: &LocalReply) -> Result<(), String> {
        let headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        hostcalls::send_http_response(reply.status, headers, Some(reply.body.as_bytes()))
            .map_err(|status| format!("{status:?}"))
    }

    fn set_request_header(&self, name: &str, value: &str) -> Result<(), String> {
        set_request_header(name, Some(value)).map_err(|error| error.to_string())
    }

    fn plan_request(&self, config: &FilterConfig) -> Vec<PlannedCheck> {
        plan_current(config)
    }
}
