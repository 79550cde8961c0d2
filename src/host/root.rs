//! The root context, one per plugin instance and worker: compiles the configuration in
//! `on_configure` (refusing a bad one, so Envoy refuses to load it), creates the slot
//! table and the worker's wake-up queue, and hands the calls' callbacks to the
//! [`Worker`].

use super::hostcalls::{
    drain_shared_queue, header, http_call_response_body, log, plugin_configuration, register_shared_queue,
    set_tick_period, SharedData,
};
use super::http::HttpFilter;
use super::wasm_host::{WasmHost, Worker};
use crate::config::FilterConfig;
use crate::dispatch::paused::PendingRequest;
use crate::dispatch::rounds::CallAnswer;
use crate::local::create_slots;
use crate::wire::VERSION_HEADER;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel, MapType};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;
use std::time::Duration;

pub struct RateLimitRoot {
    pub context_id: u32,
    pub worker: Option<Rc<Worker>>,
}

impl RateLimitRoot {
    fn configure(&self) -> Result<Worker, String> {
        let config = FilterConfig::from_json(&plugin_configuration())
            .map_err(|error| format!("invalid plugin configuration: {error}"))?;
        create_slots(&SharedData, config.local_slots)
            .map_err(|_| "cannot create the local slot table in shared data".to_string())?;
        // Context ids repeat across workers' VMs; a random id tells this worker apart in
        // the names and the shared data that are global to the Envoy (its wake-up queue,
        // its lease acquisitions). Never 0, which no acquisition holds.
        let worker_id = RandomState::new().hash_one(self.context_id) | 1;
        let queue_name = format!("ratelimit-wasm.wake.{worker_id:016x}");
        let wake_queue = register_shared_queue(&queue_name)
            .map_err(|error| format!("cannot register the worker's shared queue: {error}"))?;
        // A safety net only (see `Worker::on_tick`).
        let tick = (config.shim.timeout / 2).max(Duration::from_millis(10));
        if let Err(error) = set_tick_period(tick) {
            log(LogLevel::Warn, &format!("cannot set the tick period: {error}"));
        }
        let host = WasmHost {
            root_id: self.context_id,
            wake_queue,
        };
        Ok(Worker::new(host, worker_id, config))
    }
}

impl Context for RateLimitRoot {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(worker) = &self.worker {
            // Read before switching to the requests' contexts: the answer is the root's.
            let status = header(MapType::HttpCallResponseHeaders, ":status");
            let shim_version = header(MapType::HttpCallResponseHeaders, VERSION_HEADER);
            let body = http_call_response_body(body_size);
            let answer = CallAnswer {
                status: status.as_deref(),
                shim_version: shim_version.as_deref(),
                body: &body,
            };
            worker.on_call_response(token_id, answer);
        }
    }

    fn on_done(&mut self) -> bool {
        if let Some(worker) = &self.worker {
            worker.fail_all();
        }
        true
    }
}

impl RootContext for RateLimitRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        match self.configure() {
            Ok(worker) => {
                log(
                    LogLevel::Info,
                    &format!(
                        "ratelimit-wasm {}: configured with {} rule(s)",
                        env!("CARGO_PKG_VERSION"),
                        worker.config.rules.len()
                    ),
                );
                for warning in &worker.config.warnings {
                    log(LogLevel::Warn, &format!("plugin configuration: {warning}"));
                }
                self.worker = Some(Rc::new(worker));
                true
            }
            Err(reason) => {
                log(LogLevel::Error, &reason);
                false
            }
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        // A wake-up says "look", not what to look at.
        drain_shared_queue(queue_id);
        if let Some(worker) = &self.worker {
            worker.on_wake();
        }
    }

    fn on_tick(&mut self) {
        if let Some(worker) = &self.worker {
            worker.on_tick();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(HttpFilter {
            worker: Rc::clone(self.worker.as_ref()?),
            request: PendingRequest::new(context_id),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
