//! Version skew, both ways, in real Envoy against real Redis: the previous release's
//! shim (v0.1.0) behind this release's filter, and this release's shim behind the
//! previous release's filter, each with every algorithm (token bucket, fixed window,
//! sliding window log and counter, concurrency) and feature (calendar quota, cost from
//! the response with its settlements, leases, the deny cache, local and layered buckets,
//! concurrent requests batched into one call). The previous release is built from its
//! git tag by `scripts/build-previous.sh` (once per commit; minutes the first time).
//! And this shim's side of the compatibility rule at the wire: what it answers a newer
//! filter, an unstated one and one outside its window.

mod support;

use ratelimit_wire::{WireVersion, VERSION};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use support::*;

/// The previous release's shim binary and `.wasm`, built if not yet: by the first test
/// that asks, the others waiting (two builds at once would share one index).
fn previous_release() -> (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(build_previous_release).clone()
}

fn build_previous_release() -> (PathBuf, PathBuf) {
    let output = Command::new(repo_root().join("scripts/build-previous.sh"))
        .output()
        .expect("scripts/build-previous.sh runs");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "building the previous release failed:\n{printed}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let path = |name: &str| {
        let line = printed.lines().find_map(|line| line.strip_prefix(name)).unwrap();
        let path = PathBuf::from(line);
        assert!(path.is_file(), "{} is not built", path.display());
        path
    };
    (path("SHIM="), path("WASM="))
}

fn rule(name: &str, extra: Value) -> Value {
    // An hour, so that nothing refills while a scenario runs.
    let mut rule = json!({ "name": name, "match": { "path_prefix": format!("/{name}") },
        "key": [{ "header": "x-api-key" }], "limit": 3, "period": "1h" });
    let fields = rule.as_object_mut().unwrap();
    for (field, value) in extra.as_object().unwrap() {
        match value {
            Value::Null => fields.remove(field),
            value => fields.insert(field.clone(), value.clone()),
        };
    }
    rule
}

/// One rule per algorithm and feature, each on its own path.
fn plugin_config() -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        "failure_mode": "closed",
        "rules": [
            rule("token-bucket", json!({ "algorithm": "token_bucket" })),
            rule("fixed-window", json!({ "algorithm": "fixed_window" })),
            rule("sliding-log", json!({ "algorithm": "sliding_window_log" })),
            rule("sliding-counter", json!({ "algorithm": "sliding_window_counter" })),
            rule("calendar", json!({ "period": null, "calendar": "day", "utc_offset": "-03:30" })),
            rule("in-flight", json!({ "algorithm": "concurrency", "limit": 2, "period": null, "max_duration": "60s" })),
            rule("tokens", json!({ "limit": 10, "cost_from_response": { "header": "x-usage-tokens" } })),
            rule("leased", json!({ "limit": 5, "lease": { "size": 2, "ttl": "30s" } })),
            rule("per-envoy", json!({ "scope": "local" })),
            rule("layered", json!({ "limit": 5, "local": { "limit": 2, "period": "1m" } })),
            rule("batched", json!({ "limit": 5 })),
        ]
    })
}

/// Envoy with one worker (so that a settlement or a released slot travels with the
/// next request's call, deterministically) loading `wasm`, in front of `upstream`.
fn start_envoy(shim_port: u16, upstream_port: u16, wasm: &std::path::Path) -> Envoy {
    let mut config = envoy_config_to_upstream(shim_port, &plugin_config(), upstream_port);
    let manager =
        &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    // Long enough for the concurrency scenario's held requests.
    manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["timeout"] = json!("30s");
    manager["http_filters"][0]["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
        json!(wasm);
    Envoy::start_bootstrap_with_workers(&config, 1)
}

fn statuses(envoy: &Envoy, path: &str, key: &str, count: usize) -> Vec<u16> {
    (0..count)
        .map(|_| get(&envoy.url(path), &[("x-api-key", key)]).status)
        .collect()
}

fn stat(envoy: &Envoy, rule: &str, name: &str) -> u64 {
    envoy.stat(&format!("wasmcustom.ratelimit.{rule}.{name}"))
}

/// Every algorithm and feature, exactly as one release alone decides it.
fn every_algorithm_and_feature(envoy: &Envoy, upstream: &Upstream) {
    // The four rate algorithms and the calendar quota: three pass, then refusals, the
    // second one from the deny cache without asking the shim.
    for rule in [
        "token-bucket",
        "fixed-window",
        "sliding-log",
        "sliding-counter",
        "calendar",
    ] {
        assert_eq!(
            statuses(envoy, &format!("/{rule}"), "a", 5),
            [200, 200, 200, 429, 429],
            "{rule}"
        );
        assert!(stat(envoy, rule, "deny_cache_hits") >= 1, "{rule}: deny cache");
        assert_eq!(stat(envoy, rule, "shim_errors"), 0, "{rule}");
    }

    // A local rule (no shim) and a global one behind a local bucket.
    assert_eq!(statuses(envoy, "/per-envoy", "a", 4), [200, 200, 200, 429]);
    assert_eq!(statuses(envoy, "/layered", "a", 3), [200, 200, 429]);
    assert_eq!(stat(envoy, "layered", "denied_locally"), 1);

    // Leases of 2: five admitted of seven, some from the lease without a call.
    assert_eq!(
        count_status(
            &(0..7)
                .map(|_| get(&envoy.url("/leased"), &[("x-api-key", "a")]))
                .collect::<Vec<_>>(),
            200
        ),
        5
    );
    assert!(stat(envoy, "leased", "lease_hits") >= 1, "lease hits");

    // Concurrent requests on the worker share calls: exactly the limit passes.
    let batched = envoy.url("/batched");
    let replies = concurrently(8, move |_| get(&batched, &[("x-api-key", "a")]));
    assert_eq!(count_status(&replies, 200), 5, "batched");

    // Concurrency: two held in flight, a third refused; once they end, their slots go
    // back (with the worker's next call) and a request passes again.
    let held: Vec<_> = (0..2)
        .map(|i| {
            let url = envoy.url("/in-flight");
            std::thread::spawn(move || {
                let name = format!("slot-{i}");
                get(
                    &url,
                    &[("x-api-key", "a"), ("x-upstream", "hold"), ("x-hold", &name)],
                )
                .status
            })
        })
        .collect();
    wait_until("two requests held upstream", Duration::from_secs(20), || {
        upstream.in_flight() == 2
    });
    assert_eq!(statuses(envoy, "/in-flight", "a", 1), [429]);
    upstream.release("slot-0");
    upstream.release("slot-1");
    for request in held {
        assert_eq!(request.join().unwrap(), 200);
    }
    wait_until("the slots given back", Duration::from_secs(20), || {
        get(&envoy.url("/in-flight"), &[("x-api-key", "b")]).status == 200
            && get(&envoy.url("/in-flight"), &[("x-api-key", "a")]).status == 200
    });
    assert!(stat(envoy, "in-flight", "released") >= 2);

    // Cost from the response: the first request reports 4 (estimate 1), settled with
    // the next call; of the 10 tokens 6 are left for requests costing 1.
    let reported = |tokens: &str| {
        get(
            &envoy.url("/tokens"),
            &[("x-api-key", "a"), ("x-report", "header"), ("x-tokens", tokens)],
        )
        .status
    };
    assert_eq!(reported("4"), 200);
    wait_until("the cost read", Duration::from_secs(10), || {
        stat(envoy, "tokens", "cost_settled") == 1
    });
    let rest: Vec<u16> = (0..8).map(|_| reported("1")).collect();
    assert_eq!(
        rest.iter().filter(|&&status| status == 200).count(),
        6,
        "{rest:?}"
    );
    assert_eq!(stat(envoy, "tokens", "cost_unreported"), 0);

    for rule in [
        "token-bucket",
        "in-flight",
        "tokens",
        "leased",
        "batched",
        "calendar",
    ] {
        assert_eq!(stat(envoy, rule, "shim_unsupported"), 0, "{rule}");
        assert_eq!(stat(envoy, rule, "failed_closed"), 0, "{rule}");
    }
}

#[test]
fn the_new_filter_runs_on_the_previous_shim() {
    let (previous_shim, _) = previous_release();
    let redis = Redis::start();
    let shim = ShimProcess::start_binary(&previous_shim, &redis.url(), &[]);
    let upstream = Upstream::start();
    let envoy = start_envoy(shim.port, upstream.port, &wasm_path());
    assert!(envoy
        .process
        .log_text()
        .contains(&format!("ratelimit-wasm {VERSION}: configured")));
    every_algorithm_and_feature(&envoy, &upstream);
    // The filter noticed, and said so once.
    let log = envoy.process.log_text();
    assert_eq!(
        log.matches("stating no x-ratelimit-wire (0.1 or older)").count(),
        1,
        "{log}"
    );
}

#[test]
fn the_previous_filter_runs_on_the_new_shim() {
    let (_, previous_wasm) = previous_release();
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = Upstream::start();
    let envoy = start_envoy(shim.port, upstream.port, &previous_wasm);
    let log = envoy.process.log_text();
    assert!(log.contains("ratelimit-wasm 0.1.0: configured"), "{log}");
    every_algorithm_and_feature(&envoy, &upstream);
}

fn batch_of(checks: &[Value]) -> String {
    json!({ "requests": [{ "checks": checks }] }).to_string()
}

#[test]
fn the_shim_answers_what_it_cannot_honour_per_check_and_only_to_a_filter_in_its_window() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let known = check_of("known", "fixed_window", 5, 60_000);
    let newer = with(check_of("newer", "fixed_window", 5, 60_000), "priority", json!(2));
    let body = batch_of(&[newer.clone(), known.clone()]);
    let url = shim.url("/v1/check-batch");

    // A filter one minor version newer: the check with a field this shim does not know
    // is answered as not supported, the other decided and charged.
    let next = format!("0.{}.0", WireVersion::ours().minor + 1);
    let reply = post(&url, &[("x-ratelimit-wire", &next)], &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-ratelimit-wire"), Some(VERSION));
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let decided = &answer["responses"][0]["decided"];
    assert_eq!(
        decided["unsupported"],
        json!([{ "position": 0, "field": "priority" }])
    );
    assert_eq!(decided["results"][0]["granted"], 0);
    assert_eq!(decided["results"][1]["granted"], 1);
    assert_eq!(decided["allowed"], true);
    assert_eq!(redis.cli(&["KEYS", "*newer*"]), "");

    // Without a stated version (a 0.1 filter, or anyone), as 0.1 did: the whole batch
    // is refused, naming the field; and outside the window, naming both versions.
    let unstated = post(&url, &[], &body);
    assert_eq!(unstated.status, 400);
    assert!(unstated.body.contains("priority"), "{}", unstated.body);
    let far = format!("0.{}.0", WireVersion::ours().minor + 2);
    let refused = post(&url, &[("x-ratelimit-wire", &far)], &batch_of(&[known]));
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("not served"), "{}", refused.body);
}
