//! The shim's Prometheus metrics: plain atomics, rendered in the text exposition format
//! on `GET /metrics`. Fixed label sets, so nothing grows with traffic. The rate-limit
//! and quota services keep theirs in [`rls`] and [`rlqs`], rendered with these.

mod histogram;
pub mod regions;
pub mod rlqs;
pub mod rls;

use histogram::Histogram;
use ratelimit_wire::Algorithm;
use rlqs::RlqsMetrics;
use rls::RlsMetrics;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What happened to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    Allowed,
    Denied,
    /// A shadow check that would have denied.
    ShadowDenied,
}

impl CheckOutcome {
    const ALL: [CheckOutcome; 3] = [
        CheckOutcome::Allowed,
        CheckOutcome::Denied,
        CheckOutcome::ShadowDenied,
    ];

    fn as_str(self) -> &'static str {
        match self {
            CheckOutcome::Allowed => "allowed",
            CheckOutcome::Denied => "denied",
            CheckOutcome::ShadowDenied => "shadow_denied",
        }
    }
}

/// How one request was answered. A check request is a `POST /v1/check`, or one request
/// of a `POST /v1/check-batch` (counted as if posted alone; a batch refused before its
/// requests are read counts once); its statuses are those of `/v1/check`, and in a batch
/// a request not decided is a `failed` answer. An admin call is answered 200 or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    Allowed,
    Denied,
    /// 200 to an admin call.
    Answered,
    /// 400, 408 (body too slow) or 413.
    Invalid,
    /// 401, or 403 (admin endpoints on a shim without a token).
    Unauthorized,
    /// 503: past the in-flight bound.
    Overloaded,
    /// 503: Redis failed or timed out.
    RedisError,
}

impl RequestOutcome {
    const ALL: [RequestOutcome; 7] = [
        RequestOutcome::Allowed,
        RequestOutcome::Denied,
        RequestOutcome::Answered,
        RequestOutcome::Invalid,
        RequestOutcome::Unauthorized,
        RequestOutcome::Overloaded,
        RequestOutcome::RedisError,
    ];

    fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Allowed => "allowed",
            RequestOutcome::Denied => "denied",
            RequestOutcome::Answered => "ok",
            RequestOutcome::Invalid => "invalid",
            RequestOutcome::Unauthorized => "unauthorized",
            RequestOutcome::Overloaded => "overloaded",
            RequestOutcome::RedisError => "redis_error",
        }
    }
}

/// What a counted request asked for: the `endpoint` label of `rlshim_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedEndpoint {
    /// A check request, alone or in a batch: the traffic the alerts' ratios are about,
    /// and the only one timed in `rlshim_check_duration_seconds`.
    Check,
    CountersShow,
    CountersReset,
    CountersVariants,
}

impl CountedEndpoint {
    const ALL: [CountedEndpoint; 4] = [
        CountedEndpoint::Check,
        CountedEndpoint::CountersShow,
        CountedEndpoint::CountersReset,
        CountedEndpoint::CountersVariants,
    ];

    fn as_str(self) -> &'static str {
        match self {
            CountedEndpoint::Check => "check",
            CountedEndpoint::CountersShow => "counters_show",
            CountedEndpoint::CountersReset => "counters_reset",
            CountedEndpoint::CountersVariants => "counters_variants",
        }
    }

    /// The outcomes its answers can have, each a series.
    fn outcomes(self) -> impl Iterator<Item = RequestOutcome> {
        RequestOutcome::ALL
            .into_iter()
            .filter(move |outcome| match outcome {
                RequestOutcome::Allowed | RequestOutcome::Denied => self == CountedEndpoint::Check,
                RequestOutcome::Answered => self != CountedEndpoint::Check,
                _ => true,
            })
    }
}

/// Why the shim closed a connection itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionClose {
    /// The connection cap was reached: the longest idle connection made room.
    Evicted,
    /// The connection cap was reached and every connection was busy: the new one went.
    Refused,
    /// A request's headers (or a connection's first request) did not come in time.
    HeaderTimeout,
    /// A check request's body did not come in time (answered 408).
    BodyTimeout,
}

impl ConnectionClose {
    const ALL: [ConnectionClose; 4] = [
        ConnectionClose::Evicted,
        ConnectionClose::Refused,
        ConnectionClose::HeaderTimeout,
        ConnectionClose::BodyTimeout,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ConnectionClose::Evicted => "evicted",
            ConnectionClose::Refused => "refused",
            ConnectionClose::HeaderTimeout => "header_timeout",
            ConnectionClose::BodyTimeout => "body_timeout",
        }
    }
}

const REDIS_ERROR_KINDS: [&str; 3] = ["timeout", "error", "malformed_reply"];

#[derive(Default)]
pub struct Metrics {
    checks: [[AtomicU64; 3]; Algorithm::ALL.len()],
    requests: [[AtomicU64; RequestOutcome::ALL.len()]; CountedEndpoint::ALL.len()],
    redis_errors: [AtomicU64; 3],
    refunds: AtomicU64,
    refund_failures: AtomicU64,
    in_flight: AtomicI64,
    connections_open: AtomicI64,
    connection_closes: [AtomicU64; 4],
    latency: Histogram,
    redis_latency: Histogram,
    /// The rate-limit service's own (`--grpc-listen`).
    pub rls: RlsMetrics,
    /// The quota service's own (`--grpc-listen`).
    pub rlqs: RlqsMetrics,
}

fn algorithm_index(algorithm: Algorithm) -> usize {
    Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap_or(0)
}

impl Metrics {
    pub fn check(&self, algorithm: Algorithm, outcome: CheckOutcome) {
        let outcome = CheckOutcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.checks[algorithm_index(algorithm)][outcome].fetch_add(1, Relaxed);
    }

    /// One request to `endpoint` answered with `outcome`, `latency` after it came.
    pub fn request(&self, endpoint: CountedEndpoint, outcome: RequestOutcome, latency: Duration) {
        let e = CountedEndpoint::ALL
            .iter()
            .position(|e| *e == endpoint)
            .unwrap_or(0);
        let o = RequestOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.requests[e][o].fetch_add(1, Relaxed);
        if endpoint == CountedEndpoint::Check {
            self.latency.observe(latency);
        }
    }

    /// One call of the shim's Redis functions took `latency`.
    pub fn redis_call(&self, latency: Duration) {
        self.redis_latency.observe(latency);
    }

    pub fn redis_error(&self, kind: &str) {
        let index = REDIS_ERROR_KINDS.iter().position(|k| *k == kind).unwrap_or(1);
        self.redis_errors[index].fetch_add(1, Relaxed);
    }

    pub fn refund(&self, complete: bool) {
        self.refunds.fetch_add(1, Relaxed);
        if !complete {
            self.refund_failures.fetch_add(1, Relaxed);
        }
    }

    pub fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Relaxed);
    }

    pub fn connection_ended(&self) {
        self.connections_open.fetch_sub(1, Relaxed);
    }

    pub fn connection_closed(&self, reason: ConnectionClose) {
        let index = ConnectionClose::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.connection_closes[index].fetch_add(1, Relaxed);
    }

    /// Counts a check in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(self)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let header = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        header(
            &mut out,
            "rlshim_checks_total",
            "counter",
            "Checks decided (one per rule of a request), by algorithm and outcome.",
        );
        for algorithm in Algorithm::ALL {
            for (o, outcome) in CheckOutcome::ALL.iter().enumerate() {
                let value = self.checks[algorithm_index(algorithm)][o].load(Relaxed);
                let _ = writeln!(
                    out,
                    "rlshim_checks_total{{algorithm=\"{}\",outcome=\"{}\"}} {value}",
                    algorithm.as_str(),
                    outcome.as_str()
                );
            }
        }
        header(
            &mut out,
            "rlshim_requests_total",
            "counter",
            "Requests answered, by endpoint (check: each check request, alone or in a batch; counters_show, counters_reset, counters_variants: the admin calls) and outcome.",
        );
        for (e, endpoint) in CountedEndpoint::ALL.iter().enumerate() {
            for outcome in endpoint.outcomes() {
                let o = RequestOutcome::ALL
                    .iter()
                    .position(|r| *r == outcome)
                    .unwrap_or(0);
                let value = self.requests[e][o].load(Relaxed);
                let _ = writeln!(
                    out,
                    "rlshim_requests_total{{endpoint=\"{}\",outcome=\"{}\"}} {value}",
                    endpoint.as_str(),
                    outcome.as_str()
                );
            }
        }
        header(
            &mut out,
            "rlshim_check_duration_seconds",
            "histogram",
            "Time to answer a check request, from its arrival.",
        );
        self.latency.render(&mut out, "rlshim_check_duration_seconds");
        header(
            &mut out,
            "rlshim_redis_call_duration_seconds",
            "histogram",
            "Time for one call of the shim's Redis functions (a batch's checks in one slot, or its refunds), from sending it to its answer.",
        );
        self.redis_latency
            .render(&mut out, "rlshim_redis_call_duration_seconds");
        header(
            &mut out,
            "rlshim_redis_errors_total",
            "counter",
            "Failed Redis operations, by kind.",
        );
        for (i, kind) in REDIS_ERROR_KINDS.iter().enumerate() {
            let value = self.redis_errors[i].load(Relaxed);
            let _ = writeln!(out, "rlshim_redis_errors_total{{kind=\"{kind}\"}} {value}");
        }
        header(
            &mut out,
            "rlshim_slot_refunds_total",
            "counter",
            "Requests spanning cluster slots refused by a later slot, their earlier charges refunded.",
        );
        let _ = writeln!(out, "rlshim_slot_refunds_total {}", self.refunds.load(Relaxed));
        header(
            &mut out,
            "rlshim_refund_failures_total",
            "counter",
            "Refunds that Redis did not complete (tokens stay charged until they refill).",
        );
        let _ = writeln!(
            out,
            "rlshim_refund_failures_total {}",
            self.refund_failures.load(Relaxed)
        );
        header(
            &mut out,
            "rlshim_in_flight",
            "gauge",
            "Check requests being decided now.",
        );
        let _ = writeln!(out, "rlshim_in_flight {}", self.in_flight.load(Relaxed));
        header(
            &mut out,
            "rlshim_connections_open",
            "gauge",
            "Client connections open now.",
        );
        let _ = writeln!(
            out,
            "rlshim_connections_open {}",
            self.connections_open.load(Relaxed)
        );
        header(
            &mut out,
            "rlshim_connections_closed_total",
            "counter",
            "Connections the shim closed itself: the connection cap, or a slow client.",
        );
        for (i, reason) in ConnectionClose::ALL.iter().enumerate() {
            let value = self.connection_closes[i].load(Relaxed);
            let _ = writeln!(
                out,
                "rlshim_connections_closed_total{{reason=\"{}\"}} {value}",
                reason.as_str()
            );
        }
        self.rls.render(&mut out);
        self.rlqs.render(&mut out);
        out
    }
}

/// Decrements the in-flight gauge when dropped.
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_gauge_follows_guards() {
        let metrics = Metrics::default();
        let check = CountedEndpoint::Check;
        metrics.request(check, RequestOutcome::Allowed, Duration::from_micros(300));
        metrics.request(check, RequestOutcome::Denied, Duration::from_millis(3));
        metrics.request(check, RequestOutcome::Denied, Duration::from_secs(9));
        metrics.redis_call(Duration::from_micros(80));
        let guard = metrics.in_flight();
        let text = metrics.render();
        assert!(
            text.contains("rlshim_check_duration_seconds_bucket{le=\"0.0005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_check_duration_seconds_bucket{le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_check_duration_seconds_bucket{le=\"2.5\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_check_duration_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_requests_total{endpoint=\"check\",outcome=\"denied\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_redis_call_duration_seconds_bucket{le=\"0.0001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_redis_call_duration_seconds_count 1\n"),
            "{text}"
        );
        assert!(text.contains("rlshim_in_flight 1\n"), "{text}");
        drop(guard);
        assert!(metrics.render().contains("rlshim_in_flight 0\n"));
    }

    #[test]
    fn admin_calls_count_by_endpoint_and_are_not_timed_as_checks() {
        let metrics = Metrics::default();
        let reset = CountedEndpoint::CountersReset;
        metrics.request(reset, RequestOutcome::Answered, Duration::from_millis(1));
        metrics.request(reset, RequestOutcome::Unauthorized, Duration::from_millis(1));
        let text = metrics.render();
        for counted in [
            "rlshim_requests_total{endpoint=\"counters_reset\",outcome=\"ok\"} 1\n",
            "rlshim_requests_total{endpoint=\"counters_reset\",outcome=\"unauthorized\"} 1\n",
            "rlshim_requests_total{endpoint=\"check\",outcome=\"unauthorized\"} 0\n",
            "rlshim_check_duration_seconds_count 0\n",
        ] {
            assert!(text.contains(counted), "no {counted} in\n{text}");
        }
        // Outcomes an endpoint cannot have are no series.
        assert!(
            !text.contains("endpoint=\"counters_reset\",outcome=\"allowed\""),
            "{text}"
        );
        assert!(!text.contains("endpoint=\"check\",outcome=\"ok\""), "{text}");
    }
}
