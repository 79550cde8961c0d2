//! The root context, one per plugin instance and worker: compiles the configuration in
//! `on_configure` (refusing a bad one, so Envoy refuses to load it), creates the slot
//! table and the worker's wake-up queue, and hands the calls' callbacks to the
//! [`Dispatcher`].

use super::dispatcher::Dispatcher;
use super::hostcalls::{log, plugin_configuration, register_shared_queue, set_tick_period, SharedData};
use super::http::HttpFilter;
use super::request_state::PendingRequest;
use super::stats::Stats;
use super::Worker;
use crate::config::FilterConfig;
use crate::local::create_slots;
use crate::settlement::BodyBudget;
use crate::skew_log::SkewLog;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use std::cell::RefCell;
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
        // A safety net only (see `Dispatcher::on_tick`).
        let tick = (config.shim.timeout / 2).max(Duration::from_millis(10));
        if let Err(error) = set_tick_period(tick) {
            log(LogLevel::Warn, &format!("cannot set the tick period: {error}"));
        }
        let timeout_ms = config.shim.timeout_ms();
        let dispatcher = Dispatcher::new(
            self.context_id,
            wake_queue,
            config.shim.calls_in_flight as usize,
            timeout_ms,
        );
        Ok(Worker {
            id: worker_id,
            stats: Stats::define(&config),
            body_budget: BodyBudget::new(config.cost_body_budget_bytes),
            config,
            dispatcher,
            skew_log: RefCell::new(SkewLog::default()),
        })
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
            worker.dispatcher.on_call_response(worker, token_id, body_size);
        }
    }

    fn on_done(&mut self) -> bool {
        if let Some(worker) = &self.worker {
            worker.dispatcher.fail_all(worker);
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

    fn on_queue_ready(&mut self, _queue_id: u32) {
        if let Some(worker) = &self.worker {
            worker.dispatcher.on_wake(worker);
        }
    }

    fn on_tick(&mut self) {
        if let Some(worker) = &self.worker {
            worker.dispatcher.on_tick(worker);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(HttpFilter {
            worker: Rc::clone(self.worker.as_ref()?),
            request: PendingRequest {
                context_id,
                state: Rc::default(),
            },
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
