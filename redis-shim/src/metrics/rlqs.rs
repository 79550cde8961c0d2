//! The quota service's metrics, in the shim's naming and rendered with the others on
//! `GET /metrics`: streams open, reports received, and tokens by where they went.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub struct RlqsMetrics {
    streams_open: AtomicI64,
    streams_refused: AtomicU64,
    reports: AtomicU64,
    buckets_refused: AtomicU64,
    /// Admissions Envoys reported.
    spent: AtomicU64,
    /// Tokens charged for grants.
    granted: AtomicU64,
    /// Reported admissions no grant covered, charged as debt.
    debt: AtomicU64,
    /// Unspent grants given back after their stream ended.
    released: AtomicU64,
    denied_all: AtomicU64,
    adjustments_lost: AtomicU64,
}

impl RlqsMetrics {
    /// Counts a stream open unless `max` already are (then counts it refused): the
    /// gauge is the bound's own count.
    pub fn open_stream(&self, max: usize) -> bool {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        if self.streams_open.fetch_add(1, Relaxed) >= max {
            self.streams_open.fetch_sub(1, Relaxed);
            self.streams_refused.fetch_add(1, Relaxed);
            return false;
        }
        true
    }
    pub fn stream_closed(&self) {
        self.streams_open.fetch_sub(1, Relaxed);
    }
    pub fn report(&self) {
        self.reports.fetch_add(1, Relaxed);
    }
    pub fn bucket_refused(&self) {
        self.buckets_refused.fetch_add(1, Relaxed);
    }
    pub fn spent(&self, tokens: u64) {
        self.spent.fetch_add(tokens, Relaxed);
    }
    pub fn granted(&self, tokens: u64) {
        self.granted.fetch_add(tokens, Relaxed);
    }
    pub fn debt(&self, tokens: u64) {
        self.debt.fetch_add(tokens, Relaxed);
    }
    pub fn released(&self, tokens: u64) {
        self.released.fetch_add(tokens, Relaxed);
    }
    pub fn denied_all(&self) {
        self.denied_all.fetch_add(1, Relaxed);
    }
    pub fn adjustment_lost(&self) {
        self.adjustments_lost.fetch_add(1, Relaxed);
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP rlshim_rlqs_streams_open StreamRateLimitQuotas streams open (--grpc-listen).\n# TYPE rlshim_rlqs_streams_open gauge\nrlshim_rlqs_streams_open {}",
            self.streams_open.load(Relaxed)
        );
        let counters = [
            (
                "streams_refused",
                "Streams refused past the bound.",
                &self.streams_refused,
            ),
            ("reports", "Usage reports received.", &self.reports),
            (
                "buckets_refused",
                "Buckets not tracked past a stream's bound.",
                &self.buckets_refused,
            ),
            (
                "deny_all",
                "DENY_ALL assignments: the counter had no token to grant.",
                &self.denied_all,
            ),
            (
                "adjustments_lost",
                "Debts or returns Redis failed to apply.",
                &self.adjustments_lost,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP rlshim_rlqs_{name}_total {help}\n# TYPE rlshim_rlqs_{name}_total counter\nrlshim_rlqs_{name}_total {}",
                value.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP rlshim_rlqs_tokens_total Tokens of RLQS buckets: spent (reported admitted), granted, debt (admitted beyond any grant, charged afterwards), released (unspent grants given back).\n# TYPE rlshim_rlqs_tokens_total counter"
        );
        for (kind, value) in [
            ("spent", &self.spent),
            ("granted", &self.granted),
            ("debt", &self.debt),
            ("released", &self.released),
        ] {
            let _ = writeln!(
                out,
                "rlshim_rlqs_tokens_total{{kind=\"{kind}\"}} {}",
                value.load(Relaxed)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_past_the_bound_are_refused_and_counted() {
        let metrics = RlqsMetrics::default();
        assert!(metrics.open_stream(2) && metrics.open_stream(2));
        assert!(!metrics.open_stream(2));
        metrics.stream_closed();
        assert!(metrics.open_stream(2));
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains("rlshim_rlqs_streams_open 2\n"), "{text}");
        assert!(text.contains("rlshim_rlqs_streams_refused_total 1\n"), "{text}");
    }
}
