//! Envoy's dynamic-module ABI as the worker's [`Host`]: one per plugin configuration
//! and worker thread. A shim call is a callout carried by one of the worker's streams
//! (the one paused last: a per-stream callout ends with its stream), or, with none that
//! will last (only what ended streams give back), by the main thread
//! ([`MainThreadCalls`]); a wake-up is a
//! stream's scheduler (or, with no stream left, the next stream's); entering a request
//! makes it the target of the worker's resumes and replies, which wait in [`Streams`]
//! until the worker has returned and are then carried out
//! ([`NativeHost::run_actions`]), so that Envoy may call back into the module (a reply
//! ends a stream at once) with nothing borrowed.

use crate::abi;
use crate::envoy::{self, Stream};
use crate::main_thread::{Call, MainThreadCalls};
use crate::request_view::plan_stream;
use crate::slots::ProcessSlots;
use crate::stats::Defined;
use crate::streams::{Action, Streams};
use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::dispatch::host::{CallRefused, Host, LogLevel, MetricKind};
use ratelimit_wasm::plan::PlannedCheck;
use ratelimit_wasm::response::LocalReply;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One plugin configuration on one worker thread.
pub type Worker = ratelimit_wasm::dispatch::worker::Worker<NativeHost>;

pub struct NativeHost {
    pub streams: RefCell<Streams>,
    /// The configuration's stats (defined when Envoy loaded it).
    stats: Arc<Defined>,
    pub main_thread: Arc<MainThreadCalls>,
    /// The worker's id, for its answers in [`MainThreadCalls`].
    pub worker_id: u64,
}

fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

impl NativeHost {
    pub fn new(stats: Arc<Defined>, main_thread: Arc<MainThreadCalls>, worker_id: u64) -> NativeHost {
        NativeHost {
            streams: RefCell::default(),
            stats,
            main_thread,
            worker_id,
        }
    }

    /// A stream to add to a stat through: the one acted on, else any live one.
    fn stat_stream(&self) -> Option<Stream> {
        let streams = self.streams.borrow();
        let id = streams.any_live(streams.target())?;
        streams.stream(id)
    }

    /// Carries out the resumes and replies the worker asked for, one at a time and
    /// with nothing borrowed: Envoy may call the module's hooks again meanwhile.
    pub fn run_actions(&self) {
        loop {
            let next = self.streams.borrow_mut().next_action();
            let Some((stream, id, action)) = next else {
                return;
            };
            let Some(stream) = stream else {
                continue;
            };
            self.streams.borrow_mut().unpaused(id);
            match action {
                Action::Resume => stream.continue_decoding(),
                Action::Reply(reply) => stream.send_response(reply.status, &reply.headers, &reply.body),
            }
        }
    }

    fn target_stream(&self) -> Option<(u64, Stream)> {
        let streams = self.streams.borrow();
        let id = streams.target()?;
        Some((id, streams.stream(id)?))
    }
}

impl Host for NativeHost {
    type RequestId = u64;
    type Slots = ProcessSlots;

    fn slots(&self) -> &ProcessSlots {
        &ProcessSlots
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(since_epoch().as_millis()).unwrap_or(u64::MAX)
    }

    fn now_us(&self) -> u64 {
        u64::try_from(since_epoch().as_micros()).unwrap_or(u64::MAX)
    }

    fn log(&self, level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Info => abi::LOG_INFO,
            LogLevel::Warn => abi::LOG_WARN,
            LogLevel::Error => abi::LOG_ERROR,
        };
        envoy::log(level, message);
    }

    /// Only looks the stat up: every stat was defined when Envoy loaded the
    /// configuration (`crate::stats`).
    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32> {
        self.stats.find(kind, name)
    }

    fn add_to_metric(&self, id: u32, amount: u64) {
        if let Some(stream) = self.stat_stream() {
            self.stats.add(stream, id, amount);
        }
    }

    fn record_in_metric(&self, id: u32, value: u64) {
        if let Some(stream) = self.stat_stream() {
            self.stats.add(stream, id, value);
        }
    }

    fn send_call(
        &self,
        cluster: &str,
        headers: Vec<(&str, &str)>,
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, CallRefused> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        let carrier = self.streams.borrow().carrier();
        let Some((id, stream)) = carrier else {
            let token = self.streams.borrow_mut().next_token();
            let call = Call {
                cluster,
                headers: &headers,
                body,
                timeout_ms,
            };
            if self.main_thread.queue(self.worker_id, token, call) {
                return Ok(token);
            }
            return Err(CallRefused {
                unknown_cluster: false,
                error: "no stream to carry the call, and the configuration is gone".to_string(),
            });
        };
        match stream.callout(cluster, &headers, body, timeout_ms) {
            Ok(callout) => Ok(self.streams.borrow_mut().call_sent(id, callout)),
            Err(result) => Err(CallRefused {
                unknown_cluster: result == abi::CALLOUT_INIT_CLUSTER_NOT_FOUND,
                error: format!("callout refused (init result {result})"),
            }),
        }
    }

    fn wake(&self) -> Result<(), String> {
        let mut streams = self.streams.borrow_mut();
        if streams.wake_via.is_some() {
            return Ok(());
        }
        let own = streams.own();
        let Some(id) = streams.any_lasting(own) else {
            // The worker goes on counting on this wake-up (it sends nothing meanwhile):
            // the next stream delivers it (`Filter::on_request_headers`).
            streams.wake_owed = true;
            return Ok(());
        };
        streams.wake_owed = false;
        let entry = streams.entry_mut(id).ok_or("the stream is gone")?;
        let scheduler = match entry.scheduler {
            Some(scheduler) => scheduler,
            None => {
                let scheduler = entry.stream.new_scheduler().ok_or("Envoy gave no scheduler")?;
                entry.scheduler = Some(scheduler);
                scheduler
            }
        };
        streams.wake_via = Some(id);
        drop(streams);
        scheduler.schedule();
        Ok(())
    }

    fn enter(&self, request: u64) -> bool {
        let mut streams = self.streams.borrow_mut();
        if !streams.is_live(request) {
            return false;
        }
        streams.set_current(Some(request));
        true
    }

    fn leave(&self) {
        self.streams.borrow_mut().set_current(None);
    }

    fn resume(&self) -> Result<(), String> {
        let mut streams = self.streams.borrow_mut();
        let id = streams.target().ok_or("no current request")?;
        streams.push_action(id, Action::Resume);
        Ok(())
    }

    fn reply(&self, reply: &LocalReply) -> Result<(), String> {
        let mut streams = self.streams.borrow_mut();
        let id = streams.target().ok_or("no current request")?;
        streams.push_action(id, Action::Reply(reply.clone()));
        Ok(())
    }

    fn set_request_header(&self, name: &str, value: &str) -> Result<(), String> {
        let (_, stream) = self.target_stream().ok_or("no current request")?;
        if stream.set_header(abi::REQUEST_HEADERS, name, Some(value)) {
            // As Envoy's Wasm host does when a filter changes a request header: the route
            // is chosen again, so that a spill-over's header reaches its fallback.
            stream.clear_route_cache();
            Ok(())
        } else {
            Err(format!("Envoy refused to set {name}"))
        }
    }

    fn plan_request(&self, config: &FilterConfig) -> Vec<PlannedCheck> {
        match self.target_stream() {
            Some((_, stream)) => plan_stream(config, stream),
            None => Vec::new(),
        }
    }
}
