//! The filter's stats as Envoy stats. The ABI defines a stat only on the configuration
//! (on the main thread, while Envoy loads it), so every stat the worker will ask for is
//! defined there, by name: each rule's counters and the worker's histograms, the names
//! `ratelimit_wasm::dispatch::metrics` gives them. A worker thread's `define_metric`
//! then only looks its name up ([`Defined::find`]); a name not defined here is a stat
//! not kept, never an error. Adding to a stat goes through a live stream's filter.

use crate::abi::{self, ModuleBuffer};
use crate::envoy::{EnvoyConfig, Stream};
use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::dispatch::host::MetricKind;
use ratelimit_wasm::stats::Stat;

/// Every stat defined for one configuration: its name, kind and Envoy's id.
#[derive(Default)]
pub struct Defined {
    stats: Vec<(String, MetricKind, usize)>,
}

/// The stats the worker defines for `config` (as `Metrics::define` names them).
fn names(config: &FilterConfig) -> Vec<(MetricKind, String)> {
    let mut names: Vec<(MetricKind, String)> = config
        .rules
        .iter()
        .flat_map(|rule| {
            Stat::ALL.map(|stat| {
                let name = format!("ratelimit.{}.{}", rule.name, stat.name());
                (MetricKind::Counter, name)
            })
        })
        .collect();
    for histogram in [
        "ratelimit.queued_us",
        "ratelimit.shim_call_us",
        "ratelimit.shim_batch_size",
    ] {
        names.push((MetricKind::Histogram, histogram.to_string()));
    }
    names.push((MetricKind::Counter, "ratelimit.adjustments_lost".to_string()));
    names
}

impl Defined {
    /// Defines every stat of `config` on Envoy's configuration object; those Envoy
    /// refuses are left out.
    pub fn define(config_envoy: EnvoyConfig, config: &FilterConfig) -> Defined {
        let stats = names(config)
            .into_iter()
            .filter_map(|(kind, name)| {
                let mut id = 0usize;
                let buffer = ModuleBuffer::of(name.as_bytes());
                // SAFETY: Envoy's configuration object, in its `config_new` hook; the
                // name is borrowed for the call, no labels.
                let result = unsafe {
                    match kind {
                        MetricKind::Counter => {
                            abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                                config_envoy.0,
                                buffer,
                                std::ptr::null_mut(),
                                0,
                                &mut id,
                            )
                        }
                        MetricKind::Histogram => {
                            abi::envoy_dynamic_module_callback_http_filter_config_define_histogram(
                                config_envoy.0,
                                buffer,
                                std::ptr::null_mut(),
                                0,
                                &mut id,
                            )
                        }
                    }
                };
                (result == abi::METRICS_SUCCESS).then_some((name, kind, id))
            })
            .collect();
        Defined { stats }
    }

    /// The index of the stat `name` of that kind, if it was defined.
    pub fn find(&self, kind: MetricKind, name: &str) -> Option<u32> {
        let index = self.stats.iter().position(|(n, k, _)| *k == kind && n == name)?;
        u32::try_from(index).ok()
    }

    /// Adds to a counter or records in a histogram, through `stream`.
    pub fn add(&self, stream: Stream, index: u32, value: u64) {
        let Some((_, kind, id)) = usize::try_from(index)
            .ok()
            .and_then(|index| self.stats.get(index))
        else {
            return;
        };
        // SAFETY: a live stream's filter, created from the configuration these ids
        // were defined on; no labels.
        unsafe {
            match kind {
                MetricKind::Counter => {
                    abi::envoy_dynamic_module_callback_http_filter_increment_counter(
                        stream.0,
                        *id,
                        std::ptr::null_mut(),
                        0,
                        value,
                    );
                }
                MetricKind::Histogram => {
                    abi::envoy_dynamic_module_callback_http_filter_record_histogram_value(
                        stream.0,
                        *id,
                        std::ptr::null_mut(),
                        0,
                        value,
                    );
                }
            }
        }
    }
}
