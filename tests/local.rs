//! The local layer in real Envoy (two worker threads): local buckets in shared data, the
//! bounded slot table, the deny cache, token leases, failure modes and the filter's stats;
//! those in `on_both_hosts!` on the `.wasm` and on the dynamic module.

mod support;

use serde_json::{json, Value};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

fn config(rules: Value) -> Value {
    json!({ "shim_cluster": "ratelimit_shim", "timeout": "5s", "failure_mode": "closed", "rules": rules })
}

/// Envoy with one local rule of `limit` per hour on `x-api-key`, and no shim at all:
/// failing closed, any shim call would show as a 503.
fn envoy_with_local_rule(host: FilterHost, limit: u64) -> Envoy {
    host.start_envoy(
        refusing_port(),
        &config(
            json!([{ "name": "local", "scope": "local", "key": [{ "header": "x-api-key" }],
                          "limit": limit, "period": "1h" }]),
        ),
    )
}

on_both_hosts!(
    a_local_rule_admits_exactly_its_limit_across_worker_threads_without_the_shim,
    an_abusive_client_costs_no_shim_calls_after_its_first_refusal,
    leases_cut_shim_calls_and_bound_over_admission_across_two_envoys,
    killing_and_restarting_redis_applies_each_failure_mode_then_recovers,
    killing_and_restarting_the_shim_applies_each_failure_mode_then_recovers,
    a_shim_slower_than_the_timeout_applies_each_failure_mode,
    traffic_during_a_redis_outage_never_hangs,
    a_shim_cluster_with_no_healthy_endpoint_applies_each_failure_mode,
);

fn a_local_rule_admits_exactly_its_limit_across_worker_threads_without_the_shim(host: FilterHost) {
    let envoy = envoy_with_local_rule(host, 10);
    let url = envoy.url("/");
    let replies = concurrently(40, move |_| get(&url, &[("x-api-key", "k")]));
    assert_eq!(count_status(&replies, 200), 10, "{replies:?}");
    assert_eq!(count_status(&replies, 429), 30);
    assert_eq!(envoy.stat(&host.stat("local.shim_checks")), 0);
    assert_eq!(envoy.stat(&host.stat("local.denied_locally")), 30);
}

#[test]
fn a_flood_of_distinct_keys_does_not_grow_envoys_memory() {
    const KEYS: usize = 100_000;
    const THREADS: usize = 8;
    let envoy = envoy_with_local_rule(FilterHost::Wasm, 5);
    let url = envoy.url("/");
    for i in 0..2_000 {
        assert_ne!(get(&url, &[("x-api-key", &format!("warm-{i}"))]).status, 0);
    }
    let before = envoy.allocated_bytes();
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let url = url.clone();
            std::thread::spawn(move || {
                (thread..KEYS)
                    .step_by(THREADS)
                    .filter(|i| get(&url, &[("x-api-key", &format!("flood-{i}"))]).status == 200)
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    // Keys sharing a slot share its bucket: at most one bucket of 5 per slot (8,192 by
    // default) for the whole flood, which therefore cannot reset anyone's limit either.
    assert!(admitted <= 8192 * 5, "{admitted} of {KEYS} admitted");
    assert!(admitted >= 8192 / 2, "{admitted} of {KEYS} admitted");
    let after = envoy.allocated_bytes();
    let growth = after.saturating_sub(before);
    eprintln!("envoy heap: {before} bytes before, {after} after {KEYS} distinct keys (+{growth})");
    // Measured here: 15.75 MB allocated before and 15.74 MB after (no growth), where one
    // shared-data entry per key would add 100,000 entries of ~150 bytes (about 15 MB).
    assert!(
        growth < 4 * 1024 * 1024,
        "heap grew by {growth} bytes over {KEYS} keys"
    );
}

fn an_abusive_client_costs_no_shim_calls_after_its_first_refusal(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &config(json!([
            { "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": 3, "period": "1m" }
        ])),
    );
    let url = stack.envoy.url("/");
    let statuses: Vec<u16> = (0..30)
        .map(|_| get(&url, &[("x-api-key", "abuser")]).status)
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 3);
    let refused = get(&url, &[("x-api-key", "abuser")]);
    assert_eq!(refused.status, 429);
    assert!(refused.number("retry-after") >= 1);
    // 3 admitted by the shim, the last of them leaving no token: every later request
    // (27 more, then one) was refused from the deny cache without asking the shim.
    assert_eq!(stack.envoy.stat(&host.stat("per-key.shim_checks")), 3);
    assert_eq!(stack.envoy.stat(&host.stat("per-key.deny_cache_hits")), 28);
    // A polite client is unaffected.
    assert_eq!(get(&url, &[("x-api-key", "polite")]).status, 200);
}

fn leases_cut_shim_calls_and_bound_over_admission_across_two_envoys(host: FilterHost) {
    const LIMIT: usize = 60;
    const LEASE: usize = 10;
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let config = config(
        json!([{ "name": "leased", "key": [{ "header": "x-api-key" }], "limit": LIMIT,
                                  "period": "1h", "lease": { "size": LEASE, "ttl": "1m" } }]),
    );
    let envoys = [
        host.start_envoy(shim.port, &config),
        host.start_envoy(shim.port, &config),
    ];
    let urls = [envoys[0].url("/"), envoys[1].url("/")];
    let mut admitted = 0;
    for i in 0..2 * LIMIT {
        admitted += usize::from(get(&urls[i % 2], &[("x-api-key", "k")]).status == 200);
    }
    let calls: u64 = envoys
        .iter()
        .map(|e| e.stat(&host.stat("leased.shim_checks")))
        .sum();
    let lease_hits: u64 = envoys
        .iter()
        .map(|e| e.stat(&host.stat("leased.lease_hits")))
        .sum();
    eprintln!(
        "leases: {admitted} admitted of {} requests, {calls} shim calls, {lease_hits} served from leases",
        2 * LIMIT
    );
    // Tokens are charged in Redis before they are spent, so nothing is admitted over the
    // limit; what a lease holds in one Envoy can be refused in the other (at most one
    // lease per Envoy and worker).
    assert!(admitted <= LIMIT, "{admitted} admitted");
    assert!(admitted >= LIMIT - 2 * 2 * LEASE, "{admitted} admitted");
    assert!(
        lease_hits as usize >= admitted - (admitted / LEASE + 4),
        "{lease_hits} lease hits"
    );
    // Without leases this would be one call per admitted request.
    assert!(
        (calls as usize) < admitted / 3,
        "{calls} shim calls for {admitted} admitted"
    );
}

/// A listener that accepts connections and never answers: a shim slower than any timeout.
fn blackhole() -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(Mutex::new(Vec::new()));
    let stop_flag = stop.clone();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !stop_flag.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => held.lock().unwrap().push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    (port, stop)
}

/// One rule per failure mode, each keyed on its own header.
fn failure_mode_config(timeout: &str) -> Value {
    let rule = |name: &str, header: &str, extra: Value| {
        let mut rule = json!({ "name": name, "key": [{ "header": header }], "limit": 1000, "period": "1m" });
        for (k, v) in extra.as_object().unwrap() {
            rule[k] = v.clone();
        }
        rule
    };
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": timeout,
        "deny_cache": false,
        "rules": [
            rule("open", "x-open", json!({ "failure_mode": "open" })),
            rule("closed", "x-closed", json!({ "failure_mode": "closed" })),
            rule("local", "x-local", json!({ "failure_mode": "local", "fallback": { "limit": 3, "period": "1h" } })),
        ]
    })
}

/// Longest a request may take in the failure-mode tests. Their plugin timeouts are at
/// most 1 s; a request left paused would wait for the test client's 30 s. Anything in
/// between is an answer given per the failure mode, on however loaded a machine.
const NOT_HUNG: Duration = Duration::from_secs(10);

/// Sends one request per mode (a fresh key each time) and checks each answers as its
/// mode says, without being left paused.
fn assert_failure_modes(envoy: &Envoy, round: &str, local_expected: &[u16]) {
    let url = envoy.url("/");
    let timed = |header: &str, key: &str| {
        let started = Instant::now();
        let reply = get(&url, &[(header, key)]);
        assert!(
            started.elapsed() < NOT_HUNG,
            "{header} took {:?}",
            started.elapsed()
        );
        reply
    };
    let open = timed("x-open", &format!("{round}-o"));
    assert_eq!(
        (open.status, open.header("x-ratelimit-limit")),
        (200, None),
        "{round}: open"
    );
    assert_eq!(
        timed("x-closed", &format!("{round}-c")).status,
        503,
        "{round}: closed"
    );
    let local: Vec<u16> = local_expected
        .iter()
        .map(|_| timed("x-local", &format!("{round}-l")).status)
        .collect();
    assert_eq!(local, local_expected, "{round}: local fallback of 3");
}

fn assert_recovered(envoy: &Envoy) {
    wait_until("recovery", Duration::from_secs(10), || {
        get(&envoy.url("/"), &[("x-closed", "after")]).header("x-ratelimit-limit") == Some("1000")
    });
}

fn killing_and_restarting_redis_applies_each_failure_mode_then_recovers(host: FilterHost) {
    let mut stack = Stack::start_on(host, &failure_mode_config("1s"));
    assert_eq!(get(&stack.envoy.url("/"), &[("x-closed", "before")]).status, 200);
    stack.redis.stop();
    assert_failure_modes(&stack.envoy, "redis-down", &[200, 200, 200, 429]);
    stack.redis.restart();
    assert_recovered(&stack.envoy);
}

fn killing_and_restarting_the_shim_applies_each_failure_mode_then_recovers(host: FilterHost) {
    let mut stack = Stack::start_restartable_on(host, &failure_mode_config("1s"));
    stack.shim.kill();
    assert_failure_modes(&stack.envoy, "shim-down", &[200, 200, 200, 429]);
    stack.shim.restart();
    assert_recovered(&stack.envoy);
}

fn a_shim_slower_than_the_timeout_applies_each_failure_mode(host: FilterHost) {
    let (port, stop) = blackhole();
    let envoy = host.start_envoy(port, &failure_mode_config("200ms"));
    assert_failure_modes(&envoy, "slow", &[200, 200, 200, 429]);
    assert!(envoy.stat(&host.stat("closed.shim_timeouts")) >= 1);
    assert!(envoy.stat(&host.stat("closed.failed_closed")) >= 1);
    assert!(envoy.stat(&host.stat("open.failed_open")) >= 1);
    stop.store(true, Ordering::Relaxed);
}

fn traffic_during_a_redis_outage_never_hangs(host: FilterHost) {
    let mut stack = Stack::start_on(host, &failure_mode_config("300ms"));
    let url = stack.envoy.url("/");
    let running = Arc::new(AtomicBool::new(true));
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let (url, running) = (url.clone(), running.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                let mut i = 0;
                while running.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let status = get(&url, &[("x-closed", &format!("t{t}-{i}"))]).status;
                    statuses.push((status, started.elapsed()));
                    i += 1;
                }
                statuses
            })
        })
        .collect();
    wait_until("traffic", Duration::from_secs(5), || {
        stack.envoy.stat(&host.stat("closed.allowed")) > 20
    });
    stack.redis.stop();
    wait_until("refusals while Redis is down", Duration::from_secs(5), || {
        stack.envoy.stat(&host.stat("closed.failed_closed")) > 20
    });
    stack.redis.restart();
    let allowed_before = stack.envoy.stat(&host.stat("closed.allowed"));
    wait_until("admissions after Redis returns", Duration::from_secs(10), || {
        stack.envoy.stat(&host.stat("closed.allowed")) > allowed_before + 20
    });
    running.store(false, Ordering::Relaxed);
    let statuses: Vec<(u16, Duration)> = senders.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|(s, _)| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    let slowest = statuses.iter().map(|(_, d)| *d).max().unwrap();
    assert!(slowest < NOT_HUNG, "a request took {slowest:?}");
}

fn a_shim_cluster_with_no_healthy_endpoint_applies_each_failure_mode(host: FilterHost) {
    let mut bootstrap = host.envoy_config(refusing_port(), &failure_mode_config("500ms"));
    let cluster = &mut bootstrap["static_resources"]["clusters"][0];
    cluster["health_checks"] = json!([{ "timeout": "0.1s", "interval": "0.2s", "unhealthy_threshold": 1,
                                        "healthy_threshold": 1, "tcp_health_check": {} }]);
    cluster["common_lb_config"] = json!({ "healthy_panic_threshold": { "value": 0 } });
    let envoy = Envoy::start_bootstrap(&bootstrap);
    assert_failure_modes(&envoy, "no-healthy-endpoint", &[200, 200, 200, 429]);
}
