//! A pass-through proxy-wasm HTTP filter: a root context and one HTTP context per
//! request, as ratelimit-wasm has, but no work at all. Measures what loading a wasm
//! filter into the request path costs Envoy before any logic runs.
//!
//! With a plugin configuration `"<probe>:<n>"` it makes `n` host calls of one kind per
//! request instead, to price a host call: `time` (`get_current_time`, returns a number),
//! `header` (`get_map_value_bytes` of `x-api-key`, whose bytes the host copies into
//! memory it asks the module to allocate), `shared` (`get_shared_data` of one key),
//! `set` (`set_shared_data` of 80 bytes), `metric` (`increment_metric`) or `add_header`
//! (`add_map_value` on the response, in the response callback).

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { probe: Probe::None }) });
}}

#[derive(Clone, Copy)]
enum Probe {
    None,
    Time(u32),
    Header(u32),
    Shared(u32),
    Set(u32),
    Metric(u32, u32),
    AddHeader(u32),
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
            Probe::Shared(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_shared_data("bench.probe");
            }),
            Probe::Set(n) => (0..n).for_each(|_| {
                let _ = hostcalls::set_shared_data("bench.probe", Some(&[0u8; 80]), None);
            }),
            Probe::Metric(n, id) => (0..n).for_each(|_| {
                let _ = hostcalls::increment_metric(id, 1);
            }),
            Probe::AddHeader(_) => {}
        }
    }

    fn run_on_response(self) {
        if let Probe::AddHeader(n) = self {
            (0..n).for_each(|i| {
                let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, "x-probe", &i.to_string());
            });
        }
    }
}

struct Root {
    probe: Probe,
}

impl Context for Root {}

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
            "shared" => {
                let _ = hostcalls::set_shared_data("bench.probe", Some(&[0u8; 40]), None);
                Probe::Shared(n)
            }
            "set" => Probe::Set(n),
            "add_header" => Probe::AddHeader(n),
            "metric" => match hostcalls::define_metric(MetricType::Counter, "bench.probe") {
                Ok(id) => Probe::Metric(n, id),
                Err(_) => return false,
            },
            _ => return false,
        };
        self.probe = probe;
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Pass { probe: self.probe }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Pass {
    probe: Probe,
}

impl Context for Pass {}

impl HttpContext for Pass {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.probe.run();
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.probe.run_on_response();
        Action::Continue
    }
}
