//! The replication between regions, per peer region (`crate::store::regions`): how far
//! behind this region's view of the peer is, what it has applied, and what went wrong.
//! Rendered with the shim's other metrics on `GET /metrics`; one label, the peer's name,
//! fixed at start.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// One peer region's replication.
#[derive(Default)]
pub struct PeerMetrics {
    /// Milliseconds since `started` of the last pass that read the peer's stream to its
    /// end (0: never).
    caught_up_ms: AtomicU64,
    /// Entries of the peer's stream known and not yet applied, after the last pass.
    backlog: AtomicU64,
    /// Tokens the peer's entries added to its components here.
    applied_tokens: AtomicU64,
    applied_entries: AtomicU64,
    /// Passes that failed (the peer or this region's Redis did not answer).
    failed_passes: AtomicU64,
    /// Entries the peer trimmed from its stream before this region read them.
    missed: AtomicU64,
}

impl PeerMetrics {
    pub fn applied(&self, entries: u64, tokens: u64) {
        self.applied_entries.fetch_add(entries, Relaxed);
        self.applied_tokens.fetch_add(tokens, Relaxed);
    }

    /// A pass ended with `backlog` entries still unread (0: caught up).
    pub fn passed(&self, started: Instant, backlog: u64) {
        self.backlog.store(backlog, Relaxed);
        if backlog == 0 {
            let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.caught_up_ms.store(ms.max(1), Relaxed);
        }
    }

    pub fn failed(&self) {
        self.failed_passes.fetch_add(1, Relaxed);
    }

    pub fn gap(&self, missed: u64) {
        self.missed.fetch_add(missed, Relaxed);
    }

    /// Seconds since this region last held all of the peer's spending (since start,
    /// when it never has).
    pub fn lag_seconds(&self, started: Instant) -> f64 {
        let now = started.elapsed().as_millis() as f64;
        (now - self.caught_up_ms.load(Relaxed) as f64).max(0.0) / 1000.0
    }

    /// Each metric's name, type and value.
    pub fn values(&self, started: Instant) -> [(&'static str, &'static str, String); 6] {
        [
            (
                "rlshim_region_replication_lag_seconds",
                "gauge",
                format!("{:.3}", self.lag_seconds(started)),
            ),
            (
                "rlshim_region_replication_backlog_entries",
                "gauge",
                self.backlog.load(Relaxed).to_string(),
            ),
            (
                "rlshim_region_applied_tokens_total",
                "counter",
                self.applied_tokens.load(Relaxed).to_string(),
            ),
            (
                "rlshim_region_applied_entries_total",
                "counter",
                self.applied_entries.load(Relaxed).to_string(),
            ),
            (
                "rlshim_region_failed_passes_total",
                "counter",
                self.failed_passes.load(Relaxed).to_string(),
            ),
            (
                "rlshim_region_missed_entries_total",
                "counter",
                self.missed.load(Relaxed).to_string(),
            ),
        ]
    }
}

/// Every peer's metrics, each family typed once.
pub fn render(peers: &[(&str, &PeerMetrics)], started: Instant, out: &mut String) {
    let rows: Vec<_> = peers
        .iter()
        .map(|(name, metrics)| (*name, metrics.values(started)))
        .collect();
    for family in 0..6 {
        for (index, (peer, values)) in rows.iter().enumerate() {
            let (name, kind, value) = &values[family];
            if index == 0 {
                let _ = writeln!(out, "# TYPE {name} {kind}");
            }
            let _ = writeln!(out, "{name}{{peer=\"{peer}\"}} {value}");
        }
    }
}
