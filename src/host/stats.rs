//! The filter's stats in Envoy: every [`Stat`] per rule (`ratelimit.<rule>.<stat>`,
//! shown under the `wasmcustom.` prefix), and histograms of where an exact check's time
//! goes: how long a request waited in the worker's queue for a call, a call's round trip
//! (both in µs), and the number of requests each call carried; and the returns and
//! settlements lost with a failed call.

use super::hostcalls::{define_metric, increment_metric, increment_metric_by, record_metric};
use crate::config::FilterConfig;
use crate::stats::{Count, Stat};
use proxy_wasm::types::MetricType;

pub struct Stats {
    /// Per rule, by [`Stat::index`]; `None` where the host refused to define one.
    rules: Vec<[Option<u32>; Stat::ALL.len()]>,
    queued_us: Option<u32>,
    shim_call_us: Option<u32>,
    shim_batch_size: Option<u32>,
    adjustments_lost: Option<u32>,
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
            adjustments_lost: define_metric(MetricType::Counter, "ratelimit.adjustments_lost").ok(),
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

    /// Returns (leased tokens, concurrency slots) and settlements that a failed call
    /// took with it: not retried, since the shim may have applied them before the answer
    /// was lost, and a second refund or charge would count twice.
    pub fn adjustments_lost(&self, count: usize) {
        if let (Some(id), 1..) = (self.adjustments_lost, count) {
            increment_metric_by(id, count as u64);
        }
    }

    pub fn shim_call_carried(&self, requests: usize) {
        if let Some(id) = self.shim_batch_size {
            record_metric(id, requests as u64);
        }
    }
}
