//! The proxy-wasm host layer: the only code that talks to Envoy.
//!
//! It reads the request's attributes, plans the checks, runs the local layer against
//! shared data, asks the shim with one `dispatch_http_call` for what is left, pauses the
//! request, and applies the pure [`Outcome`] when the answer (or the call's failure or
//! timeout) arrives. Host calls go through `hostcalls::*`, whose `Result`s are handled
//! here instead of the SDK trait defaults that `unwrap()` them: a panic would kill the VM
//! for every request on this worker.

use crate::config::{FailureMode, FilterConfig, RuleFailureMode};
use crate::keys::RequestAttributes;
use crate::local::{self, Event, FailureVerdict, LocalPass, SlotStore, StoreError};
use crate::plan::{plan, PlannedCheck};
use crate::response::{self, decide, shadow_refusals, Applied, Headers, Outcome};
use crate::wire::{Check, CheckRequest, CheckResponse, CheckResult, CHECK_PATH, TOKEN_HEADER};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use std::rc::Rc;
use std::time::UNIX_EPOCH;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(RateLimitRoot { filter: None }) });
}}

fn log(level: LogLevel, message: &str) {
    // Logging is best effort; there is nowhere to report its own failure.
    let _ = hostcalls::log(level, message);
}

fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|now| now.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_millis() as u64)
}

/// The slot table in Envoy shared data, shared by every worker of this VM.
struct SharedData;

fn slot_key(slot: u32) -> String {
    format!("ratelimit-wasm.slot.{slot}")
}

impl SlotStore for SharedData {
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(&slot_key(slot)) {
            Ok((Some(bytes), Some(cas))) => Some((bytes, cas)),
            _ => None,
        }
    }

    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, StoreError> {
        match hostcalls::set_shared_data(&slot_key(slot), Some(bytes), cas) {
            Ok(()) => Ok(true),
            Err(Status::CasMismatch) => Ok(false),
            Err(_) => Err(StoreError::Host),
        }
    }
}

/// Stats the filter defines, per rule: `ratelimit.<rule>.<counter>` in Envoy's stats
/// (shown under the `wasmcustom.` prefix), plus a histogram of shim call latency.
struct Metrics {
    rules: Vec<RuleMetrics>,
    shim_latency_ms: Option<u32>,
}

#[derive(Clone, Copy)]
enum Counter {
    Allowed,
    Denied,
    ShadowDenied,
    DeniedLocally,
    DenyCacheHits,
    LeaseHits,
    ShimCalls,
    ShimErrors,
    ShimTimeouts,
    FailedOpen,
    FailedClosed,
}

const COUNTERS: [(Counter, &str); 11] = [
    (Counter::Allowed, "allowed"),
    (Counter::Denied, "denied"),
    (Counter::ShadowDenied, "shadow_denied"),
    (Counter::DeniedLocally, "denied_locally"),
    (Counter::DenyCacheHits, "deny_cache_hits"),
    (Counter::LeaseHits, "lease_hits"),
    (Counter::ShimCalls, "shim_calls"),
    (Counter::ShimErrors, "shim_errors"),
    (Counter::ShimTimeouts, "shim_timeouts"),
    (Counter::FailedOpen, "failed_open"),
    (Counter::FailedClosed, "failed_closed"),
];

struct RuleMetrics([Option<u32>; COUNTERS.len()]);

impl Metrics {
    fn define(config: &FilterConfig) -> Metrics {
        let rules = config
            .rules
            .iter()
            .map(|rule| {
                RuleMetrics(COUNTERS.map(|(_, name)| {
                    hostcalls::define_metric(
                        MetricType::Counter,
                        &format!("ratelimit.{}.{}", rule.name, name),
                    )
                    .ok()
                }))
            })
            .collect();
        Metrics {
            rules,
            shim_latency_ms: hostcalls::define_metric(MetricType::Histogram, "ratelimit.shim_call_ms").ok(),
        }
    }

    fn count(&self, rule_index: usize, counter: Counter) {
        if let Some(Some(id)) = self.rules.get(rule_index).map(|m| m.0[counter as usize]) {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }
}

/// What a request context needs from its plugin.
struct Filter {
    config: FilterConfig,
    metrics: Metrics,
}

/// One per plugin instance: owns the compiled configuration.
struct RateLimitRoot {
    filter: Option<Rc<Filter>>,
}

impl Context for RateLimitRoot {}

impl RootContext for RateLimitRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(bytes)) => bytes,
            _ => Vec::new(),
        };
        let config = match FilterConfig::from_json(&bytes) {
            Ok(config) => config,
            Err(error) => {
                log(
                    LogLevel::Error,
                    &format!("ratelimit-wasm: invalid plugin configuration: {error}"),
                );
                return false;
            }
        };
        if local::create_slots(&SharedData, config.local_slots).is_err() {
            log(
                LogLevel::Error,
                "ratelimit-wasm: cannot create the local slot table in shared data",
            );
            return false;
        }
        log(
            LogLevel::Info,
            &format!("ratelimit-wasm: configured with {} rule(s)", config.rules.len()),
        );
        let metrics = Metrics::define(&config);
        self.filter = Some(Rc::new(Filter { config, metrics }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let filter = self.filter.clone()?;
        Some(Box::new(RateLimitRequest {
            filter,
            planned: Vec::new(),
            pass: LocalPass::default(),
            now_ms: 0,
            called_at_ms: 0,
            response_headers: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One per HTTP request.
struct RateLimitRequest {
    filter: Rc<Filter>,
    /// Every rule's check for this request.
    planned: Vec<PlannedCheck>,
    /// What the local layer decided, and which checks went to the shim.
    pass: LocalPass,
    /// The host's wall clock, read once per callback: a host call is not free.
    now_ms: u64,
    called_at_ms: u64,
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

/// A header's value. Read as bytes: the SDK's `get_map_value` panics on a value that is
/// not UTF-8, which any client can send. Invalid bytes become U+FFFD, so garbage values
/// share counters rather than escape them.
fn header_value(map: MapType, name: &str) -> Option<String> {
    let bytes = hostcalls::get_map_value_bytes(map, name).ok().flatten()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

impl RequestAttributes for HostRequest<'_> {
    fn header(&self, name: &str) -> Option<String> {
        header_value(MapType::HttpRequestHeaders, name)
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
    fn config(&self) -> &FilterConfig {
        &self.filter.config
    }

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

    /// Decides from every result known so far (local ones, and the shim's once merged),
    /// and counts the decision per rule.
    fn decide_known(&self, results: &[Option<CheckResult>]) -> Outcome {
        let config = self.config();
        let known: Vec<(usize, CheckResult)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)))
            .collect();
        let applied: Vec<Applied<'_>> = known
            .iter()
            .map(|(i, _)| {
                (
                    &config.rules[self.planned[*i].rule_index],
                    &self.planned[*i].check,
                )
            })
            .collect();
        let known_results: Vec<CheckResult> = known.iter().map(|(_, r)| *r).collect();
        if applied.is_empty() {
            return Outcome::Allow { headers: Vec::new() };
        }
        for rule in shadow_refusals(&applied, &known_results) {
            log(
                LogLevel::Info,
                &format!("ratelimit-wasm: shadow rule {rule} would refuse this request"),
            );
        }
        let outcome = decide(&applied, &known_results, self.now_ms, &config.response)
            .unwrap_or_else(|_| response::on_shim_failure(FailureMode::Open));
        let metrics = &self.filter.metrics;
        for ((index, result), (rule, _)) in known.iter().zip(&applied) {
            let rule_index = self.planned[*index].rule_index;
            let counter = match (rule.shadow, result.allowed, &outcome) {
                (true, false, _) => Counter::ShadowDenied,
                (false, false, _) => Counter::Denied,
                (_, true, Outcome::Allow { .. }) => Counter::Allowed,
                (_, true, Outcome::Reply(_)) => continue,
            };
            metrics.count(rule_index, counter);
        }
        outcome
    }

    fn read_shim_answer(&self, body_size: usize) -> Result<CheckResponse, String> {
        let status = header_value(MapType::HttpCallResponseHeaders, ":status")
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

    /// The shim gave no usable answer: each pending rule's failure mode decides.
    fn on_shim_failure(&mut self, reason: &str, timed_out: bool) -> Outcome {
        log(
            LogLevel::Warn,
            &format!("ratelimit-wasm: shim check failed: {reason}"),
        );
        let filter = Rc::clone(&self.filter);
        for &(index, _) in &self.pass.to_shim {
            let counter = if timed_out {
                Counter::ShimTimeouts
            } else {
                Counter::ShimErrors
            };
            filter.metrics.count(self.planned[index].rule_index, counter);
        }
        let verdict = local::on_shim_failure(
            &filter.config,
            &self.planned,
            &SharedData,
            self.now_ms,
            &mut self.pass,
        );
        // A `local` rule's fallback decision is counted as allowed or denied instead.
        for &(index, _) in &self.pass.to_shim {
            let rule_index = self.planned[index].rule_index;
            match filter.config.rules[rule_index].on_failure {
                RuleFailureMode::Open => filter.metrics.count(rule_index, Counter::FailedOpen),
                RuleFailureMode::Closed => filter.metrics.count(rule_index, Counter::FailedClosed),
                RuleFailureMode::Local(_) => {}
            }
        }
        match verdict {
            FailureVerdict::Closed(_) => response::on_shim_failure(FailureMode::Closed),
            FailureVerdict::Refused(_) | FailureVerdict::Allow => {
                // Pending rules without a fallback decision pass unseen by the headers.
                let results = self.pass.results.clone();
                self.decide_known(&results)
            }
        }
    }

    fn on_answer(&mut self, body_size: usize) -> Outcome {
        self.now_ms = now_ms();
        let elapsed_ms = self.now_ms.saturating_sub(self.called_at_ms);
        if let Some(id) = self.filter.metrics.shim_latency_ms {
            let _ = hostcalls::record_metric(id, elapsed_ms);
        }
        let answer = match self.read_shim_answer(body_size) {
            Ok(answer) => answer,
            Err(reason) => {
                // Envoy's timer and the wall clock disagree by a few ms: a failure at 90% of
                // the timeout or later is the timeout (refusals and resets come far sooner).
                let timed_out = elapsed_ms * 10 >= self.config().shim.timeout.as_millis() as u64 * 9;
                return self.on_shim_failure(&reason, timed_out);
            }
        };
        let filter = Rc::clone(&self.filter);
        match local::after_answer(
            &filter.config,
            &self.planned,
            &SharedData,
            self.now_ms,
            &mut self.pass,
            &answer,
        ) {
            Some(merged) => {
                let results: Vec<Option<CheckResult>> = merged.results.into_iter().map(Some).collect();
                self.decide_known(&results)
            }
            None => self.on_shim_failure("answer does not match the request", false),
        }
    }

    fn check_request(&self) -> Vec<Check> {
        self.pass
            .to_shim
            .iter()
            .map(|&(index, lease)| Check {
                lease,
                ..self.planned[index].check.clone()
            })
            .collect()
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
        let outcome = self.on_answer(body_size);
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
        let filter = Rc::clone(&self.filter);
        let config = &filter.config;
        let request = HostRequest {
            jwt_payload_in_metadata: &config.jwt_payload_in_metadata,
        };
        self.planned = plan(config, &request);
        if self.planned.is_empty() {
            return Action::Continue;
        }
        self.now_ms = now_ms();
        self.pass = local::before_shim(config, &self.planned, &SharedData, self.now_ms);
        for &(index, event) in &self.pass.events {
            let counter = match event {
                Event::DeniedLocally => Counter::DeniedLocally,
                Event::DenyCacheHit => Counter::DenyCacheHits,
                Event::LeaseHit => Counter::LeaseHits,
            };
            filter.metrics.count(self.planned[index].rule_index, counter);
        }
        if self.pass.refused.is_some() || self.pass.to_shim.is_empty() {
            let results = self.pass.results.clone();
            let outcome = self.decide_known(&results);
            return self.apply(outcome);
        }
        let body = match serde_json::to_vec(&CheckRequest {
            checks: self.check_request(),
        }) {
            Ok(body) => body,
            Err(_) => {
                let outcome = self.on_shim_failure("cannot encode the check", false);
                return self.apply(outcome);
            }
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
        for &(index, _) in &self.pass.to_shim {
            filter
                .metrics
                .count(self.planned[index].rule_index, Counter::ShimCalls);
        }
        self.called_at_ms = self.now_ms;
        match hostcalls::dispatch_http_call(&shim.cluster, headers, Some(&body), Vec::new(), shim.timeout) {
            Ok(_token) => Action::Pause,
            Err(status) => {
                let outcome = self.on_shim_failure(
                    &format!("cannot call cluster {}: {status:?}", shim.cluster),
                    false,
                );
                self.apply(outcome)
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
