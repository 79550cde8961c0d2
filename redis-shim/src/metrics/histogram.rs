//! A latency histogram with fixed buckets, rendered in the text exposition format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency histograms' buckets, in seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5,
];

/// A latency histogram.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        // Cumulative buckets are summed when rendered; each observation lands in one.
        if let Some(bucket) = LATENCY_BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}
