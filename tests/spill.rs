//! Spill-over in real Envoy: a request over a spilling rule's limit gets the rule's
//! header and goes on, routed again by Envoy (its route cache cleared) to the route that
//! matches the header; the fallback's own rule limits it there, with no second spill; and
//! a spill header that no route matches gets the router's 404, never a loop. Each runs on
//! both hosts: the Wasm filter, and the dynamic module (which clears the route cache
//! itself).

mod support;

use serde_json::{json, Value};
use support::*;

/// A route answering `body` directly, for requests whose `x-pool` is `pool` (or, with
/// `None`, whatever it is).
fn pool_route(pool: Option<&str>, body: &str) -> Value {
    let mut route = json!({ "match": { "prefix": "/" },
        "direct_response": { "status": 200, "body": { "inline_string": body } } });
    if let Some(pool) = pool {
        route["match"]["headers"] = json!([{ "name": "x-pool", "string_match": { "exact": pool } }]);
    }
    route
}

/// An Envoy whose routes send `x-pool: fallback` to the fallback and requests without an
/// `x-pool` to the primary; any other `x-pool` matches no route.
fn start(host: FilterHost, deny_cache: bool) -> (Redis, Shim, Envoy) {
    let plugin = json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        "deny_cache": deny_cache,
        "rules": [
            { "name": "primary", "key": [{ "header": "x-api-key" }], "limit": 2, "period": "1m",
              "match": { "path_prefix": "/v1/" },
              "on_exceeded": { "spill": { "header": "x-pool", "value": "fallback" } } },
            { "name": "fallback", "key": [{ "header": "x-api-key" }], "limit": 2, "period": "1m",
              "match": { "headers": [{ "name": "x-pool", "value": "fallback" }] },
              "on_exceeded": { "spill": { "header": "x-pool", "value": "elsewhere" } } },
            { "name": "lost", "key": [{ "header": "x-api-key" }], "limit": 1, "period": "1m",
              "match": { "path_prefix": "/lost/" },
              "on_exceeded": { "spill": { "header": "x-pool", "value": "nowhere" } } }
        ]
    });
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let mut bootstrap = host.envoy_config(shim.port, &plugin);
    let manager =
        &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let mut primary = pool_route(None, "primary");
    primary["match"]["headers"] = json!([{ "name": "x-pool", "present_match": false }]);
    manager["route_config"]["virtual_hosts"][0]["routes"] =
        json!([pool_route(Some("fallback"), "fallback"), primary]);
    let envoy = Envoy::start_bootstrap(&bootstrap);
    (redis, shim, envoy)
}

fn spill_to_the_fallback_then_refuse(host: FilterHost, deny_cache: bool) {
    let (_redis, _shim, envoy) = start(host, deny_cache);
    let url = envoy.url("/v1/chat/completions");
    let send = || get(&url, &[("x-api-key", "tenant-a")]);
    for _ in 0..2 {
        let served = send();
        assert_eq!(
            (served.status, served.body.as_str()),
            (200, "primary"),
            "{served:?}"
        );
        assert_eq!(served.header("x-ratelimit-spilled"), None);
    }
    for _ in 0..2 {
        let spilled = send();
        assert_eq!(
            (spilled.status, spilled.body.as_str()),
            (200, "fallback"),
            "{spilled:?}"
        );
        assert_eq!(spilled.header("x-ratelimit-spilled"), Some("primary"));
    }
    // The fallback's own rule is spent: one hop only, so its spill refuses.
    let refused = send();
    assert_eq!(refused.status, 429, "{refused:?}");
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["rule"], "fallback");
    // Another client is untouched by tenant-a's spending.
    let other = get(&url, &[("x-api-key", "tenant-b")]);
    assert_eq!((other.status, other.body.as_str()), (200, "primary"));
    let stat = |rule: &str, stat: &str| envoy.stat(&host.stat(&format!("{rule}.{stat}")));
    assert_eq!(
        stat("primary", "spilled"),
        3,
        "the refused one spilled too, before its fallback refused"
    );
    assert_eq!(stat("primary", "denied"), 0);
    assert_eq!(stat("fallback", "allowed"), 2);
    assert_eq!(stat("fallback", "denied"), 1);
    assert_eq!(stat("fallback", "spilled"), 0);
}

#[test]
fn a_spilled_request_is_rerouted_after_the_shims_answer() {
    spill_to_the_fallback_then_refuse(FilterHost::Wasm, false);
}

#[test]
fn a_spilled_request_is_rerouted_when_the_deny_cache_decides_at_once() {
    spill_to_the_fallback_then_refuse(FilterHost::Wasm, true);
}

#[test]
fn the_native_module_reroutes_a_spilled_request_after_the_shims_answer() {
    spill_to_the_fallback_then_refuse(FilterHost::Native, false);
}

#[test]
fn the_native_module_reroutes_a_spilled_request_when_the_deny_cache_decides_at_once() {
    spill_to_the_fallback_then_refuse(FilterHost::Native, true);
}

#[test]
fn a_spill_header_that_no_route_matches_gets_the_routers_404() {
    lost_spill(FilterHost::Wasm);
}

#[test]
fn the_native_modules_spill_that_no_route_matches_gets_the_routers_404() {
    lost_spill(FilterHost::Native);
}

fn lost_spill(host: FilterHost) {
    let (_redis, _shim, envoy) = start(host, false);
    let url = envoy.url("/lost/x");
    let send = || get(&url, &[("x-api-key", "tenant-a")]);
    assert_eq!(send().body, "primary");
    for _ in 0..3 {
        let lost = send();
        assert_eq!(lost.status, 404, "{lost:?}");
        assert_eq!(lost.header("x-ratelimit-spilled"), Some("lost"));
    }
    assert_eq!(envoy.stat(&host.stat("lost.spilled")), 3);
}
