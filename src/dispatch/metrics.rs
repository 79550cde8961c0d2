//! The filter's stats, defined through the host: every [`Stat`] per rule
//! (`ratelimit.<rule>.<stat>`; Envoy's Wasm host shows them under the `wasmcustom.`
//! prefix), and histograms of where an exact check's time goes: how long a request
//! waited in the worker's queue for a call, a call's round trip (both in µs), and the
//! number of requests each call carried; and the returns and settlements lost with a
//! failed call.

use super::host::{Host, MetricKind};
use crate::config::FilterConfig;
use crate::stats::{Count, Stat};

/// The ids the host gave the stats; `None` where it refused to define one.
pub struct Metrics {
    /// Per rule, by [`Stat::index`].
    rules: Vec<[Option<u32>; Stat::ALL.len()]>,
    queued_us: Option<u32>,
    shim_call_us: Option<u32>,
    shim_batch_size: Option<u32>,
    adjustments_lost: Option<u32>,
}

impl Metrics {
    pub fn define(host: &impl Host, config: &FilterConfig) -> Metrics {
        let rules = config
            .rules
            .iter()
            .map(|rule| {
                Stat::ALL.map(|stat| {
                    host.define_metric(
                        MetricKind::Counter,
                        &format!("ratelimit.{}.{}", rule.name, stat.name()),
                    )
                })
            })
            .collect();
        Metrics {
            rules,
            queued_us: host.define_metric(MetricKind::Histogram, "ratelimit.queued_us"),
            shim_call_us: host.define_metric(MetricKind::Histogram, "ratelimit.shim_call_us"),
            shim_batch_size: host.define_metric(MetricKind::Histogram, "ratelimit.shim_batch_size"),
            adjustments_lost: host.define_metric(MetricKind::Counter, "ratelimit.adjustments_lost"),
        }
    }

    pub fn count(&self, host: &impl Host, count: Count) {
        let id = self
            .rules
            .get(count.rule_index)
            .and_then(|stats| stats.get(count.stat.index()))
            .copied()
            .flatten();
        if let Some(id) = id {
            host.add_to_metric(id, 1);
        }
    }

    pub fn waited_in_queue(&self, host: &impl Host, elapsed_us: u64) {
        if let Some(id) = self.queued_us {
            host.record_in_metric(id, elapsed_us);
        }
    }

    pub fn shim_call_took(&self, host: &impl Host, elapsed_us: u64) {
        if let Some(id) = self.shim_call_us {
            host.record_in_metric(id, elapsed_us);
        }
    }

    /// Returns (leased tokens, concurrency slots) and settlements that a failed call
    /// took with it: not retried, since the shim may have applied them before the answer
    /// was lost, and a second refund or charge would count twice.
    pub fn adjustments_lost(&self, host: &impl Host, count: usize) {
        if let (Some(id), 1..) = (self.adjustments_lost, count) {
            host.add_to_metric(id, count as u64);
        }
    }

    pub fn shim_call_carried(&self, host: &impl Host, requests: usize) {
        if let Some(id) = self.shim_batch_size {
            host.record_in_metric(id, requests as u64);
        }
    }
}
