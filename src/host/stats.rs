//! The filter's stats in Envoy: every [`Stat`] per rule (`ratelimit.<rule>.<stat>`,
//! shown under the `wasmcustom.` prefix), and histograms of where an exact check's time
//! goes: how long a request waited in the worker's queue for a call, a call's round trip
//! (both in µs), and the number of requests each call carried.

use super::hostcalls::{define_metric, increment_metric, record_metric};
use crate::config::FilterConfig;
use crate::stats::{Count, Stat};
use proxy_wasm::types::MetricType;

pub struct Stats {
    /// Per rule, by [`Stat::index`]; `None` where the host refused to define one.
    rules: Vec<[Option<u32>; Stat::ALL.len()]>,
    queued_us: Option<u32>,
    shim_call_us: Option<u32>,
    shim_batch_size: Option<u32>,
}

impl Stats {
    pub fn define(config: &FilterConfig) -> Stats {
        let rules = config
            .rules
            .iter()
            .map(|rule| {
                Stat::ALL.map(|stat| {
                    define_metric(
                        MetricType::Counter,
                        &format!("ratelimit.{}.{}", rule.name, stat.name()),
                    )
                    .ok()
                })
            })
            .collect();
        Stats {
            rules,
            queued_us: define_metric(MetricType::Histogram, "ratelimit.queued_us").ok(),
            shim_call_us: define_metric(MetricType::Histogram, "ratelimit.shim_call_us").ok(),
            shim_batch_size: define_metric(MetricType::Histogram, "ratelimit.shim_batch_size").ok(),
        }
    }

    pub fn count(&self, count: Count) {
        let id = self
            .rules
            .get(count.rule_index)
            .and_then(|stats| stats.get(count.stat.index()))
            .copied()
            .flatten();
        if let Some(id) = id {
            increment_metric(id);
        }
    }

    pub fn waited_in_queue(&self, elapsed_us: u64) {
        if let Some(id) = self.queued_us {
            record_metric(id, elapsed_us);
        }
    }

    pub fn shim_call_took(&self, elapsed_us: u64) {
        if let Some(id) = self.shim_call_us {
            record_metric(id, elapsed_us);
        }
    }

    pub fn shim_call_carried(&self, requests: usize) {
        if let Some(id) = self.shim_batch_size {
            record_metric(id, requests as u64);
        }
    }
}
