//! Mixed fleets: one real Envoy loading the Wasm filter and one real Envoy with the native
//! `envoy.filters.http.ratelimit` filter, against one shim (its HTTP checks and its
//! rate-limit service) and one Redis. Descriptors naming a filter rule
//! (`rate_limit.filter_rule`, with `--rls-filter-config`) are counted on that rule's
//! counter, so a client meets one limit whichever Envoy answers it.

mod support;

use serde_json::{json, Value};
use std::fs;
use support::*;

const TOKEN: &str = "mixed-fleet-token";

/// The Wasm filter's rules: the API key on `/key` (a token bucket) and the client's IP on
/// `/ip` (a fixed window). Days, so nothing refills or ends during a test. No local
/// bucket, no lease: every request is the shim's exact decision.
fn plugin_config() -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "shim_token": TOKEN,
        // Generous: on a loaded two-core machine a slow answer must not turn into a
        // fail-open admission and blur the counts.
        "timeout": "5s",
        "rules": [
            { "name": "per-api-key", "match": { "path_prefix": "/key" },
              "key": [{ "header": "x-api-key" }], "limit": 5, "period": "1d" },
            { "name": "per-ip", "match": { "path_prefix": "/ip" },
              "key": ["client_ip"], "algorithm": "fixed_window", "limit": 4, "period": "1d" }
        ]
    })
}

/// The same limits for the native filter, each sharing its rule's counter.
const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: { unit: day, requests_per_unit: 5, algorithm: token_bucket, filter_rule: per-api-key }
  - key: remote_address
    rate_limit: { unit: day, requests_per_unit: 4, filter_rule: per-ip }
"#;

/// Writes the two configurations; their paths, as the shim's flags take them.
fn write_configs(limits: &str) -> (String, String) {
    let dir = scratch("mixed-fleet");
    let (yaml, plugin) = (dir.join("limits.yaml"), dir.join("plugin.json"));
    fs::write(&yaml, limits).unwrap();
    fs::write(&plugin, plugin_config().to_string()).unwrap();
    let path = |p: std::path::PathBuf| p.to_str().unwrap().to_string();
    (path(yaml), path(plugin))
}

/// Redis, the shim on both listeners, and the two Envoys.
struct Fleet {
    redis: Redis,
    _shim: Shim,
    _grpc: ClaimedPort,
    _upstream: Upstream,
    wasm: Envoy,
    native: Envoy,
}

impl Fleet {
    fn start() -> Fleet {
        let redis = Redis::start();
        let grpc = claim_port();
        let listen = format!("127.0.0.1:{}", grpc.port);
        let (yaml, plugin) = write_configs(LIMITS);
        let shim = Shim::start(
            &redis.url(),
            &[
                "--grpc-listen",
                &listen,
                "--rls-config",
                &yaml,
                "--rls-filter-config",
                &plugin,
                "--token",
                TOKEN,
            ],
        );
        let upstream = Upstream::start();
        let wasm = Envoy::start(shim.port, &plugin_config());
        let native = Envoy::start_bootstrap(&native_envoy_config(grpc.port, upstream.port));
        Fleet {
            redis,
            _shim: shim,
            _grpc: grpc,
            _upstream: upstream,
            wasm,
            native,
        }
    }

    /// `path` on the Wasm Envoy for even `i`, on the native one for odd.
    fn url(&self, i: usize, path: &str) -> String {
        [&self.wasm, &self.native][i % 2].url(path)
    }
}

/// The native filter in front of a real upstream (it applies a route's rate limits only
/// on a route to a cluster): `/key` sends the `x-api-key` header, `/ip` the client's
/// address, as descriptors of domain `edge`.
fn native_envoy_config(grpc_port: u16, upstream_port: u16) -> Value {
    let route = |prefix: &str, action: Value| {
        json!({ "match": { "prefix": prefix },
                "route": { "cluster": "upstream", "rate_limits": [{ "actions": [action] }] } })
    };
    let cluster = |name: &str, port: u16, http2: bool| {
        let mut cluster = json!({ "name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": { "cluster_name": name,
                "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(port) } }] }] } });
        if http2 {
            cluster["typed_extension_protocol_options"] = json!({ "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} } } });
        }
        cluster
    };
    json!({
        "static_resources": {
            "listeners": [{
                "name": "native",
                "address": loopback(0),
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "native",
                        "route_config": { "virtual_hosts": [{
                            "name": "native", "domains": ["*"],
                            "routes": [
                                route("/key", json!({ "request_headers": { "header_name": "x-api-key", "descriptor_key": "api_key" } })),
                                route("/ip", json!({ "remote_address": {} })),
                            ]
                        }]},
                        "http_filters": [
                            { "name": "envoy.filters.http.ratelimit",
                              "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                                "domain": "edge",
                                "timeout": "5s",
                                "failure_mode_deny": true,
                                "rate_limit_service": {
                                    "transport_api_version": "V3",
                                    "grpc_service": {
                                        "envoy_grpc": { "cluster_name": "rls" },
                                        "initial_metadata": [{ "key": "x-ratelimit-token", "value": TOKEN }]
                                    }
                                }
                              } },
                            { "name": "envoy.filters.http.router",
                              "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } }
                        ]
                    }
                }]}]
            }],
            "clusters": [cluster("rls", grpc_port, true), cluster("upstream", upstream_port, false)]
        },
        "admin": { "address": loopback(0) }
    })
}

fn statuses(replies: &[Reply]) -> Vec<u16> {
    replies.iter().map(|r| r.status).collect()
}

#[test]
fn one_api_key_meets_one_limit_across_the_wasm_and_the_native_filter() {
    let fleet = Fleet::start();
    // Interleaved, one at a time: each path sees what the other spent.
    let alice: Vec<Reply> = (0..12)
        .map(|i| get(&fleet.url(i, "/key"), &[("x-api-key", "alice")]))
        .collect();
    assert_eq!(
        statuses(&alice),
        [200, 200, 200, 200, 200, 429, 429, 429, 429, 429, 429, 429],
        "5 in total, not 5 per path"
    );
    // Another key is its own client, on both paths.
    assert_eq!(get(&fleet.url(1, "/key"), &[("x-api-key", "bob")]).status, 200);
    assert_eq!(get(&fleet.url(0, "/key"), &[("x-api-key", "bob")]).status, 200);

    // Concurrently, through both Envoys (two workers each): exactly the limit.
    let urls = [fleet.url(0, "/key"), fleet.url(1, "/key")];
    let carol = concurrently(30, move |i| get(&urls[i % 2], &[("x-api-key", "carol")]));
    assert_eq!(count_status(&carol, 200), 5, "{:?}", statuses(&carol));
    assert_eq!(count_status(&carol, 429), 25);

    // One counter per client, the filter's: the descriptors kept none of their own.
    let keys = fleet.redis.cli(&["KEYS", "*"]);
    let counters: Vec<&str> = keys.lines().filter(|k| k.starts_with("rl:")).collect();
    assert_eq!(counters.len(), 3, "alice, bob, carol: {keys}");
    assert!(
        counters
            .iter()
            .all(|k| k.starts_with("rl:per-api-key/tb86400000:{")),
        "{keys}"
    );
}

#[test]
fn one_client_ip_meets_one_limit_across_the_wasm_and_the_native_filter() {
    let fleet = Fleet::start();
    // Both Envoys see this test's requests from 127.0.0.1: the filter's client_ip, and
    // the native filter's remote_address descriptor.
    let replies: Vec<Reply> = (0..10).map(|i| get(&fleet.url(i, "/ip"), &[])).collect();
    assert_eq!(
        statuses(&replies),
        [200, 200, 200, 200, 429, 429, 429, 429, 429, 429],
        "4 in total, not 4 per path"
    );
    let keys = fleet.redis.cli(&["KEYS", "*"]);
    assert!(
        keys.contains("rl:per-ip/fw86400000:{") && !keys.contains("rl:rls/"),
        "{keys}"
    );
}

#[test]
fn a_descriptor_that_would_count_otherwise_than_its_rule_is_refused_at_start() {
    let doubled = LIMITS.replace("requests_per_unit: 5", "requests_per_unit: 10");
    let (yaml, plugin) = write_configs(&doubled);
    let refused = Shim::refusal(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--rls-config",
        &yaml,
        "--rls-filter-config",
        &plugin,
    ]);
    assert!(
        refused.contains("limits.yaml: descriptors[0].rate_limit.requests_per_unit: 10 here, but rule \"per-api-key\" allows 5"),
        "{refused}"
    );
}
