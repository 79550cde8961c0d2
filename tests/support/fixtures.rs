//! What many tests share: plugin configs, shim check bodies, a wired stack, YAML files.

use super::envoy::{loopback, wasm_path, Envoy, FilterHost};
use super::http::{post, Reply};
use super::process::repo_root;
use super::redis::Redis;
use super::shim::Shim;
use serde::Deserialize as _;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;

/// The plugin config of one token-bucket rule keyed on `x-api-key`.
pub fn api_key_rule(limit: u64, period: &str) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        // Generous: on a loaded two-core machine a slow answer must not turn into a
        // fail-open admission and blur the counts these tests assert.
        "timeout": "5s",
        "rules": [{ "name": "per-api-key", "key": [{ "header": "x-api-key" }], "limit": limit, "period": period }]
    })
}

/// Redis, the shim and one Envoy, wired together.
pub struct Stack {
    pub redis: Redis,
    pub shim: Shim,
    pub envoy: Envoy,
}

impl Stack {
    pub fn start(plugin_config: &Value) -> Stack {
        Stack::start_on(FilterHost::Wasm, plugin_config)
    }

    /// As [`Stack::start`], with the filter on `host`.
    pub fn start_on(host: FilterHost, plugin_config: &Value) -> Stack {
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let envoy = host.start_envoy(shim.port, plugin_config);
        Stack { redis, shim, envoy }
    }

    /// As [`Stack::start`], with a shim that can be killed and restarted on its port.
    pub fn start_restartable(plugin_config: &Value) -> Stack {
        Stack::start_restartable_on(FilterHost::Wasm, plugin_config)
    }

    /// As [`Stack::start_restartable`], with the filter on `host`.
    pub fn start_restartable_on(host: FilterHost, plugin_config: &Value) -> Stack {
        let redis = Redis::start();
        let shim = Shim::start_restartable(&redis.url(), &[]);
        let envoy = host.start_envoy(shim.port, plugin_config);
        Stack { redis, shim, envoy }
    }
}

/// One check of a `/v1/check` body; add fields (`cost`, `lease`, `shadow`) with
/// [`with`].
pub fn check_of(key: &str, algorithm: &str, limit: u64, period_ms: u64) -> Value {
    json!({ "key": key, "algorithm": algorithm, "limit": limit, "period_ms": period_ms })
}

/// `check` with one more field.
pub fn with(mut check: Value, field: &str, value: Value) -> Value {
    check[field] = value;
    check
}

/// A `/v1/check` body of these checks.
pub fn checks_body(checks: &[Value]) -> String {
    json!({ "checks": checks }).to_string()
}

/// Posts checks to the shim and returns its answer, failing the test on anything but
/// a 200.
pub fn decide_at(url: &str, checks: &[Value]) -> Value {
    let reply = post(url, &[], &checks_body(checks));
    assert_eq!(reply.status, 200, "{reply:?}");
    serde_json::from_str(&reply.body).unwrap()
}

/// Every document of a YAML file, as JSON values; panics naming the file on a parse error.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| {
            let value = serde_yaml::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
            serde_json::to_value(value)
                .unwrap_or_else(|e| panic!("{} is not plain data: {e}", path.display()))
        })
        .collect()
}

/// The one document of a YAML file, as a JSON value.
pub fn yaml_file(path: &Path) -> Value {
    let mut documents = yaml_documents(path);
    assert_eq!(documents.len(), 1, "{} should hold one document", path.display());
    documents.remove(0)
}

/// A shipped demo configuration (`envoy.yaml`, or `envoy-native.yaml`), moved to loopback
/// ports: the listener and admin on ports Envoy picks, the shim's cluster at `shim_port`
/// and both upstream pools (`llm`, and `fallback`, which answers alike) at
/// `upstream_port`, a Wasm filter's module the one built.
pub fn shipped_envoy_config(file: &str, shim_port: u16, upstream_port: u16) -> Value {
    let mut config = yaml_file(&repo_root().join(file));
    config["static_resources"]["listeners"][0]["address"] = loopback(0);
    config["admin"]["address"] = loopback(0);
    for cluster in config["static_resources"]["clusters"].as_array_mut().unwrap() {
        let port = match cluster["name"].as_str() {
            Some("llm") | Some("fallback") => upstream_port,
            Some("ratelimit_shim") => shim_port,
            other => panic!("unexpected cluster {other:?} in {file}"),
        };
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"] = json!({ "address": "127.0.0.1", "port_value": port });
    }
    let filters = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    for filter in filters.as_array_mut().unwrap() {
        if filter["name"] == "envoy.filters.http.wasm" {
            filter["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
                json!(wasm_path().display().to_string());
        }
    }
    config
}
