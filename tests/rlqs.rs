//! The shim as Envoy's rate-limit quota service: real Envoys' `rate_limit_quota` filter
//! streaming usage reports to the shim's `--grpc-listen`, with the limits of
//! `--rls-config`, counted in real Redis. Two Envoys burst against one limit: together
//! they admit exactly the limit, and what a stream that ended held goes to the other.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

const TOKEN: &str = "rlqs-test-token";

/// A day's window, so no window ends during a test; grants of at most 40 / 4 = 10.
const LIMITS: &str = r#"
domain: quota
descriptors:
  - key: name
    value: free
    descriptors:
      - key: api_key
        rate_limit: { unit: day, requests_per_unit: 40 }
"#;
const LIMIT: usize = 40;

fn rlqs_shim(redis: &Redis) -> (Shim, ClaimedPort) {
    Shim::start_grpc(&redis.url(), LIMITS, &["--token", TOKEN])
}

/// Every request in the bucket `{name: free, api_key: <x-api-key>}`, refused until the
/// first assignment comes (the strict choice). Envoy reports every 5 s (whatever
/// `reporting_interval` says), so each grant after the first waits up to 5 s.
fn quota_filter() -> Value {
    json!({ "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "domain": "quota",
            "rlqs_server": {
                "envoy_grpc": { "cluster_name": "rlqs" },
                "initial_metadata": [{ "key": "x-ratelimit-token", "value": TOKEN }]
            },
            "bucket_matchers": { "on_no_match": { "action": {
                "name": "rate_limit_quota",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
                    "bucket_id_builder": { "bucket_id_builder": {
                        "name": { "string_value": "free" },
                        "api_key": { "custom_value": { "name": "api_key", "typed_config": {
                            "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                            "header_name": "x-api-key" } } }
                    } },
                    "reporting_interval": "5s",
                    "no_assignment_behavior": { "fallback_rate_limit": { "blanket_rule": "DENY_ALL" } }
                }
            } } }
        } })
}

fn quota_envoy(grpc_port: u16, upstream_port: u16) -> Envoy {
    let routes = json!([{ "match": { "prefix": "/" }, "route": { "cluster": "upstream" } }]);
    Envoy::start_bootstrap(&native_filter_bootstrap(
        quota_filter(),
        routes,
        "rlqs",
        grpc_port,
        upstream_port,
    ))
}

/// A number from the shim's metrics: the first series starting with `series`.
fn shim_metric(shim: &Shim, series: &str) -> u64 {
    get(&shim.url("/metrics"), &[])
        .body
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series}"))
}

fn admitted(envoy: &Envoy, key: &str, count: usize) -> usize {
    let url = envoy.url("/");
    let key = key.to_string();
    count_status(
        &concurrently(count, move |_| get(&url, &[("x-api-key", &key)])),
        200,
    )
}

/// Sends bursts of `burst` requests to each of `envoys` every 100 ms until `done` says
/// so (or `within` passes), and returns what each admitted.
fn burst_until(
    envoys: &[&Envoy],
    key: &str,
    burst: usize,
    within: Duration,
    mut done: impl FnMut(&[usize]) -> bool,
) -> Vec<usize> {
    let mut totals = vec![0; envoys.len()];
    let started = Instant::now();
    while !done(&totals) && started.elapsed() < within {
        for (total, envoy) in totals.iter_mut().zip(envoys) {
            *total += admitted(envoy, key, burst);
        }
        assert!(
            totals.iter().sum::<usize>() <= LIMIT,
            "more than the limit admitted: {totals:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    totals
}

#[test]
fn two_envoys_bursting_against_one_limit_admit_exactly_the_limit() {
    let redis = Redis::start();
    let (shim, grpc) = rlqs_shim(&redis);
    let upstream = Upstream::start();
    let envoys = [
        quota_envoy(grpc.port, upstream.port),
        quota_envoy(grpc.port, upstream.port),
    ];
    let both: Vec<&Envoy> = envoys.iter().collect();
    // Both keep asking until the counter is spent and both have been refused by it.
    let totals = burst_until(&both, "alice", 8, Duration::from_secs(60), |totals| {
        totals.iter().sum::<usize>() == LIMIT && shim_metric(&shim, "rlshim_rlqs_deny_all_total") >= 2
    });
    assert_eq!(totals.iter().sum::<usize>(), LIMIT, "{totals:?}");
    assert!(
        totals.iter().all(|&t| t > 0),
        "both Envoys were served: {totals:?}"
    );
    // Bursts after that: nothing more.
    let after = burst_until(&both, "alice", 8, Duration::from_millis(1_500), |_| false);
    assert_eq!(after, [0, 0]);
    // Every grant was spent and nothing was charged without one.
    assert_eq!(
        shim_metric(&shim, "rlshim_rlqs_tokens_total{kind=\"granted\"}"),
        LIMIT as u64
    );
    assert_eq!(shim_metric(&shim, "rlshim_rlqs_tokens_total{kind=\"debt\"}"), 0);
    // The key is its own bucket and its own counter, shared with an RLS descriptor of
    // the same entries; the value never reaches Redis.
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(
        !keys.contains("alice") && keys.contains("rl:rls/fw86400000:{"),
        "{keys}"
    );
    let bob = burst_until(&both, "bob", 4, Duration::from_secs(20), |totals| {
        totals.iter().sum::<usize>() >= 4
    });
    assert!(bob.iter().sum::<usize>() >= 4, "{bob:?}");
}

#[test]
fn a_stream_that_ends_gives_back_what_its_grant_held() {
    let redis = Redis::start();
    let (shim, grpc) = rlqs_shim(&redis);
    let upstream = Upstream::start();
    let stays = quota_envoy(grpc.port, upstream.port);
    let mut leaves = quota_envoy(grpc.port, upstream.port);
    // The leaving Envoy takes a grant and spends part of it, and reports what it spent.
    let left_with = burst_until(&[&leaves], "carol", 12, Duration::from_secs(10), |totals| {
        totals[0] > 0
    })[0];
    wait_until(
        "the leaving Envoy's use reported",
        Duration::from_secs(12),
        || shim_metric(&shim, "rlshim_rlqs_tokens_total{kind=\"spent\"}") >= left_with as u64,
    );
    leaves.process.kill();
    wait_until("its stream ended", Duration::from_secs(5), || {
        shim_metric(&shim, "rlshim_rlqs_streams_open") == 0
    });
    let granted = shim_metric(&shim, "rlshim_rlqs_tokens_total{kind=\"granted\"}");
    assert!(granted > left_with as u64, "granted {granted}, spent {left_with}");
    // The other one takes all the rest: first what was never granted, then, once the
    // ended stream's grant has expired on its Envoy, what that grant held.
    let stayed_with = burst_until(&[&stays], "carol", 8, Duration::from_secs(90), |totals| {
        totals[0] + left_with == LIMIT
    })[0];
    assert_eq!(stayed_with + left_with, LIMIT);
    assert_eq!(
        shim_metric(&shim, "rlshim_rlqs_tokens_total{kind=\"released\"}"),
        granted - left_with as u64
    );
    assert_eq!(shim_metric(&shim, "rlshim_rlqs_streams_open"), 1);
}

#[test]
fn the_example_envoy_rlqs_yaml_passes_envoy_validation() {
    let (valid, output) = envoy_validate(&repo_root().join("envoy-rlqs.yaml"));
    assert!(valid, "{output}");
}
