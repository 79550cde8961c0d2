//! The shim as Envoy's rate-limit service: real Envoy's native
//! `envoy.filters.http.ratelimit` filter asking the shim's `--grpc-listen` over gRPC,
//! with limits in envoyproxy/ratelimit's YAML format (`--rls-config`), counted in real
//! Redis (standalone and a three-master cluster). Envoy routes to a real upstream: the
//! filter applies a route's rate limits only on a route to a cluster.

mod support;

use serde_json::{json, Value};
use std::fs;
use std::time::{Duration, Instant};
use support::*;

const TOKEN: &str = "rls-test-token";

/// The limits every test runs with. Days, so no window ends during a test.
const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: remote_address
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: generic_key
    value: global
    rate_limit: { unit: day, requests_per_unit: 50 }
  - key: generic_key
    value: shared
    rate_limit: { unit: day, requests_per_unit: 1000 }
"#;

/// The shim serving the rate-limit service on a claimed port, with `LIMITS`.
fn rls_shim(redis_urls: &str, extra: &[&str]) -> (Shim, ClaimedPort) {
    let mut args = vec!["--token", TOKEN];
    args.extend(extra);
    Shim::start_grpc(redis_urls, LIMITS, &args)
}

/// Routes by path, each with its rate-limit actions: `/key` the `x-api-key` header,
/// `/ip` the client's address, `/global` and `/both` a generic key (`/both` also the
/// API key: two descriptors in one request).
fn envoy_config(grpc_port: u16, upstream_port: u16, failure_mode_deny: bool) -> Value {
    let route = |prefix: &str, actions: Vec<Value>| {
        json!({ "match": { "prefix": prefix },
                "route": { "cluster": "upstream",
                           "rate_limits": actions.into_iter().map(|a| json!({ "actions": [a] })).collect::<Vec<_>>() } })
    };
    let api_key = json!({ "request_headers": { "header_name": "x-api-key", "descriptor_key": "api_key" } });
    let generic = |value: &str| json!({ "generic_key": { "descriptor_value": value } });
    let filter = json!({ "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "edge",
            "timeout": "1s",
            "failure_mode_deny": failure_mode_deny,
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {
                    "envoy_grpc": { "cluster_name": "rls" },
                    "initial_metadata": [{ "key": "x-ratelimit-token", "value": TOKEN }]
                }
            }
        } });
    let routes = json!([
        route("/key", vec![api_key.clone()]),
        route("/ip", vec![json!({ "remote_address": {} })]),
        route("/global", vec![generic("global")]),
        route("/both", vec![api_key, generic("shared")]),
    ]);
    native_filter_bootstrap(filter, routes, "rls", grpc_port, upstream_port)
}

/// `rlshim_rls_requests_total` of `outcome`, from the shim's metrics.
fn rls_calls(shim: &Shim, outcome: &str) -> u64 {
    let series = format!("rlshim_rls_requests_total{{outcome=\"{outcome}\"}} ");
    get(&shim.url("/metrics"), &[])
        .body
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
        .unwrap_or_else(|| panic!("no {series}"))
}

fn statuses(replies: &[Reply]) -> Vec<u16> {
    replies.iter().map(|r| r.status).collect()
}

#[test]
fn header_address_and_generic_key_descriptors_are_limited_with_true_headers() {
    let redis = Redis::start();
    let (shim, grpc) = rls_shim(&redis.url(), &[]);
    let upstream = Upstream::start();
    let envoy = Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true));

    let key_a: Vec<Reply> = (0..5)
        .map(|_| get(&envoy.url("/key"), &[("x-api-key", "alice")]))
        .collect();
    assert_eq!(statuses(&key_a), [200, 200, 200, 429, 429]);
    // Envoy's own headers, from the shim's current_limit, limit_remaining and
    // duration_until_reset.
    let remaining: Vec<u64> = key_a.iter().map(|r| r.number("x-ratelimit-remaining")).collect();
    assert_eq!(remaining, [2, 1, 0, 0, 0]);
    let limit = key_a[0].header("x-ratelimit-limit").unwrap();
    assert!(limit.starts_with("3, 3;w=86400"), "{limit}");
    let reset = key_a[0].number("x-ratelimit-reset");
    assert!((1..=86_400).contains(&reset), "reset {reset}");
    assert_eq!(
        get(&envoy.url("/key"), &[("x-api-key", "bob")]).status,
        200,
        "each header value is its own counter"
    );

    let by_address: Vec<u16> = (0..3).map(|_| get(&envoy.url("/ip"), &[]).status).collect();
    assert_eq!(by_address, [200, 200, 429]);

    // The raw values never reach Redis: every key is hashed.
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(!keys.contains("alice") && !keys.contains("127.0.0.1"), "{keys}");
    assert!(keys.contains("rl:rls/fw86400000:{"), "{keys}");

    // A request with two descriptors is all or nothing: once its API key is spent, the
    // shared counter is not charged by the requests refused.
    let both: Vec<u16> = (0..5)
        .map(|_| get(&envoy.url("/both"), &[("x-api-key", "carol")]).status)
        .collect();
    assert_eq!(both, [200, 200, 200, 429, 429]);
    let shared = get(&envoy.url("/both"), &[("x-api-key", "dave")]);
    assert_eq!(shared.status, 200);
    assert_eq!(
        shared.number("x-ratelimit-remaining"),
        2,
        "the descriptor closest to its limit: dave's key, 3 - 1"
    );

    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(
        metrics.contains("rlshim_rls_requests_total{outcome=\"over_limit\"} 5\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rlshim_rls_descriptors_total{outcome=\"over_limit\"} 5\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rlshim_rls_requests_total{outcome=\"unauthorized\"} 0\n"),
        "{metrics}"
    );
}

#[test]
fn exactly_the_limit_passes_across_two_envoys_of_two_workers() {
    let redis = Redis::start();
    let (_shim, grpc) = rls_shim(&redis.url(), &[]);
    let upstream = Upstream::start();
    let envoys = [
        Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true)),
        Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true)),
    ];
    let urls: Vec<String> = envoys.iter().map(|e| e.url("/global")).collect();
    let replies = concurrently(160, move |i| get(&urls[i % 2], &[]));
    assert_eq!(count_status(&replies, 200), 50, "{:?}", statuses(&replies));
    assert_eq!(count_status(&replies, 429), 110);
}

/// Envoy applies its failure mode when the shim is gone, within the filter's timeout:
/// `failure_mode_deny: false` lets requests through, `true` refuses them (500).
#[test]
fn a_killed_shim_leaves_each_envoy_to_its_failure_mode_within_the_timeout() {
    let redis = Redis::start();
    let (mut shim, grpc) = rls_shim(&redis.url(), &[]);
    let upstream = Upstream::start();
    let open = Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, false));
    let closed = Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true));
    // Traffic on both while the shim is killed, each request its own API key (so every
    // decision admits): every answer is a decision or the Envoy's failure mode, and none
    // waits past the filter's timeout (1 s) by much.
    let (open_url, closed_url) = (open.url("/key"), closed.url("/key"));
    let traffic = std::thread::spawn(move || {
        let started = Instant::now();
        let mut seen = Vec::new();
        let mut key = 0;
        while started.elapsed() < Duration::from_secs(3) {
            for (mode, url) in [("open", &open_url), ("closed", &closed_url)] {
                key += 1;
                let sent = Instant::now();
                let status = get(url, &[("x-api-key", &format!("key-{key}"))]).status;
                seen.push((mode, status, sent.elapsed()));
            }
        }
        seen
    });
    wait_until("traffic decided by the shim", Duration::from_secs(10), || {
        rls_calls(&shim, "ok") >= 10
    });
    shim.kill();
    let seen = traffic.join().unwrap();
    for (mode, status, took) in &seen {
        let expected: &[u16] = if *mode == "open" { &[200] } else { &[200, 500] };
        assert!(expected.contains(status), "{mode}: {status}");
        assert!(
            *took < Duration::from_millis(1_500),
            "{mode}: answered in {took:?}"
        );
    }
    assert!(seen
        .iter()
        .any(|(mode, status, _)| *mode == "closed" && *status == 500));

    for _ in 0..5 {
        let sent = Instant::now();
        assert_eq!(get(&open.url("/ip"), &[]).status, 200, "failure_mode_deny: false");
        assert_eq!(
            get(&closed.url("/ip"), &[]).status,
            500,
            "failure_mode_deny: true"
        );
        assert!(sent.elapsed() < Duration::from_secs(3));
    }
}

#[test]
fn descriptors_on_different_cluster_slots_are_all_or_nothing_and_exact() {
    let cluster = RedisCluster::start();
    let (shim, grpc) = rls_shim(&cluster.urls(), &["--redis-mode", "cluster"]);
    wait_until("shim ready on the cluster", Duration::from_secs(20), || {
        get(&shim.url("/readyz"), &[]).status == 200
    });
    let upstream = Upstream::start();
    let envoys = [
        Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true)),
        Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true)),
    ];
    // The API key's counter (3) and the shared one (1000) have their own hash tags.
    let urls: Vec<String> = envoys.iter().map(|e| e.url("/both")).collect();
    let replies = concurrently(40, move |i| get(&urls[i % 2], &[("x-api-key", "erin")]));
    assert_eq!(count_status(&replies, 200), 3, "{:?}", statuses(&replies));
    assert_eq!(count_status(&replies, 429), 37);
    // The refused requests' charges on the shared counter were refunded: a new key sees
    // exactly the three admitted ones taken from it.
    let global = envoys[0].url("/global");
    let exact = concurrently(80, move |_| get(&global, &[]));
    assert_eq!(count_status(&exact, 200), 50, "{:?}", statuses(&exact));
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(metrics.contains("rlshim_refund_failures_total 0\n"), "{metrics}");
    let shared_left = get(&envoys[1].url("/both"), &[("x-api-key", "frank")]);
    assert_eq!(shared_left.status, 200);
    assert!(
        shared_left
            .header("x-ratelimit-limit")
            .unwrap()
            .contains("1000;w=86400"),
        "{shared_left:?}"
    );
}

/// The gRPC listener is served as the HTTP one is: idle connections past the cap (shared
/// by both listeners) make room, a silent one is closed at the header timeout, and Envoy
/// still gets its decisions.
#[test]
fn the_grpc_listener_holds_the_connection_cap_and_the_header_timeout() {
    let redis = Redis::start();
    let (shim, grpc) = rls_shim(
        &redis.url(),
        &["--max-connections", "20", "--header-timeout-ms", "1000"],
    );
    let upstream = Upstream::start();
    let mut idle: Vec<std::net::TcpStream> = (0..50)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", grpc.port)).unwrap())
        .collect();
    let envoy = Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true));
    let decided: Vec<u16> = (0..3).map(|_| get(&envoy.url("/ip"), &[]).status).collect();
    assert_eq!(decided, [200, 200, 429], "decisions past 50 idle connections");
    let closed = idle.iter_mut().map(is_closed).filter(|closed| *closed).count();
    assert!(
        closed >= 30,
        "only {closed} of 50 idle connections closed by the cap"
    );
    wait_until(
        "the rest closed at the header timeout",
        Duration::from_secs(5),
        || idle.iter_mut().all(is_closed),
    );
    let metrics = get(&shim.url("/metrics"), &[]).body;
    assert!(
        !metrics.contains("rlshim_connections_closed_total{reason=\"header_timeout\"} 0\n"),
        "{metrics}"
    );
    assert_eq!(
        get(&envoy.url("/ip"), &[]).status,
        429,
        "Envoy's connection was kept"
    );
}

#[test]
fn a_configuration_it_cannot_run_is_refused_at_start_naming_the_field() {
    let dir = scratch("rls-refused");
    let config = dir.join("limits.yaml");
    fs::write(
        &config,
        "domain: edge\ndescriptors:\n  - key: api_key\n    quota_mode: sometimes\n    rate_limit: { unit: day, requests_per_unit: 3 }\n",
    )
    .unwrap();
    let refused = Shim::refusal(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--rls-config",
        config.to_str().unwrap(),
    ]);
    assert!(refused.contains("descriptors[0].quota_mode"), "{refused}");
    assert!(refused.contains("limits.yaml"), "{refused}");
}

#[test]
fn the_example_envoy_rls_yaml_passes_envoy_validation() {
    let (valid, output) = envoy_validate(&repo_root().join("envoy-rls.yaml"));
    assert!(valid, "{output}");
}

/// `LIMITS` with the API key's limit at `per_day`.
fn limits_with_api_key_at(per_day: u32) -> String {
    LIMITS.replace(
        "requests_per_unit: 3 }",
        &format!("requests_per_unit: {per_day} }}"),
    )
}

/// The shim with `--rls-config path` (a file, or a directory) and Envoy's native filter
/// in front of it.
fn rls_shim_and_envoy(redis: &Redis, path: &std::path::Path) -> (Shim, ClaimedPort, Upstream, Envoy) {
    let grpc = claim_port();
    let listen = format!("127.0.0.1:{}", grpc.port);
    let shim = Shim::start(
        &redis.url(),
        &[
            "--token",
            TOKEN,
            "--grpc-listen",
            &listen,
            "--rls-config",
            path.to_str().unwrap(),
        ],
    );
    let upstream = Upstream::start();
    let envoy = Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, true));
    (shim, grpc, upstream, envoy)
}

/// Polls, each time with an API key not used before, until Envoy's `X-RateLimit-Limit`
/// (the shim's `current_limit`) says `per_day`.
fn wait_for_api_key_limit(envoy: &Envoy, per_day: u32) {
    let expected = format!("{per_day}, {per_day};w=86400");
    let mut probe = 0;
    wait_until("the reloaded limit", Duration::from_secs(15), || {
        probe += 1;
        let reply = get(&envoy.url("/key"), &[("x-api-key", &format!("probe-{probe}"))]);
        reply
            .header("x-ratelimit-limit")
            .is_some_and(|limit| limit.starts_with(&expected))
    });
}

/// `rlshim_rls_config_reloads_total` of `outcome`.
fn reloads(shim: &Shim, outcome: &str) -> u64 {
    let series = format!("rlshim_rls_config_reloads_total{{outcome=\"{outcome}\"}} ");
    get(&shim.url("/metrics"), &[])
        .body
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
        .unwrap_or_else(|| panic!("no {series}"))
}

#[test]
fn a_file_rewritten_in_place_applies_its_new_limit() {
    let redis = Redis::start();
    let file = scratch("rls-reload-file").join("limits.yaml");
    fs::write(&file, limits_with_api_key_at(3)).unwrap();
    let (shim, _grpc, _upstream, envoy) = rls_shim_and_envoy(&redis, &file);
    wait_for_api_key_limit(&envoy, 3);

    fs::write(&file, limits_with_api_key_at(5)).unwrap();
    wait_for_api_key_limit(&envoy, 5);
    let admitted: Vec<u16> = (0..6)
        .map(|_| get(&envoy.url("/key"), &[("x-api-key", "after-reload")]).status)
        .collect();
    assert_eq!(admitted, [200, 200, 200, 200, 200, 429]);
    assert_eq!((reloads(&shim, "ok"), reloads(&shim, "refused")), (1, 0));
}

#[test]
fn a_directory_swapped_through_a_symlink_applies_its_new_limit() {
    // A Kubernetes ConfigMap's volume, as upstream's deployments see it change: each
    // file a link through `..data`, a link to the current version's directory, which
    // is replaced by renaming a new link over it.
    let dir = scratch("rls-reload-dir").join("config");
    for (version, per_day) in [("..v1", 3), ("..v2", 7)] {
        fs::create_dir_all(dir.join(version)).unwrap();
        fs::write(
            dir.join(version).join("limits.yaml"),
            limits_with_api_key_at(per_day),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/limits.yaml", dir.join("limits.yaml")).unwrap();
    let redis = Redis::start();
    let (shim, _grpc, _upstream, envoy) = rls_shim_and_envoy(&redis, &dir);
    wait_for_api_key_limit(&envoy, 3);

    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    wait_for_api_key_limit(&envoy, 7);
    assert_eq!(reloads(&shim, "ok"), 1);
}

#[test]
fn a_bad_rewrite_keeps_the_last_good_limit_and_counts_a_refused_reload() {
    let redis = Redis::start();
    let file = scratch("rls-reload-bad").join("limits.yaml");
    fs::write(&file, limits_with_api_key_at(3)).unwrap();
    let (shim, _grpc, _upstream, envoy) = rls_shim_and_envoy(&redis, &file);

    let bad = limits_with_api_key_at(5).replace(
        "  - key: remote_address\n",
        "  - key: remote_address\n    quota_mode: sometimes\n",
    );
    fs::write(&file, bad).unwrap();
    wait_until("a refused reload", Duration::from_secs(15), || {
        reloads(&shim, "refused") == 1
    });
    let kept: Vec<u16> = (0..4)
        .map(|_| get(&envoy.url("/key"), &[("x-api-key", "kept")]).status)
        .collect();
    assert_eq!(
        kept,
        [200, 200, 200, 429],
        "the last good limit, 3, still applies"
    );
    assert_eq!(reloads(&shim, "ok"), 0);
}
