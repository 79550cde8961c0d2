//! The shim as Envoy's rate-limit quota service: real Envoys' `rate_limit_quota` filter
//! streaming usage reports to the shim's `--grpc-listen`, with the limits of
//! `--rls-config`, counted in real Redis. Each limited bucket is served as a token bucket
//! Envoy applies itself, at its share of the rule's rate: two Envoys together hold a rule
//! of 5 a second and one of 100 a minute, a second Envoy halves the first one's share at
//! once, and a shim outage leaves each Envoy to its `expired_assignment_behavior`.
//!
//! Envoy reports every 5 s, so these tests run 10-17 s each; they are independent and the
//! harness runs them side by side. The numbers they print are those of docs/RLS.md.

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

const TOKEN: &str = "rlqs-test-token";

const LIMITS: &str = r#"
domain: quota
descriptors:
  - key: name
    value: per-second
    descriptors:
      - key: api_key
        rate_limit: { unit: second, requests_per_unit: 5 }
  - key: name
    value: per-minute
    descriptors:
      - key: api_key
        rate_limit: { unit: minute, requests_per_unit: 100 }
"#;

fn rlqs_shim(redis: &Redis) -> (Shim, ClaimedPort) {
    Shim::start_grpc(&redis.url(), LIMITS, &["--token", TOKEN])
}

/// Every request in the bucket `{name: <name>, api_key: <x-api-key>}`, refused until the
/// first assignment comes, and `expired` as its `expired_assignment_behavior`.
fn quota_filter(name: &str, expired: Option<Value>) -> Value {
    let mut settings = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
        "bucket_id_builder": { "bucket_id_builder": {
            "name": { "string_value": name },
            "api_key": { "custom_value": { "name": "api_key", "typed_config": {
                "@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                "header_name": "x-api-key" } } }
        } },
        "reporting_interval": "5s",
        "no_assignment_behavior": { "fallback_rate_limit": { "blanket_rule": "DENY_ALL" } }
    });
    if let Some(expired) = expired {
        settings["expired_assignment_behavior"] = expired;
    }
    json!({ "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "domain": "quota",
            "rlqs_server": {
                "envoy_grpc": { "cluster_name": "rlqs" },
                "initial_metadata": [{ "key": "x-ratelimit-token", "value": TOKEN }]
            },
            "bucket_matchers": { "on_no_match": { "action": {
                "name": "rate_limit_quota", "typed_config": settings } } }
        } })
}

fn quota_envoy(grpc_port: u16, upstream_port: u16, filter: Value) -> Envoy {
    let routes = json!([{ "match": { "prefix": "/" }, "route": { "cluster": "upstream" } }]);
    Envoy::start_bootstrap(&native_filter_bootstrap(
        filter,
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

/// Requests per Envoy every tick of [`TICK`]: 20 a second, four times the fastest rate.
const PER_TICK: usize = 2;
const TICK: Duration = Duration::from_millis(100);

/// When each of one Envoy's admissions came, in seconds since the traffic started.
#[derive(Default, Debug)]
struct Admissions(Vec<f64>);

impl Admissions {
    fn between(&self, from_s: f64, to_s: f64) -> usize {
        self.0.iter().filter(|&&t| t >= from_s && t < to_s).count()
    }
    fn first(&self) -> Option<f64> {
        self.0.first().copied()
    }
}

/// Sends [`PER_TICK`] requests to each Envoy (with its API key) every [`TICK`], from
/// `started` until `until_s`, each Envoy from its own start second; records admissions.
fn drive(envoys: &[(&Envoy, &str, f64)], started: Instant, until_s: f64, seen: &mut [Admissions]) {
    loop {
        let now = started.elapsed().as_secs_f64();
        if now >= until_s {
            return;
        }
        for ((envoy, key, from_s), seen) in envoys.iter().zip(seen.iter_mut()) {
            if now < *from_s {
                continue;
            }
            let url = envoy.url("/");
            let key = key.to_string();
            let replies = concurrently(PER_TICK, move |_| get(&url, &[("x-api-key", &key)]));
            let at = started.elapsed().as_secs_f64();
            seen.0
                .extend(std::iter::repeat_n(at, count_status(&replies, 200)));
        }
        let next =
            started + Duration::from_secs_f64((now / TICK.as_secs_f64()).floor() * TICK.as_secs_f64()) + TICK;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

#[test]
fn five_a_second_across_two_envoys_holds_from_the_second_assignment_on() {
    let redis = Redis::start();
    let (shim, grpc) = rlqs_shim(&redis);
    let upstream = Upstream::start();
    let first = quota_envoy(grpc.port, upstream.port, quota_filter("per-second", None));
    let second = quota_envoy(grpc.port, upstream.port, quota_filter("per-second", None));
    let started = Instant::now();
    let mut seen = [Admissions::default(), Admissions::default()];
    // The first Envoy alone, then both from 1.5 s, for 12 s: two reports of each.
    drive(
        &[(&first, "alice", 0.0), (&second, "alice", 1.5)],
        started,
        12.5,
        &mut seen,
    );
    let [a, b] = &seen;
    // Under DENY_ALL, the first report (of the bucket's first request) got an assignment.
    let a_first = a.first().expect("the first Envoy admitted nothing");
    let joined = b.first().expect("the second Envoy admitted nothing");
    assert!(
        a_first < 1.0 && joined < 2.5,
        "first admissions at {a_first} and {joined} s"
    );
    // The second Envoy's first report lowered the first one's share at once: from then
    // to before the first Envoy's own next report (5 s after its first), 2.5 a second
    // (its bucket, spent, starts empty), where its old share would have been 5.
    let window = (joined + 0.2, 4.5);
    let a_after_join = a.between(window.0, window.1);
    let span = window.1 - window.0;
    println!(
        "first Envoy after the join: {a_after_join} in {span:.1} s; before: {} in {joined:.1} s",
        a.between(0.0, joined)
    );
    assert!(
        (a_after_join as f64) <= 2.5 * span + 3.0 + 1.0,
        "the first Envoy kept its whole share after the join: {a_after_join} in {span:.1} s"
    );
    assert!(shim_metric(&shim, "rlshim_rlqs_pushed_total") >= 1);
    // From the second assignment on, both together: 5 a second, once the new buckets'
    // first tokens (at most 3 each: a second of a 2.5-a-second share) are aside.
    let end = 12.5;
    let together = a.between(joined, end) + b.between(joined, end);
    let rate = (together as f64 - 6.0) / (end - joined);
    let per_second: Vec<usize> = (0..12)
        .map(|s| a.between(s as f64, s as f64 + 1.0) + b.between(s as f64, s as f64 + 1.0))
        .collect();
    println!("5/s, two Envoys: {together} admitted in {:.1} s from the second assignment ({rate:.2}/s, full buckets aside); per second {per_second:?}", end - joined);
    assert!((4.0..=6.0).contains(&rate), "{rate:.2} a second: {per_second:?}");
    assert!(
        b.between(joined, end) > 10 && a.between(joined, end) > 10,
        "{a:?} {b:?}"
    );
}

#[test]
fn a_hundred_a_minute_across_two_envoys_hold_their_rate_and_are_charged_in_redis() {
    let redis = Redis::start();
    let (shim, grpc) = rlqs_shim(&redis);
    let upstream = Upstream::start();
    let envoys = [
        quota_envoy(grpc.port, upstream.port, quota_filter("per-minute", None)),
        quota_envoy(grpc.port, upstream.port, quota_filter("per-minute", None)),
    ];
    let started = Instant::now();
    let mut seen = [Admissions::default(), Admissions::default()];
    let end = 12.0;
    drive(
        &[(&envoys[0], "bob", 0.0), (&envoys[1], "bob", 0.0)],
        started,
        end,
        &mut seen,
    );
    let total = |from: f64, to: f64| seen[0].between(from, to) + seen[1].between(from, to);
    let all = total(0.0, end);
    // The bound: the rate over the run, plus the buckets the assignments started: the
    // first Envoy's alone (25: a quarter of the minute), then 12 each at half the rate.
    let bound = 100.0 / 60.0 * end + 25.0 + 12.0 + 12.0;
    // Once the full buckets are spent (a few seconds at 20 a second each), the rate.
    let late = total(6.0, end);
    println!("100/min, two Envoys: {all} admitted in {end} s (bound {bound:.0}), {late} in the last 6 s (rate: 10)");
    assert!(all as f64 <= bound, "{all} admitted, bound {bound}");
    assert!((6..=14).contains(&late), "{late} in the last 6 s");
    assert!(seen.iter().all(|s| s.between(6.0, end) > 0), "{seen:?}");
    // What the reports said was admitted is charged to the minute's counter in Redis.
    wait_until("a report after the traffic", Duration::from_secs(7), || {
        shim_metric(&shim, "rlshim_rlqs_requests_total{kind=\"allowed\"}") == all as u64
    });
    let keys = redis.cli(&["KEYS", "rl:rls/fw60000:*"]);
    assert!(!keys.trim().is_empty() && !keys.contains("bob"), "{keys}");
}

/// Each way to configure what a bucket does once its assignment expires, with the shim
/// gone: a token bucket of its own, ALLOW_ALL, DENY_ALL, and `reuse_last_assignment`,
/// which Envoy 1.40 does not read (its bucket falls back to `no_assignment_behavior`).
#[test]
fn a_shim_outage_holds_the_assignment_then_each_envoy_follows_its_expired_behavior() {
    let redis = Redis::start();
    let (mut shim, grpc) = rlqs_shim(&redis);
    let upstream = Upstream::start();
    let fallback = |strategy: Value| json!({ "fallback_rate_limit": strategy, "expired_assignment_behavior_timeout": "60s" });
    let behaviors = [
        (
            "token_bucket",
            fallback(json!({ "token_bucket": {
                "max_tokens": 1, "tokens_per_fill": 1, "fill_interval": "1s" } })),
        ),
        ("allow_all", fallback(json!({ "blanket_rule": "ALLOW_ALL" }))),
        ("deny_all", fallback(json!({ "blanket_rule": "DENY_ALL" }))),
        ("reuse_last", json!({ "reuse_last_assignment": {} })),
    ];
    let envoys: Vec<Envoy> = behaviors
        .iter()
        .map(|(_, expired)| {
            quota_envoy(
                grpc.port,
                upstream.port,
                quota_filter("per-second", Some(expired.clone())),
            )
        })
        .collect();
    // Each its own key: its own bucket, and the whole 5 a second.
    let driven: Vec<(&Envoy, &str, f64)> = envoys
        .iter()
        .zip(&behaviors)
        .map(|(envoy, (name, _))| (envoy, *name, 0.0))
        .collect();
    let started = Instant::now();
    let mut seen: Vec<Admissions> = behaviors.iter().map(|_| Admissions::default()).collect();
    drive(&driven, started, 2.0, &mut seen);
    assert!(seen.iter().all(|s| s.first().is_some()), "{seen:?}");
    shim.kill();
    // The assignments (sent at the first requests, lasting 12 s) expire near 12 s.
    drive(&driven, started, 16.5, &mut seen);
    for ((name, _), s) in behaviors.iter().zip(&seen) {
        let held = s.between(3.0, 11.0);
        let after = s.between(13.5, 16.5);
        println!(
            "outage, {name}: {held} admitted in 8 s on the last assignment, {after} in 3 s after it expired"
        );
        // The shim gone, Envoy still applies its last token bucket: 5 a second.
        assert!((30..=46).contains(&held), "{name}: {held} in 8 s");
        let expected = match *name {
            "token_bucket" => 2..=5,
            "allow_all" => 40..=60,
            _ => 0..=0,
        };
        assert!(expected.contains(&after), "{name}: {after} in 3 s after expiry");
    }
}

#[test]
fn the_example_envoy_rlqs_yaml_passes_envoy_validation() {
    let (valid, output) = envoy_validate(&repo_root().join("envoy-rlqs.yaml"));
    assert!(valid, "{output}");
}
