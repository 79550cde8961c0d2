//! The filter's stats in Envoy: every [`Stat`] per rule (`ratelimit.<rule>.<stat>`,
//! shown under the `wasmcustom.` prefix), a histogram of shim call latency and one of
//! the number of requests each call carried.

use super::hostcalls::{define_metric, increment_metric, record_metric};
use crate::config::FilterConfig;
use crate::stats::{Count, Stat};
use proxy_wasm::types::MetricType;

pub struct Stats {
    /// Per rule, by [`Stat::index`]; `None` where the host refused to define one.
    rules: Vec<[Option<u32>; Stat::ALL.len()]>,
    shim_call_ms: Option<u32>,
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
            shim_call_ms: define_metric(MetricType::Histogram, "ratelimit.shim_call_ms").ok(),
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

    pub fn shim_call_took(&self, elapsed_ms: u64) {
        if let Some(id) = self.shim_call_ms {
            record_metric(id, elapsed_ms);
        }
    }

    pub fn shim_call_carried(&self, requests: usize) {
        if let Some(id) = self.shim_batch_size {
            record_metric(id, requests as u64);
        }
    }
}
