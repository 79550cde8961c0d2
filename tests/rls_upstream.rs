//! envoyproxy/ratelimit's configuration features through real Envoy's native `ratelimit`
//! filter and the shim's `--grpc-listen`, counted in real Redis: the limits of
//! `tests/rls-upstream/` (written here in upstream's format, one domain split across two
//! files and merged by `--rls-merge-domains`) with wildcard values, a shared threshold,
//! quota mode; then the service-wide switches upstream sets in its environment
//! (`--rls-shadow-mode`, `--rls-upstream-counting`).

mod support;

use serde_json::{json, Value};
use support::*;

/// `tests/rls-upstream/`.
fn upstream_format_limits() -> String {
    repo_root()
        .join("tests/rls-upstream")
        .to_str()
        .unwrap()
        .to_string()
}

/// A route's prefix and its descriptors, each a list of `(header, descriptor key)`.
type Route<'a> = (&'a str, Vec<Vec<(&'a str, &'a str)>>);

/// Envoy's native filter for the domain `edge`, a route per feature: each prefix's
/// rate limits are `request_headers` actions, a header each, one descriptor per inner
/// list of `(header, descriptor key)` pairs.
fn envoy_config(grpc_port: u16, upstream_port: u16, routes: &[Route]) -> Value {
    let routes: Vec<Value> = routes
        .iter()
        .map(|(prefix, descriptors)| {
            let rate_limits: Vec<Value> = descriptors
                .iter()
                .map(|entries| {
                    let actions: Vec<Value> = entries
                        .iter()
                        .map(|(header, key)| {
                            json!({ "request_headers": { "header_name": header, "descriptor_key": key } })
                        })
                        .collect();
                    json!({ "actions": actions })
                })
                .collect();
            json!({ "match": { "prefix": prefix },
                    "route": { "cluster": "upstream", "rate_limits": rate_limits } })
        })
        .collect();
    let filter = json!({ "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "edge",
            "timeout": "1s",
            "failure_mode_deny": true,
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": { "envoy_grpc": { "cluster_name": "rls" } }
            }
        } });
    native_filter_bootstrap(filter, json!(routes), "rls", grpc_port, upstream_port)
}

/// The shim with `--rls-config config` and `flags`, and Envoy with `routes` before it.
fn start(redis: &Redis, config: &str, flags: &[&str], routes: &[Route]) -> (Shim, Upstream, Envoy) {
    let grpc = claim_port();
    let listen = format!("127.0.0.1:{}", grpc.port);
    let mut args = vec!["--grpc-listen", &listen, "--rls-config", config];
    args.extend(flags);
    let shim = Shim::start(&redis.url(), &args);
    let upstream = Upstream::start();
    let envoy = Envoy::start_bootstrap(&envoy_config(grpc.port, upstream.port, routes));
    (shim, upstream, envoy)
}

/// The statuses of `count` requests to `path` with `headers`.
fn statuses(envoy: &Envoy, path: &str, headers: &[(&str, &str)], count: usize) -> Vec<u16> {
    (0..count)
        .map(|_| get(&envoy.url(path), headers).status)
        .collect()
}

/// `rlshim_rls_descriptors_total` of `outcome`.
fn descriptors(shim: &Shim, outcome: &str) -> u64 {
    let series = format!("rlshim_rls_descriptors_total{{outcome=\"{outcome}\"}} ");
    get(&shim.url("/metrics"), &[])
        .body
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.parse().ok())
        .unwrap_or_else(|| panic!("no {series}"))
}

#[test]
fn wildcards_shared_thresholds_and_quota_mode_limit_through_envoy() {
    let redis = Redis::start();
    let routes = [
        ("/path", vec![vec![("x-path", "path")]]),
        ("/file", vec![vec![("x-file", "file")]]),
        ("/tenant", vec![vec![("x-tenant", "tenant"), ("x-user", "user")]]),
        (
            "/quota",
            vec![vec![("x-service", "service")], vec![("x-tier", "tier")]],
        ),
        ("/region", vec![vec![("x-region", "region")]]),
    ];
    let (shim, _upstream, envoy) = start(
        &redis,
        &upstream_format_limits(),
        &["--rls-merge-domains"],
        &routes,
    );

    // `/api/*/items`: each matching value its own counter of 2; an exact value first.
    let path = |value| statuses(&envoy, "/path", &[("x-path", value)], 3);
    assert_eq!(path("/api/1/items"), [200, 200, 429]);
    assert_eq!(path("/api/2/items"), [200, 200, 429], "its own counter");
    assert_eq!(
        path("/api/health/items"),
        [200, 200, 200],
        "the exact value: unlimited"
    );
    assert_eq!(path("/api/1/other"), [200, 200, 200], "no pattern matches");

    // `files/*` with share_threshold: four files, one counter of 3.
    let files: Vec<u16> = ["files/a.pdf", "files/b.csv", "files/c.txt", "files/d.png"]
        .iter()
        .map(|file| get(&envoy.url("/file"), &[("x-file", file)]).status)
        .collect();
    assert_eq!(files, [200, 200, 200, 429]);

    // `t-*-prod` shares its threshold above the nested `user` limit of 4: two tenants
    // matching the pattern count as one for the same user, another user apart.
    let tenant = |tenant, user| get(&envoy.url("/tenant"), &[("x-tenant", tenant), ("x-user", user)]).status;
    let shared: Vec<u16> = ["t-a-prod", "t-b-prod", "t-a-prod", "t-c-prod", "t-b-prod"]
        .iter()
        .map(|t| tenant(t, "ann"))
        .collect();
    assert_eq!(shared, [200, 200, 200, 200, 429]);
    assert_eq!(tenant("t-a-prod", "bob"), 200);
    assert_eq!(tenant("t-a-dev", "ann"), 200, "no pattern matches: no limit");

    // Quota mode: a service over its limit of 1 refuses alone, not beside a tier under
    // its own quota.
    let quota = |headers: &[(&str, &str)]| statuses(&envoy, "/quota", headers, 3);
    assert_eq!(quota(&[("x-service", "svc-a")]), [200, 429, 429]);
    assert_eq!(
        quota(&[("x-service", "svc-b"), ("x-tier", "gold")]),
        [200, 200, 200]
    );
    assert!(descriptors(&shim, "quota_over_limit") >= 4);

    // The domain's second file, merged: `eu-*` (limit 2) before the value-less key (1).
    assert_eq!(
        statuses(&envoy, "/region", &[("x-region", "eu-west")], 3),
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&envoy, "/region", &[("x-region", "us-east")], 2),
        [200, 429]
    );
}

#[test]
fn the_split_domain_is_refused_without_merging() {
    let refused = Shim::refusal(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--rls-config",
        &upstream_format_limits(),
    ]);
    assert!(
        refused.contains("edge-services.yaml: domain: \"edge\" is already configured"),
        "{refused}"
    );
    assert!(refused.contains("--rls-merge-domains"), "{refused}");
}

/// Two descriptors in one request: `a` (limit 2) and `b` (limit 4).
const TWO_LIMITS: &str = "domain: edge
descriptors:
  - key: a
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: b
    rate_limit: { unit: day, requests_per_unit: 4 }
";

#[test]
fn upstream_counting_charges_each_descriptor_and_the_service_shadow_mode_refuses_nothing() {
    let redis = Redis::start();
    let config = scratch("rls-upstream-counting").join("limits.yaml");
    std::fs::write(&config, TWO_LIMITS).unwrap();
    let config = config.to_str().unwrap();
    let routes = [("/both", vec![vec![("x-a", "a")], vec![("x-b", "b")]])];
    let both = |envoy: &Envoy, a: &str, count| statuses(envoy, "/both", &[("x-a", a), ("x-b", "one")], count);

    // Upstream's counting: `b` is charged by the requests `a` refused, and the one it
    // refuses itself spends the rest of its window.
    let (_shim, _upstream, envoy) = start(&redis, config, &["--rls-upstream-counting"], &routes);
    assert_eq!(both(&envoy, "first", 5), [200, 200, 429, 429, 429]);
    assert_eq!(both(&envoy, "second", 1), [429], "b was charged 4 and filled");
    drop(envoy);

    // The shim's own counting on a fresh counter: b only pays for what was admitted.
    redis.cli(&["FLUSHALL"]);
    let (_shim, _upstream, envoy) = start(&redis, config, &[], &routes);
    assert_eq!(both(&envoy, "first", 5), [200, 200, 429, 429, 429]);
    assert_eq!(both(&envoy, "second", 2), [200, 200], "b was charged 2");
    drop(envoy);

    // The service's shadow mode: every request passes, what would have refused counts.
    redis.cli(&["FLUSHALL"]);
    let (shim, _upstream, envoy) = start(&redis, config, &["--rls-shadow-mode"], &routes);
    assert_eq!(both(&envoy, "first", 4), [200, 200, 200, 200]);
    assert_eq!(descriptors(&shim, "shadow_over_limit"), 2);
}
