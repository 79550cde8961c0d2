//! A pass-through proxy-wasm HTTP filter: a root context and one HTTP context per
//! request, as ratelimit-wasm has, but no work at all. Measures what loading a wasm
//! filter into the request path costs Envoy before any logic runs.
//!
//! With a plugin configuration `"<probe>:<n>"` it makes `n` host calls of one kind per
//! request instead, to price a host call: `time` (`get_current_time`, returns a number),
//! `header` (`get_map_value_bytes` of `x-api-key`, whose bytes the host copies into
//! memory it asks the module to allocate), `shared` (`get_shared_data` of one key),
//! `set` (`set_shared_data` of 80 bytes), `metric` (`increment_metric`) or `add_header`
//! (`add_map_value` on the response, in the response callback). `"pause:1"` instead
//! pauses every request and resumes it from the root context after a wake-up through a
//! shared queue, as ratelimit-wasm does around a batched shim call, minus the call.
//! `"call:1"` does the same with the call: the root sends every paused request's wait as
//! one HTTP call (`GET /healthz` on the `ratelimit_shim` cluster, one call in flight) and
//! resumes them when it is answered: the exact path's mechanics without its logic.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use std::cell::RefCell;

thread_local! {
    /// Requests paused by the `pause` and `call` probes, waiting for the root to resume them.
    static PAUSED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// The `call` probe's call in flight: its token and the requests it carries.
    static CALL: RefCell<Option<(u32, Vec<u32>)>> = const { RefCell::new(None) };
}

/// The shared-data value the `shared` and `floor` probes read.
fn seed_shared_value() {
    let _ = hostcalls::set_shared_data("bench.probe", Some(&[0u8; 40]), None);
}

/// The counter the `metric` and `floor` probes increment.
fn define_probe_metric() -> Option<u32> {
    hostcalls::define_metric(MetricType::Counter, "bench.probe").ok()
}

fn resume(contexts: Vec<u32>) {
    for context_id in contexts {
        if hostcalls::set_effective_context(context_id).is_ok() {
            let _ = hostcalls::resume_http_request();
        }
    }
}

/// The `call` probe: sends what waits as one call, unless one is in flight.
fn call_for_waiting() {
    if CALL.with(|call| call.borrow().is_some()) {
        return;
    }
    let waiting = PAUSED.with(|paused| std::mem::take(&mut *paused.borrow_mut()));
    if waiting.is_empty() {
        return;
    }
    let headers = vec![(":method", "GET"), (":path", "/healthz"), (":authority", "shim")];
    match hostcalls::dispatch_http_call("ratelimit_shim", headers, None, Vec::new(), std::time::Duration::from_secs(1)) {
        Ok(token) => CALL.with(|call| *call.borrow_mut() = Some((token, waiting))),
        Err(_) => resume(waiting),
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> { Box::new(Root { context_id, probe: Probe::None }) });
}}

#[derive(Clone, Copy)]
enum Probe {
    None,
    Time(u32),
    Header(u32),
    /// The whole request header map, as the filter reads it.
    Headers(u32),
    Shared(u32),
    Set(u32),
    Metric(u32, u32),
    AddHeader(u32),
    /// The wake-up queue's id.
    Pause(u32),
    Call(u32),
    /// The host calls a local rule cannot do without, and nothing else: the request's
    /// header map, the clock, its bucket's shared-data read and CAS write and a counter;
    /// on the response, three rate-limit headers. The metric's id.
    Floor(u32),
}

impl Probe {
    fn run(self) {
        match self {
            Probe::None => {}
            Probe::Time(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_current_time();
            }),
            Probe::Header(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, "x-api-key");
            }),
            Probe::Headers(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_map_bytes(MapType::HttpRequestHeaders);
            }),
            Probe::Floor(id) => {
                let _ = hostcalls::get_map_bytes(MapType::HttpRequestHeaders);
                let _ = hostcalls::get_current_time();
                if let Ok((Some(bucket), cas)) = hostcalls::get_shared_data("bench.probe") {
                    let _ = hostcalls::set_shared_data("bench.probe", Some(&bucket), cas);
                }
                let _ = hostcalls::increment_metric(id, 1);
            }
            Probe::Shared(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_shared_data("bench.probe");
            }),
            Probe::Set(n) => (0..n).for_each(|_| {
                let _ = hostcalls::set_shared_data("bench.probe", Some(&[0u8; 80]), None);
            }),
            Probe::Metric(n, id) => (0..n).for_each(|_| {
                let _ = hostcalls::increment_metric(id, 1);
            }),
            Probe::AddHeader(_) | Probe::Pause(_) | Probe::Call(_) => {}
        }
    }

    fn run_on_response(self) {
        let n = match self {
            Probe::AddHeader(n) => n,
            Probe::Floor(_) => 3,
            _ => 0,
        };
        (0..n).for_each(|i| {
            let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, "x-probe", &i.to_string());
        });
    }
}

struct Root {
    context_id: u32,
    probe: Probe,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _headers: usize, _body: usize, _trailers: usize) {
        let answered = CALL.with(|call| {
            let mut call = call.borrow_mut();
            (call.as_ref().map(|(t, _)| *t) == Some(token)).then(|| call.take()).flatten()
        });
        if let Some((_, contexts)) = answered {
            resume(contexts);
            let _ = hostcalls::set_effective_context(self.context_id);
            call_for_waiting();
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let config = String::from_utf8_lossy(&config);
        // The bench passes it as a JSON string: quotes included.
        let Some((kind, count)) = config.trim().trim_matches('"').split_once(':') else {
            return true;
        };
        let Ok(n) = count.parse() else {
            return false;
        };
        let probe = match kind {
            "time" => Probe::Time(n),
            "header" => Probe::Header(n),
            "headers" => Probe::Headers(n),
            "floor" => {
                seed_shared_value();
                match define_probe_metric() {
                    Some(id) => Probe::Floor(id),
                    None => return false,
                }
            }
            "shared" => {
                seed_shared_value();
                Probe::Shared(n)
            }
            "set" => Probe::Set(n),
            "pause" => match hostcalls::register_shared_queue(&format!("bench.pause.{}", self.context_id)) {
                Ok(queue) => Probe::Pause(queue),
                Err(_) => return false,
            },
            "call" => match hostcalls::register_shared_queue(&format!("bench.call.{}", self.context_id)) {
                Ok(queue) => Probe::Call(queue),
                Err(_) => return false,
            },
            "add_header" => Probe::AddHeader(n),
            "metric" => match define_probe_metric() {
                Some(id) => Probe::Metric(n, id),
                None => return false,
            },
            _ => return false,
        };
        self.probe = probe;
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
        if let Probe::Call(_) = self.probe {
            call_for_waiting();
        } else {
            resume(PAUSED.with(|paused| std::mem::take(&mut *paused.borrow_mut())));
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Pass {
            context_id,
            probe: self.probe,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Pass {
    context_id: u32,
    probe: Probe,
}

impl Context for Pass {}

impl HttpContext for Pass {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Probe::Pause(queue) | Probe::Call(queue) = self.probe {
            let first = PAUSED.with(|paused| {
                let mut paused = paused.borrow_mut();
                paused.push(self.context_id);
                paused.len() == 1
            });
            if first && hostcalls::enqueue_shared_queue(queue, Some(b"1")).is_err() {
                return Action::Continue;
            }
            return Action::Pause;
        }
        self.probe.run();
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.probe.run_on_response();
        Action::Continue
    }
}
