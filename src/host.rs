//! The proxy-wasm host layer: the only code that talks to Envoy.
//!
//! It reads the request's attributes, plans the checks, runs the local layer against
//! shared data, queues what is left for the shim and pauses the request. The worker's
//! root context sends the queue as one batched `dispatch_http_call` (see [`batch`]) and,
//! when the answer (or the call's failure or timeout) arrives, applies each request's
//! pure [`Outcome`] in that request's context (`set_effective_context`). The root owns
//! the calls because Envoy cancels a context's calls when its stream ends, and the SDK
//! delivers an answer to the context that was running when the call was made: only a
//! root callback can start a call whose answer outlives any one request.
//!
//! Host calls go through `hostcalls::*`, whose `Result`s are handled here instead of the
//! SDK trait defaults that `unwrap()` them: a panic would kill the VM for every request
//! on this worker.

use crate::batch::{Batcher, Call};
use crate::config::{FailureMode, FilterConfig, RuleFailureMode};
use crate::keys::RequestAttributes;
use crate::local::{self, Event, FailureVerdict, LocalPass, SlotStore, StoreError};
use crate::plan::{plan, PlannedCheck};
use crate::response::{self, decide, shadow_refusals, Applied, Headers, Outcome};
use crate::wire::{
    BatchAnswer, BatchCheckRequest, BatchCheckResponse, Check, CheckRequest, CheckResponse, CheckResult,
    CHECK_BATCH_PATH, TOKEN_HEADER,
};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::{Rc, Weak};
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(RateLimitRoot { context_id, filter: None })
    });
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
/// (shown under the `wasmcustom.` prefix), plus a histogram of shim call latency and
/// one of the number of requests each call carried.
struct Metrics {
    rules: Vec<RuleMetrics>,
    shim_latency_ms: Option<u32>,
    shim_batch_size: Option<u32>,
}

#[derive(Clone, Copy)]
enum Counter {
    Allowed,
    Denied,
    ShadowDenied,
    DeniedLocally,
    DenyCacheHits,
    LeaseHits,
    ShimChecks,
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
    (Counter::ShimChecks, "shim_checks"),
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
            shim_batch_size: hostcalls::define_metric(MetricType::Histogram, "ratelimit.shim_batch_size")
                .ok(),
        }
    }

    fn count(&self, rule_index: usize, counter: Counter) {
        if let Some(Some(id)) = self.rules.get(rule_index).map(|m| m.0[counter as usize]) {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    fn record(metric: Option<u32>, value: u64) {
        if let Some(id) = metric {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// What every context of one plugin instance on this worker shares.
struct Filter {
    config: FilterConfig,
    metrics: Metrics,
    /// The root context, which makes every shim call.
    root_context_id: u32,
    /// The shared queue through which a request wakes the root to send the batch.
    wake_queue: u32,
    batcher: RefCell<Batcher<Member>>,
}

/// A request in the batcher: where to apply the answer, and what to ask.
struct Member {
    context_id: u32,
    /// Dead once the request's stream is gone; the answer is then dropped.
    state: Weak<RefCell<RequestState>>,
    checks: Vec<Check>,
}

impl Filter {
    /// Sends what waits, call by call, while calls may start. Runs in a root callback,
    /// so the calls belong to the root context.
    fn dispatch_waiting(&self) {
        loop {
            let now = now_ms();
            let next = self
                .batcher
                .borrow_mut()
                .next(now, |member| member.state.strong_count() > 0);
            let expired = !next.expired.is_empty();
            for member in next.expired {
                self.finish(&member, now, Err(("queued past the timeout".into(), true)));
            }
            let Some((members, timeout_ms)) = next.batch else {
                if expired {
                    continue;
                }
                return;
            };
            // Applying an expired request switched the effective context; the call must
            // belong to the root.
            let _ = hostcalls::set_effective_context(self.root_context_id);
            self.send(members, now, timeout_ms);
        }
    }

    fn send(&self, mut members: Vec<Member>, now: u64, timeout_ms: u64) {
        let batch = BatchCheckRequest {
            requests: members
                .iter_mut()
                .map(|member| CheckRequest {
                    checks: std::mem::take(&mut member.checks),
                })
                .collect(),
        };
        let sent = serde_json::to_vec(&batch)
            .map_err(|e| format!("cannot encode the checks: {e}"))
            .and_then(|body| {
                let shim = &self.config.shim;
                let mut headers = vec![
                    (":method", "POST"),
                    (":path", CHECK_BATCH_PATH),
                    (":authority", shim.authority.as_str()),
                    ("content-type", "application/json"),
                ];
                if let Some(token) = &shim.token {
                    headers.push((TOKEN_HEADER, token.as_str()));
                }
                let timeout = Duration::from_millis(timeout_ms);
                hostcalls::dispatch_http_call(&shim.cluster, headers, Some(&body), Vec::new(), timeout)
                    .map_err(|status| format!("cannot call cluster {}: {status:?}", shim.cluster))
            });
        match sent {
            Ok(token) => {
                Metrics::record(self.metrics.shim_batch_size, members.len() as u64);
                self.batcher.borrow_mut().sent(
                    token,
                    Call {
                        members,
                        sent_at_ms: now,
                    },
                );
            }
            Err(reason) => {
                for member in &members {
                    self.finish(member, now, Err((reason.clone(), false)));
                }
            }
        }
    }

    /// Applies the shim's answer for one request, or the failure of its call (with
    /// whether it timed out), in the request's own context, then resumes or answers it.
    fn finish(&self, member: &Member, now: u64, answer: Result<CheckResponse, (String, bool)>) {
        let Some(state) = member.state.upgrade() else {
            return;
        };
        if hostcalls::set_effective_context(member.context_id).is_err() {
            return;
        }
        let action = {
            let mut state = state.borrow_mut();
            state.now_ms = now;
            let outcome = match answer {
                Ok(answer) => state.on_answer(self, &answer),
                Err((reason, timed_out)) => state.on_shim_failure(self, &reason, timed_out),
            };
            state.apply(outcome)
        };
        if let Action::Continue = action {
            if let Err(status) = hostcalls::resume_http_request() {
                log(
                    LogLevel::Error,
                    &format!("ratelimit-wasm: could not resume request: {status:?}"),
                );
            }
        }
    }

    /// Queues a request for the shim and, when a call may start, wakes the root.
    fn submit(&self, member: Member, deadline_ms: u64) {
        let wake = self.batcher.borrow_mut().push(member, deadline_ms);
        if wake {
            if let Err(status) = hostcalls::enqueue_shared_queue(self.wake_queue, Some(b"1")) {
                // The root's tick sends it (or fails it past its deadline) instead.
                self.batcher.borrow_mut().woken();
                log(
                    LogLevel::Warn,
                    &format!("ratelimit-wasm: cannot wake the worker's dispatcher: {status:?}"),
                );
            }
        }
    }
}

/// The shim's answer to a batch call, one entry per request sent; or why there is none,
/// and whether that is the call's timeout.
fn read_batch_answer(body_size: usize, expected: usize) -> Result<Vec<BatchAnswer>, (String, bool)> {
    let status = header_value(MapType::HttpCallResponseHeaders, ":status")
        .ok_or(("no response (the call failed)".to_string(), false))?;
    if status != "200" {
        // Envoy answers a call that outlives its timeout with its own 504 (and a refused
        // or reset one with 503); the shim itself never sends 504.
        return Err((format!("status {status}"), status == "504"));
    }
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
        .ok()
        .flatten()
        .unwrap_or_default();
    let answer: BatchCheckResponse =
        serde_json::from_slice(&body).map_err(|e| (format!("unreadable answer: {e}"), false))?;
    if answer.responses.len() != expected {
        return Err(("answer does not match the request".into(), false));
    }
    Ok(answer.responses)
}

/// One per plugin instance and worker: owns the compiled configuration and the calls.
struct RateLimitRoot {
    context_id: u32,
    filter: Option<Rc<Filter>>,
}

impl Context for RateLimitRoot {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(filter) = self.filter.clone() else {
            return;
        };
        let Some(call) = filter.batcher.borrow_mut().answered(token_id) else {
            return;
        };
        let now = now_ms();
        let elapsed_ms = now.saturating_sub(call.sent_at_ms);
        Metrics::record(filter.metrics.shim_latency_ms, elapsed_ms);
        // Read before switching to the requests' contexts: the answer is the root's.
        match read_batch_answer(body_size, call.members.len()) {
            Ok(answers) => {
                for (member, answer) in call.members.iter().zip(answers) {
                    let answer = match answer {
                        BatchAnswer::Decided(answer) => Ok(answer),
                        BatchAnswer::Failed(reason) => Err((format!("shim: {reason}"), false)),
                    };
                    filter.finish(member, now, answer);
                }
            }
            Err((reason, timed_out)) => {
                for member in &call.members {
                    filter.finish(member, now, Err((reason.clone(), timed_out)));
                }
            }
        }
        let _ = hostcalls::set_effective_context(self.context_id);
        filter.dispatch_waiting();
    }

    /// The plugin is going away (reconfigured or removed), and with the root its calls:
    /// no request may stay paused behind them.
    fn on_done(&mut self) -> bool {
        if let Some(filter) = &self.filter {
            let now = now_ms();
            let left = filter.batcher.borrow_mut().take_all();
            for member in &left {
                filter.finish(member, now, Err(("the plugin is shutting down".into(), false)));
            }
        }
        true
    }
}

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
        // Queue names are global to the Envoy: each worker's VM needs its own, or one
        // worker's wake-ups would reach another.
        let queue_name = format!(
            "ratelimit-wasm.wake.{:016x}",
            RandomState::new().hash_one(self.context_id)
        );
        let Ok(wake_queue) = hostcalls::register_shared_queue(&queue_name) else {
            log(
                LogLevel::Error,
                "ratelimit-wasm: cannot register the worker's shared queue",
            );
            return false;
        };
        // A safety net only: requests that wait without a wake-up (none should) are sent
        // or failed within about one timeout.
        let tick = (config.shim.timeout / 2).max(Duration::from_millis(10));
        let _ = hostcalls::set_tick_period(tick);
        log(
            LogLevel::Info,
            &format!("ratelimit-wasm: configured with {} rule(s)", config.rules.len()),
        );
        let metrics = Metrics::define(&config);
        let batcher = RefCell::new(Batcher::new(
            config.shim.calls_in_flight as usize,
            config.shim.timeout.as_millis() as u64,
        ));
        self.filter = Some(Rc::new(Filter {
            config,
            metrics,
            root_context_id: self.context_id,
            wake_queue,
            batcher,
        }));
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
        if let Some(filter) = &self.filter {
            filter.batcher.borrow_mut().woken();
            filter.dispatch_waiting();
        }
    }

    fn on_tick(&mut self) {
        if let Some(filter) = &self.filter {
            if filter.batcher.borrow().has_waiting() {
                // Were a wake-up lost, the pending flag would hold back every later one.
                filter.batcher.borrow_mut().woken();
                filter.dispatch_waiting();
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let filter = self.filter.clone()?;
        Some(Box::new(RateLimitRequest {
            context_id,
            filter,
            state: Rc::new(RefCell::new(RequestState {
                planned: Vec::new(),
                pass: LocalPass::default(),
                now_ms: 0,
                response_headers: Vec::new(),
            })),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One per HTTP request.
struct RateLimitRequest {
    context_id: u32,
    filter: Rc<Filter>,
    /// Shared with the batcher while the request waits for the shim.
    state: Rc<RefCell<RequestState>>,
}

/// A request's decision in progress.
struct RequestState {
    /// Every rule's check for this request.
    planned: Vec<PlannedCheck>,
    /// What the local layer decided, and which checks went to the shim.
    pass: LocalPass,
    /// The host's wall clock, read once per callback: a host call is not free.
    now_ms: u64,
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

impl RequestState {
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
    fn decide_known(&self, filter: &Filter, results: &[Option<CheckResult>]) -> Outcome {
        let config = &filter.config;
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
        for ((index, result), (rule, _)) in known.iter().zip(&applied) {
            let rule_index = self.planned[*index].rule_index;
            let counter = match (rule.shadow, result.allowed, &outcome) {
                (true, false, _) => Counter::ShadowDenied,
                (false, false, _) => Counter::Denied,
                (_, true, Outcome::Allow { .. }) => Counter::Allowed,
                (_, true, Outcome::Reply(_)) => continue,
            };
            filter.metrics.count(rule_index, counter);
        }
        outcome
    }

    /// The shim gave no usable answer: each pending rule's failure mode decides.
    fn on_shim_failure(&mut self, filter: &Filter, reason: &str, timed_out: bool) -> Outcome {
        log(
            LogLevel::Warn,
            &format!("ratelimit-wasm: shim check failed: {reason}"),
        );
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
                self.decide_known(filter, &results)
            }
        }
    }

    fn on_answer(&mut self, filter: &Filter, answer: &CheckResponse) -> Outcome {
        match local::after_answer(
            &filter.config,
            &self.planned,
            &SharedData,
            self.now_ms,
            &mut self.pass,
            answer,
        ) {
            Some(merged) => {
                let results: Vec<Option<CheckResult>> = merged.results.into_iter().map(Some).collect();
                self.decide_known(filter, &results)
            }
            None => self.on_shim_failure(filter, "answer does not match the request", false),
        }
    }

    fn checks_for_shim(&self) -> Vec<Check> {
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

impl Context for RateLimitRequest {}

impl HttpContext for RateLimitRequest {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let filter = Rc::clone(&self.filter);
        let config = &filter.config;
        let request = HostRequest {
            jwt_payload_in_metadata: &config.jwt_payload_in_metadata,
        };
        let mut state = self.state.borrow_mut();
        state.planned = plan(config, &request);
        if state.planned.is_empty() {
            return Action::Continue;
        }
        state.now_ms = now_ms();
        state.pass = local::before_shim(config, &state.planned, &SharedData, state.now_ms);
        for &(index, event) in &state.pass.events {
            let counter = match event {
                Event::DeniedLocally => Counter::DeniedLocally,
                Event::DenyCacheHit => Counter::DenyCacheHits,
                Event::LeaseHit => Counter::LeaseHits,
            };
            filter.metrics.count(state.planned[index].rule_index, counter);
        }
        if state.pass.refused.is_some() || state.pass.to_shim.is_empty() {
            let results = state.pass.results.clone();
            let outcome = state.decide_known(&filter, &results);
            return state.apply(outcome);
        }
        for &(index, _) in &state.pass.to_shim {
            filter
                .metrics
                .count(state.planned[index].rule_index, Counter::ShimChecks);
        }
        let member = Member {
            context_id: self.context_id,
            state: Rc::downgrade(&self.state),
            checks: state.checks_for_shim(),
        };
        let deadline_ms = state.now_ms + config.shim.timeout.as_millis() as u64;
        filter.submit(member, deadline_ms);
        Action::Pause
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let headers = std::mem::take(&mut self.state.borrow_mut().response_headers);
        for (name, value) in headers {
            let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, &name, &value);
        }
        Action::Continue
    }
}
