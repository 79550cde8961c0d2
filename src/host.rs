//! The proxy-wasm host layer: the only code that talks to Envoy.
//!
//! It reads the request's attributes, plans the checks, asks the shim with one
//! `dispatch_http_call`, pauses the request, and applies the pure [`Outcome`] when the
//! answer (or the call's failure or timeout) arrives. Host calls go through
//! `hostcalls::*`, whose `Result`s are handled here instead of the SDK trait defaults
//! that `unwrap()` them: a panic would kill the VM for every request on this worker.

use crate::config::FilterConfig;
use crate::keys::RequestAttributes;
use crate::plan::{plan, PlannedCheck};
use crate::response::{decide, on_shim_failure, shadow_refusals, Applied, Headers, Outcome};
use crate::wire::{CheckRequest, CheckResponse, CHECK_PATH, TOKEN_HEADER};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::rc::Rc;
use std::time::UNIX_EPOCH;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(RateLimitRoot { config: None }) });
}}

fn log(level: LogLevel, message: &str) {
    // Logging is best effort; there is nowhere to report its own failure.
    let _ = hostcalls::log(level, message);
}

/// One per plugin instance: owns the compiled configuration.
struct RateLimitRoot {
    config: Option<Rc<FilterConfig>>,
}

impl Context for RateLimitRoot {}

impl RootContext for RateLimitRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(bytes)) => bytes,
            _ => Vec::new(),
        };
        match FilterConfig::from_json(&bytes) {
            Ok(config) => {
                log(
                    LogLevel::Info,
                    &format!("ratelimit-wasm: configured with {} rule(s)", config.rules.len()),
                );
                self.config = Some(Rc::new(config));
                true
            }
            Err(error) => {
                log(
                    LogLevel::Error,
                    &format!("ratelimit-wasm: invalid plugin configuration: {error}"),
                );
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(RateLimitRequest {
            config,
            planned: Vec::new(),
            response_headers: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One per HTTP request.
struct RateLimitRequest {
    config: Rc<FilterConfig>,
    /// The checks sent to the shim, in the order of its results.
    planned: Vec<PlannedCheck>,
    /// Rate-limit headers to add to the allowed response.
    response_headers: Headers,
}

/// The current request as seen through Envoy's header map and properties.
struct HostRequest<'a> {
    jwt_payload_in_metadata: &'a str,
}

fn property_text(path: Vec<&str>) -> Option<String> {
    let bytes = hostcalls::get_property(path).ok().flatten()?;
    String::from_utf8(bytes).ok()
}

impl RequestAttributes for HostRequest<'_> {
    fn header(&self, name: &str) -> Option<String> {
        hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
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

impl RateLimitRequest {
    /// Applies an outcome to the request, which the caller has paused or is about to.
    fn apply(&mut self, outcome: Outcome) -> Action {
        match outcome {
            Outcome::Allow { headers } => {
                self.response_headers = headers;
                Action::Continue
            }
            Outcome::Reply(reply) => {
                let headers: Vec<(&str, &str)> = reply
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                if let Err(status) =
                    hostcalls::send_http_response(reply.status, headers, Some(reply.body.as_bytes()))
                {
                    log(
                        LogLevel::Error,
                        &format!("ratelimit-wasm: could not send local reply: {status:?}"),
                    );
                }
                Action::Pause
            }
        }
    }

    fn read_shim_answer(&self, body_size: usize) -> Result<CheckResponse, String> {
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .ok_or("no response (call failed or timed out)")?;
        if status != "200" {
            return Err(format!("status {status}"));
        }
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        serde_json::from_slice(&body).map_err(|e| format!("unreadable answer: {e}"))
    }

    fn decide_from_answer(&self, body_size: usize) -> Outcome {
        let answer = match self.read_shim_answer(body_size) {
            Ok(answer) => answer,
            Err(reason) => {
                log(
                    LogLevel::Warn,
                    &format!("ratelimit-wasm: shim check failed: {reason}"),
                );
                return on_shim_failure(self.config.failure_mode);
            }
        };
        let applied: Vec<Applied<'_>> = self
            .planned
            .iter()
            .map(|p| (&self.config.rules[p.rule_index], &p.check))
            .collect();
        let now_unix_ms = hostcalls::get_current_time()
            .ok()
            .and_then(|now| now.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_millis() as u64);
        let outcome = decide(&applied, &answer, now_unix_ms, &self.config.response);
        match outcome {
            Ok(outcome) => {
                for rule in shadow_refusals(&applied, &answer) {
                    log(
                        LogLevel::Info,
                        &format!("ratelimit-wasm: shadow rule {rule} would refuse this request"),
                    );
                }
                outcome
            }
            Err(mismatch) => {
                log(
                    LogLevel::Warn,
                    &format!("ratelimit-wasm: shim answer does not match the request: {mismatch:?}"),
                );
                on_shim_failure(self.config.failure_mode)
            }
        }
    }
}

impl Context for RateLimitRequest {
    fn on_http_call_response(
        &mut self,
        _token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let outcome = self.decide_from_answer(body_size);
        if let Action::Continue = self.apply(outcome) {
            if let Err(status) = hostcalls::resume_http_request() {
                log(
                    LogLevel::Error,
                    &format!("ratelimit-wasm: could not resume request: {status:?}"),
                );
            }
        }
    }
}

impl HttpContext for RateLimitRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let config = Rc::clone(&self.config);
        let request = HostRequest {
            jwt_payload_in_metadata: &config.jwt_payload_in_metadata,
        };
        self.planned = plan(&config, &request);
        if self.planned.is_empty() {
            return Action::Continue;
        }
        let checks = self.planned.iter().map(|p| p.check.clone()).collect();
        let body = match serde_json::to_vec(&CheckRequest { checks }) {
            Ok(body) => body,
            Err(_) => return self.apply(on_shim_failure(config.failure_mode)),
        };
        let shim = &config.shim;
        let mut headers = vec![
            (":method", "POST"),
            (":path", CHECK_PATH),
            (":authority", shim.authority.as_str()),
            ("content-type", "application/json"),
        ];
        if let Some(token) = &shim.token {
            headers.push((TOKEN_HEADER, token.as_str()));
        }
        match hostcalls::dispatch_http_call(&shim.cluster, headers, Some(&body), Vec::new(), shim.timeout) {
            Ok(_token) => Action::Pause,
            Err(status) => {
                log(
                    LogLevel::Warn,
                    &format!(
                        "ratelimit-wasm: cannot call shim cluster {}: {status:?}",
                        shim.cluster
                    ),
                );
                self.apply(on_shim_failure(config.failure_mode))
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in std::mem::take(&mut self.response_headers) {
            let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, &name, &value);
        }
        Action::Continue
    }
}
