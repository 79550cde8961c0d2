//! A plugin configuration as Envoy loads it (on its main thread): the same JSON as the
//! Wasm filter's, compiled and validated by the same code (`FilterConfig::from_json`),
//! a bad one refused with the error naming its field; and the worker each worker thread
//! runs for it, created on the thread's first stream (a worker is single-threaded: it
//! lives in a thread-local map). A compiled `FilterConfig` shares its rules through
//! `Rc`, so it never crosses threads: what is shared is the validated JSON, and each
//! worker thread compiles its own, as each Wasm VM does in `on_configure`.

use crate::abi;
use crate::envoy::{self, EnvoyConfig};
use crate::main_thread::MainThreadCalls;
use crate::native_host::{NativeHost, Worker};
use crate::slots::ProcessSlots;
use crate::stats::Defined;
use ratelimit_wasm::config::{CostSource, FilterConfig};
use ratelimit_wasm::local::create_slots;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// One loaded plugin configuration, shared by every worker thread.
pub struct ModuleConfig {
    id: u64,
    /// The plugin configuration's JSON, known to compile.
    json: Vec<u8>,
    /// Its stats, defined on Envoy's configuration object.
    stats: Arc<Defined>,
    /// The calls its workers have no stream to carry.
    pub main_thread: Arc<MainThreadCalls>,
    /// Envoy dropped it (reconfigured or removed): no new stream meets it.
    closed: AtomicBool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Compiles the plugin configuration and defines its stats on `config_envoy`; the error
/// names what is wrong.
pub fn load(config_envoy: EnvoyConfig, bytes: &[u8]) -> Result<ModuleConfig, String> {
    let config =
        FilterConfig::from_json(bytes).map_err(|error| format!("invalid plugin configuration: {error}"))?;
    refuse_what_this_host_cannot_read(&config)
        .map_err(|error| format!("invalid plugin configuration: {error}"))?;
    create_slots(&ProcessSlots, config.local_slots)
        .map_err(|_| "cannot create the local slot table".to_string())?;
    envoy::log(
        abi::LOG_INFO,
        &format!(
            "ratelimit-native {}: configured with {} rule(s)",
            env!("CARGO_PKG_VERSION"),
            config.rules.len()
        ),
    );
    for warning in &config.warnings {
        envoy::log(abi::LOG_WARN, &format!("plugin configuration: {warning}"));
    }
    Ok(ModuleConfig {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        json: bytes.to_vec(),
        stats: Arc::new(Defined::define(config_envoy, &config)),
        main_thread: Arc::new(MainThreadCalls::new(config_envoy.new_scheduler())),
        closed: AtomicBool::new(false),
    })
}

/// A cost from Envoy's token-usage metadata: the AI protocol manager publishes it as
/// typed filter metadata, which the ABI cannot read (only dynamic metadata's values),
/// so every response would be charged its `unreported_cost`.
fn refuse_what_this_host_cannot_read(config: &FilterConfig) -> Result<(), String> {
    for (index, rule) in config.rules.iter().enumerate() {
        let source = rule.cost_from_response.as_ref().map(|cost| &cost.source);
        if matches!(source, Some(CostSource::TokenUsage(_))) {
            return Err(format!(
                "rules[{index}].cost_from_response.token_usage: the dynamic module cannot read Envoy's typed token-usage metadata; use the Wasm filter, or json_fields"
            ));
        }
    }
    Ok(())
}

impl ModuleConfig {
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.main_thread.close();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// A configuration's id to its worker on this thread, with the configuration it serves.
type Workers = HashMap<u64, (Arc<ModuleConfig>, Rc<Worker>)>;

thread_local! {
    static WORKERS: RefCell<Workers> = RefCell::new(HashMap::new());
}

/// Tells apart the lease acquisitions of every worker of the process; odd, so never 0.
static NEXT_WORKER: AtomicU64 = AtomicU64::new(0);

/// This thread's worker for `config` (`None` only if its JSON, which compiled on the
/// main thread, does not compile here). Workers of closed configurations are forgotten
/// here; their streams still in flight keep them until they end.
pub fn worker_for(config: &Arc<ModuleConfig>) -> Option<Rc<Worker>> {
    WORKERS.with(|workers| {
        let mut workers = workers.borrow_mut();
        workers.retain(|_, (config, _)| !config.is_closed());
        if let Some((_, worker)) = workers.get(&config.id) {
            return Some(Rc::clone(worker));
        }
        let compiled = FilterConfig::from_json(&config.json).ok()?;
        let id = (NEXT_WORKER.fetch_add(1, Ordering::Relaxed) << 1) | 1;
        let host = NativeHost::new(Arc::clone(&config.stats), Arc::clone(&config.main_thread), id);
        let worker = Rc::new(Worker::new(host, id, compiled));
        workers.insert(config.id, (Arc::clone(config), Rc::clone(&worker)));
        Some(worker)
    })
}
