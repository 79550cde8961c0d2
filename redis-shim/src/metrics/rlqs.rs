//! The quota service's metrics, in the shim's naming and rendered with the others on
//! `GET /metrics`: streams open, reports received, what they reported, the assignments
//! sent, and the re-balances pushed to other Envoys' streams.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// The kinds of assignment, as `rlshim_rlqs_assignments_total{kind}` names them.
const ASSIGNMENT_KINDS: [&str; 3] = ["token_bucket", "allow_all", "abandon"];

#[derive(Default)]
pub struct RlqsMetrics {
    streams_open: AtomicI64,
    streams_refused: AtomicU64,
    reports: AtomicU64,
    buckets_refused: AtomicU64,
    /// Requests Envoys reported allowed (charged to the counters) and denied.
    allowed: AtomicU64,
    denied: AtomicU64,
    /// By [`ASSIGNMENT_KINDS`], answering reports.
    assignments: [AtomicU64; 3],
    /// Pool re-balances that changed other Envoys' shares.
    rebalances: AtomicU64,
    /// Assignments pushed on another Envoy's stream by a re-balance.
    pushed: AtomicU64,
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
    pub fn reported(&self, allowed: u64, denied: u64) {
        self.allowed.fetch_add(allowed, Relaxed);
        self.denied.fetch_add(denied, Relaxed);
    }
    /// An assignment of `kind` (one of [`ASSIGNMENT_KINDS`]) answering a report.
    pub fn assigned(&self, kind: &str) {
        if let Some(i) = ASSIGNMENT_KINDS.iter().position(|k| *k == kind) {
            self.assignments[i].fetch_add(1, Relaxed);
        }
    }
    pub fn rebalanced(&self) {
        self.rebalances.fetch_add(1, Relaxed);
    }
    pub fn pushed(&self) {
        self.pushed.fetch_add(1, Relaxed);
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
                "rebalances",
                "Re-balances of a counter's shares that changed other Envoys' assignments.",
                &self.rebalances,
            ),
            (
                "pushed",
                "Assignments pushed on an Envoy's stream by another Envoy's report.",
                &self.pushed,
            ),
            (
                "adjustments_lost",
                "Reported admissions Redis failed to charge.",
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
            "# HELP rlshim_rlqs_requests_total Requests of RLQS buckets as Envoys reported them: allowed (charged to the counter) or denied.\n# TYPE rlshim_rlqs_requests_total counter"
        );
        for (kind, value) in [("allowed", &self.allowed), ("denied", &self.denied)] {
            let _ = writeln!(
                out,
                "rlshim_rlqs_requests_total{{kind=\"{kind}\"}} {}",
                value.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP rlshim_rlqs_assignments_total Assignments answering reports: token_bucket (a share of the rate), allow_all, abandon.\n# TYPE rlshim_rlqs_assignments_total counter"
        );
        for (kind, value) in ASSIGNMENT_KINDS.iter().zip(&self.assignments) {
            let _ = writeln!(
                out,
                "rlshim_rlqs_assignments_total{{kind=\"{kind}\"}} {}",
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
        metrics.assigned("token_bucket");
        metrics.assigned("nonsense");
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains("rlshim_rlqs_streams_open 2\n"), "{text}");
        assert!(text.contains("rlshim_rlqs_streams_refused_total 1\n"), "{text}");
        assert!(
            text.contains("rlshim_rlqs_assignments_total{kind=\"token_bucket\"} 1\n"),
            "{text}"
        );
    }
}
