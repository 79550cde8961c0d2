//! The rate-limit service's metrics, in the shim's naming and rendered with the others
//! on `GET /metrics`: `ShouldRateLimit` calls by outcome, descriptors by what they came
//! to, and `--rls-config` reloads by outcome. Fixed label sets; each check sent to Redis also counts in `rlshim_checks_total`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How a `ShouldRateLimit` call was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    Ok,
    OverLimit,
    /// INVALID_ARGUMENT: a request the configuration cannot decide.
    Invalid,
    /// UNAUTHENTICATED: missing or wrong token.
    Unauthorized,
    /// RESOURCE_EXHAUSTED: past the in-flight bound.
    Overloaded,
    /// UNAVAILABLE: Redis failed or timed out.
    RedisError,
}

const CALL_OUTCOMES: [(CallOutcome, &str); 6] = [
    (CallOutcome::Ok, "ok"),
    (CallOutcome::OverLimit, "over_limit"),
    (CallOutcome::Invalid, "invalid"),
    (CallOutcome::Unauthorized, "unauthorized"),
    (CallOutcome::Overloaded, "overloaded"),
    (CallOutcome::RedisError, "redis_error"),
];

/// What one descriptor of a decided `ShouldRateLimit` call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorOutcome {
    Ok,
    OverLimit,
    /// Over a limit in shadow mode (its own or the service's): answered OK.
    ShadowOverLimit,
    /// Over a limit in quota mode: refuses only with every quota-mode descriptor.
    QuotaOverLimit,
    Unlimited,
    NoLimit,
    /// Its limit is named in another matched limit's `replaces`: not counted.
    Replaced,
}

const DESCRIPTOR_OUTCOMES: [(DescriptorOutcome, &str); 7] = [
    (DescriptorOutcome::Ok, "ok"),
    (DescriptorOutcome::OverLimit, "over_limit"),
    (DescriptorOutcome::ShadowOverLimit, "shadow_over_limit"),
    (DescriptorOutcome::QuotaOverLimit, "quota_over_limit"),
    (DescriptorOutcome::Unlimited, "unlimited"),
    (DescriptorOutcome::NoLimit, "no_limit"),
    (DescriptorOutcome::Replaced, "replaced"),
];

#[derive(Default)]
pub struct RlsMetrics {
    calls: [AtomicU64; CALL_OUTCOMES.len()],
    descriptors: [AtomicU64; DESCRIPTOR_OUTCOMES.len()],
    /// `--rls-config` reloads: applied, and refused (the last good configuration kept).
    reloads_ok: AtomicU64,
    reloads_refused: AtomicU64,
}

impl RlsMetrics {
    pub fn call(&self, outcome: CallOutcome) {
        let index = CALL_OUTCOMES.iter().position(|(o, _)| *o == outcome).unwrap_or(0);
        self.calls[index].fetch_add(1, Relaxed);
    }

    /// Counts one answered descriptor.
    pub fn descriptor(&self, outcome: DescriptorOutcome) {
        let index = DESCRIPTOR_OUTCOMES
            .iter()
            .position(|(o, _)| *o == outcome)
            .unwrap_or(0);
        self.descriptors[index].fetch_add(1, Relaxed);
    }

    /// Counts one reload of `--rls-config`: applied (`ok`), or refused for its errors.
    pub fn reload(&self, ok: bool) {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_refused
        };
        counter.fetch_add(1, Relaxed);
    }

    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP rlshim_rls_requests_total ShouldRateLimit calls answered (--grpc-listen), by outcome.\n# TYPE rlshim_rls_requests_total counter"
        );
        for (i, (_, name)) in CALL_OUTCOMES.iter().enumerate() {
            let value = self.calls[i].load(Relaxed);
            let _ = writeln!(out, "rlshim_rls_requests_total{{outcome=\"{name}\"}} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP rlshim_rls_descriptors_total Descriptors of decided ShouldRateLimit calls, by what they came to.\n# TYPE rlshim_rls_descriptors_total counter"
        );
        for (i, (_, name)) in DESCRIPTOR_OUTCOMES.iter().enumerate() {
            let value = self.descriptors[i].load(Relaxed);
            let _ = writeln!(out, "rlshim_rls_descriptors_total{{outcome=\"{name}\"}} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP rlshim_rls_config_reloads_total Changes of --rls-config loaded while serving: ok (applied), refused (the last good configuration kept).\n# TYPE rlshim_rls_config_reloads_total counter"
        );
        for (name, counter) in [("ok", &self.reloads_ok), ("refused", &self.reloads_refused)] {
            let value = counter.load(Relaxed);
            let _ = writeln!(
                out,
                "rlshim_rls_config_reloads_total{{outcome=\"{name}\"}} {value}"
            );
        }
    }
}
