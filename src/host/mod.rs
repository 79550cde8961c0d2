//! The proxy-wasm host layer: the only code that talks to Envoy, and as little as that
//! takes. Every host call goes through [`hostcalls`]; [`root`] is the root context (one
//! per plugin instance and worker), [`http`] the context of one request, [`dispatcher`]
//! the worker's batched calls to the shim and [`stats`] the stats Envoy shows. Deciding
//! is the pure [`RequestDecision`](crate::request::RequestDecision)'s for a request and
//! the pure [`DispatchState`](crate::dispatch::DispatchState)'s for a worker's calls;
//! this layer reads attributes, makes calls, applies outcomes and records events.

mod dispatcher;
mod hostcalls;
mod http;
mod request_state;
mod root;
mod skew;
mod stats;

use crate::config::FilterConfig;
use crate::events::Event;
use crate::local::LocalLayer;
use crate::settlement::BodyBudget;
use crate::skew_log::SkewLog;
use crate::stats::Count;
use dispatcher::Dispatcher;
use hostcalls::{log, SharedData};
use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;
use root::RateLimitRoot;
use skew::log_skew;
use stats::Stats;
use std::cell::RefCell;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(RateLimitRoot { context_id, worker: None })
    });
}}

/// What every context of one plugin instance on one worker shares.
pub struct Worker {
    /// Tells this worker's lease acquisitions from other workers' in shared data.
    id: u64,
    config: FilterConfig,
    stats: Stats,
    dispatcher: Dispatcher,
    /// What this worker's readers of response bodies may hold, together.
    body_budget: BodyBudget,
    /// What it has said about version skew with the shims, said once.
    skew_log: RefCell<SkewLog>,
}

impl Worker {
    /// The local layer as this worker sees it; `may_await_lease`: whether a request may
    /// wait for this worker's lease acquisition.
    fn local(&self, may_await_lease: bool) -> LocalLayer<'_, SharedData> {
        LocalLayer {
            config: &self.config,
            store: &SharedData,
            worker: self.id,
            may_await_lease,
        }
    }

    fn count(&self, counts: Vec<Count>) {
        for count in counts {
            self.stats.count(count);
        }
    }

    /// Counts and logs what a step of a request's decision reported.
    fn record(&self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Count(count) => self.stats.count(count),
                Event::ShadowRefusal(rule) => log(
                    LogLevel::Info,
                    &format!("shadow rule {rule} would refuse this request"),
                ),
                Event::ShimFailed(failure) => log(LogLevel::Warn, &format!("shim check failed: {failure}")),
                Event::Unsupported { rule, field } => {
                    let line = self.skew_log.borrow_mut().unsupported(&rule, &field);
                    log_skew(line);
                }
                Event::LeaseGranted(lease) => self.dispatcher.hold_lease(lease),
                Event::ReturnTokens(back) => self.dispatcher.give_back(back),
            }
        }
    }
}
