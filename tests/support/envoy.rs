//! Real Envoy loading the built `.wasm`: bootstraps, start-up on ports Envoy picks itself
//! (read back from its admin), stats, `--mode validate`, and a listener served by a
//! file-based LDS that a test swaps while traffic flows ([`LdsEnvoy`]). The same filter
//! as a dynamic module (`make native`'s `.so`) is the other [`FilterHost`]: every Envoy
//! started here finds it through `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`.

use super::http::get;
use super::ports::{claim_port, ClaimedPort};
use super::process::{built, repo_root, scratch, wait_until, Process};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longest Envoy may take to load the filter and report LIVE, on a loaded machine.
const STARTUP: Duration = Duration::from_secs(60);

pub fn wasm_path() -> PathBuf {
    built("target/wasm32-wasip1/release/ratelimit_wasm.wasm")
}

/// The directory `make native` builds the dynamic module into, and its file name there
/// (Envoy looks for `lib<name>.so` on `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`).
pub const NATIVE_DIR: &str = "target/shim";
pub const NATIVE_MODULE: &str = "ratelimit_native";

pub fn native_module_path() -> PathBuf {
    built(&format!("{NATIVE_DIR}/lib{NATIVE_MODULE}.so"))
}

/// Which build of the filter an Envoy loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterHost {
    /// The `.wasm`, through `envoy.filters.http.wasm`.
    Wasm,
    /// The shared library, through `envoy.filters.http.dynamic_modules`.
    Native,
}

impl FilterHost {
    /// Our filter as this host loads it, configured with `plugin_config`.
    pub fn filter(self, plugin_config: &Value) -> Value {
        match self {
            FilterHost::Wasm => wasm_filter(plugin_config),
            FilterHost::Native => native_filter(plugin_config),
        }
    }

    /// The full name of the filter's stat `name` (`RULE.STAT`, or a worker's) on this host.
    pub fn stat(self, name: &str) -> String {
        match self {
            FilterHost::Wasm => format!("wasmcustom.ratelimit.{name}"),
            FilterHost::Native => format!("dynamicmodulescustom.ratelimit.{name}"),
        }
    }

    /// As [`envoy_config`], with the filter on this host.
    pub fn envoy_config(self, shim_port: u16, plugin_config: &Value) -> Value {
        self.in_place(envoy_config(shim_port, plugin_config), plugin_config)
    }

    /// As [`envoy_config_to_upstream`], with the filter on this host.
    pub fn envoy_config_to_upstream(
        self,
        shim_port: u16,
        plugin_config: &Value,
        upstream_port: u16,
    ) -> Value {
        self.in_place(
            envoy_config_to_upstream(shim_port, plugin_config, upstream_port),
            plugin_config,
        )
    }

    /// `config` with this host's filter in the place of its first.
    fn in_place(self, mut config: Value, plugin_config: &Value) -> Value {
        let manager =
            &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        manager["http_filters"][0] = self.filter(plugin_config);
        config
    }

    /// As [`Envoy::start`], with the filter on this host.
    pub fn start_envoy(self, shim_port: u16, plugin_config: &Value) -> Envoy {
        Envoy::start_bootstrap(&self.envoy_config(shim_port, plugin_config))
    }

    /// As [`envoy_validate_plugin`], with the filter on this host.
    pub fn validate_plugin(self, plugin_config: &Value) -> (bool, String) {
        let path = scratch("validate").join("envoy.json");
        fs::write(
            &path,
            serde_json::to_vec(&self.envoy_config(1, plugin_config)).unwrap(),
        )
        .unwrap();
        envoy_validate(&path)
    }
}

/// Our filter as an Envoy dynamic module, with `plugin_config` as its configuration (a
/// JSON string is passed as the raw text, as [`wasm_filter`] does).
pub fn native_filter(plugin_config: &Value) -> Value {
    let text = match plugin_config {
        Value::String(raw) => raw.clone(),
        config => config.to_string(),
    };
    json!({
        "name": "envoy.filters.http.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": { "name": NATIVE_MODULE },
            "filter_name": "ratelimit",
            "filter_config": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": text
            }
        }
    })
}

pub fn envoy_path() -> PathBuf {
    match std::env::var_os("ENVOY_BIN") {
        Some(path) => PathBuf::from(path),
        None => built(".venv/bin/envoy"),
    }
}

pub struct Envoy {
    pub port: u16,
    pub admin_port: u16,
    pub process: Process,
}

impl Envoy {
    /// Starts Envoy with the filter configured by `plugin_config`, calling the shim on
    /// `shim_port`, with a route that answers 200 itself.
    pub fn start(shim_port: u16, plugin_config: &Value) -> Envoy {
        Envoy::start_bootstrap(&envoy_config(shim_port, plugin_config))
    }

    /// As [`Envoy::start`], with other HTTP filters (e.g. `jwt_authn`) before ours.
    pub fn start_with_filters(shim_port: u16, plugin_config: &Value, filters_before: &[Value]) -> Envoy {
        Envoy::start_bootstrap(&envoy_config_with_filters(
            shim_port,
            plugin_config,
            filters_before,
        ))
    }

    /// As [`Envoy::start`], with one worker thread: every request meets the same VM.
    pub fn start_one_worker(shim_port: u16, plugin_config: &Value) -> Envoy {
        Envoy::start_bootstrap_with_workers(&envoy_config(shim_port, plugin_config), 1)
    }

    /// Starts Envoy with a whole bootstrap (as JSON); its first listener and the admin
    /// are on 127.0.0.1, on ports it picks (port 0) or the bootstrap sets.
    pub fn start_bootstrap(config: &Value) -> Envoy {
        Envoy::start_bootstrap_with_workers(config, 2)
    }

    pub fn start_bootstrap_with_workers(config: &Value, workers: u32) -> Envoy {
        Envoy::start_bootstrap_with_args(config, workers, &[])
    }

    fn start_bootstrap_with_args(config: &Value, workers: u32, extra_args: &[&str]) -> Envoy {
        let dir = scratch("envoy");
        let config_path = dir.join("envoy.json");
        let admin_address_path = dir.join("admin-address");
        fs::write(&config_path, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        let mut process = Process::spawn(
            Command::new(envoy_path())
                .arg("-c")
                .arg(&config_path)
                .arg("--admin-address-path")
                .arg(&admin_address_path)
                .args(["--concurrency", &workers.to_string()])
                .args(["--use-dynamic-base-id", "--log-level", "warn"])
                .args(["--component-log-level", "wasm:info,dynamic_modules:info"])
                .args(extra_args)
                .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", repo_root().join(NATIVE_DIR)),
            dir.join("envoy.log"),
        );
        let mut admin_port = None;
        wait_until("envoy admin", STARTUP, || {
            assert!(!process.exited(), "envoy exited:\n{}", process.log_text());
            admin_port = fs::read_to_string(&admin_address_path)
                .ok()
                .and_then(|address| address.trim().rsplit(':').next()?.parse().ok());
            admin_port.is_some()
        });
        let admin_port = admin_port.unwrap();
        let admin = |path: &str| get(&format!("http://127.0.0.1:{admin_port}{path}"), &[]);
        wait_until("envoy", STARTUP, || admin("/ready").body.trim() == "LIVE");
        let listeners: Value = serde_json::from_str(&admin("/listeners?format=json").body).unwrap();
        let port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .unwrap_or_else(|| panic!("no listener port in {listeners}")) as u16;
        Envoy {
            port,
            admin_port,
            process,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A counter or gauge from the admin `/stats`, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = get(&format!("http://127.0.0.1:{}/stats", self.admin_port), &[]).body;
        stats
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Envoy's resident memory outside its heap: mostly the Wasm VMs' memory (V8 maps it
    /// itself), without the connection buffers that Envoy's allocator holds.
    pub fn resident_outside_heap_bytes(&self) -> u64 {
        let memory = get(&format!("http://127.0.0.1:{}/memory", self.admin_port), &[]).body;
        let json: Value = serde_json::from_str(&memory).unwrap();
        let field = |name: &str| -> u64 { json[name].as_str().unwrap().parse().unwrap() };
        let resident_heap = field("heap_size").saturating_sub(field("pageheap_unmapped"));
        self.rss_bytes().saturating_sub(resident_heap)
    }

    /// Envoy's resident memory (its heap, and the Wasm VMs' memory beside it).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.pid())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kib * 1024
    }

    /// Bytes allocated by Envoy's heap, from the admin `/memory`.
    pub fn allocated_bytes(&self) -> u64 {
        let memory = get(&format!("http://127.0.0.1:{}/memory", self.admin_port), &[]).body;
        let json: Value = serde_json::from_str(&memory).unwrap();
        json["allocated"].as_str().unwrap().parse().unwrap()
    }
}

/// A loopback address; port 0 lets the kernel pick.
pub fn loopback(port: u16) -> Value {
    json!({ "socket_address": { "address": "127.0.0.1", "port_value": port } })
}

/// An Envoy bootstrap (as JSON) with the filter in front of a direct 200 response; the
/// listener and admin on ports Envoy picks.
pub fn envoy_config(shim_port: u16, plugin_config: &Value) -> Value {
    envoy_config_with_filters(shim_port, plugin_config, &[])
}

/// As [`envoy_config`], with `filters_before` ahead of the rate-limit filter.
pub fn envoy_config_with_filters(shim_port: u16, plugin_config: &Value, filters_before: &[Value]) -> Value {
    let mut http_filters: Vec<Value> = filters_before.to_vec();
    http_filters.push(wasm_filter(plugin_config));
    let routes = json!([{ "match": { "prefix": "/" },
                          "direct_response": { "status": 200, "body": { "inline_string": "ok" } } }]);
    let shim = json!({
        "name": "ratelimit_shim",
        "type": "STATIC",
        "connect_timeout": "0.25s",
        // As envoy.yaml: HTTP/1.1 with keep-alive to the shim.
        "typed_extension_protocol_options": { "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http_protocol_options": {} } } },
        "load_assignment": { "cluster_name": "ratelimit_shim",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(shim_port) } }] }] }
    });
    listener_bootstrap(routes, http_filters, vec![shim])
}

/// A bootstrap with one listener on 127.0.0.1 (a port Envoy picks) whose connection
/// manager runs `http_filters`, then the router, over `routes`; `clusters`; and the admin.
pub fn listener_bootstrap(routes: Value, mut http_filters: Vec<Value>, clusters: Vec<Value>) -> Value {
    http_filters.push(json!({ "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } }));
    json!({
        "static_resources": {
            "listeners": [{
                "name": "test",
                "address": loopback(0),
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "test",
                        "route_config": { "virtual_hosts": [{ "name": "test", "domains": ["*"], "routes": routes }] },
                        "http_filters": http_filters
                    }
                }]}]
            }],
            "clusters": clusters
        },
        "admin": { "address": loopback(0) }
    })
}

/// How long Envoy waits for the upstream of [`envoy_config_to_upstream`] before it
/// answers 504 itself: the route timeout.
pub const UPSTREAM_ROUTE_TIMEOUT_MS: u64 = 300;

/// As [`envoy_config`], routing to a real upstream on `upstream_port` (HTTP/1.1) with a
/// route timeout of [`UPSTREAM_ROUTE_TIMEOUT_MS`], and with Envoy's fault filter after
/// ours: a request carrying `x-envoy-fault-abort-request: <status>` is refused there, by
/// a later filter, after ours admitted it.
pub fn envoy_config_to_upstream(shim_port: u16, plugin_config: &Value, upstream_port: u16) -> Value {
    let mut config = envoy_config(shim_port, plugin_config);
    let manager =
        &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    manager["route_config"]["virtual_hosts"][0]["routes"] = json!([{
        "match": { "prefix": "/" },
        "route": { "cluster": "upstream", "timeout": format!("{}s", UPSTREAM_ROUTE_TIMEOUT_MS as f64 / 1000.0) }
    }]);
    let filters = manager["http_filters"].as_array_mut().unwrap();
    let router = filters.pop().unwrap();
    filters.push(json!({ "name": "envoy.filters.http.fault",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "abort": { "header_abort": {}, "percentage": { "numerator": 100, "denominator": "HUNDRED" } } } }));
    filters.push(router);
    config["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "name": "upstream",
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": { "cluster_name": "upstream",
                "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(upstream_port) } }] }] }
        }));
    config
}

/// Our filter with `plugin_config` as its configuration; a JSON string is passed as the
/// raw configuration text (to try text that is not one JSON object).
pub fn wasm_filter(plugin_config: &Value) -> Value {
    let text = match plugin_config {
        Value::String(raw) => raw.clone(),
        config => config.to_string(),
    };
    json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "ratelimit",
                "root_id": "ratelimit",
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": { "local": { "filename": wasm_path() } }
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": text
                }
            }
        }
    })
}

/// Runs `envoy --mode validate` on a config file; returns (success, output).
pub fn envoy_validate(config_path: &Path) -> (bool, String) {
    let output = Command::new(envoy_path())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(config_path)
        .args(["--log-level", "info", "--use-dynamic-base-id"])
        .env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", repo_root().join(NATIVE_DIR))
        .current_dir(repo_root())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Validates an Envoy config built around `plugin_config`. Validation binds and connects
/// to nothing, so the shim port is a placeholder.
pub fn envoy_validate_plugin(plugin_config: &Value) -> (bool, String) {
    let path = scratch("validate").join("envoy.json");
    fs::write(
        &path,
        serde_json::to_vec(&envoy_config(1, plugin_config)).unwrap(),
    )
    .unwrap();
    envoy_validate(&path)
}

/// Envoy whose listener, the filter and its plugin configuration included, comes from a
/// file-based LDS in a watched directory: a test pushes a new configuration while traffic
/// flows, as a control plane (or Istio, for a WasmPlugin) would.
pub struct LdsEnvoy {
    pub envoy: Envoy,
    dir: PathBuf,
    shim_port: u16,
    version: u32,
    // On a port of its own: the updated listener must be the same address.
    listen: ClaimedPort,
    host: FilterHost,
}

/// What Envoy made of a pushed configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Applied: the listener is updated and serves it.
    Accepted,
    /// Refused: the previous listener goes on serving.
    Rejected,
}

impl LdsEnvoy {
    /// Starts Envoy serving `plugin_config` through LDS. Old connections drain at once
    /// (`--drain-strategy immediate`: each of their next responses closes them) and for
    /// at most a second, so a swap's old filter chain is gone within the test.
    pub fn start(shim_port: u16, plugin_config: &Value) -> LdsEnvoy {
        LdsEnvoy::start_with(shim_port, plugin_config, 2, 1)
    }

    /// As [`LdsEnvoy::start`], with `workers` worker threads and old connections drained
    /// for at most `drain_seconds`.
    pub fn start_with(shim_port: u16, plugin_config: &Value, workers: u32, drain_seconds: u32) -> LdsEnvoy {
        LdsEnvoy::start_on(FilterHost::Wasm, shim_port, plugin_config, workers, drain_seconds)
    }

    /// As [`LdsEnvoy::start_with`], with the filter on `host`.
    pub fn start_on(
        host: FilterHost,
        shim_port: u16,
        plugin_config: &Value,
        workers: u32,
        drain_seconds: u32,
    ) -> LdsEnvoy {
        let dir = scratch("lds");
        let watched = dir.join("watched");
        fs::create_dir_all(&watched).unwrap();
        let listen = claim_port();
        write_lds(
            &dir,
            &lds_response(host, shim_port, listen.port, 1, plugin_config),
        );
        let mut bootstrap = host.envoy_config(shim_port, plugin_config);
        bootstrap["static_resources"]["listeners"] = json!([]);
        bootstrap["node"] = json!({ "id": "test", "cluster": "test" });
        bootstrap["dynamic_resources"] = json!({ "lds_config": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": watched.join("lds.json"),
                "watched_directory": { "path": watched }
            }
        }});
        let drain_time = drain_seconds.to_string();
        let envoy = Envoy::start_bootstrap_with_args(
            &bootstrap,
            workers,
            &["--drain-strategy", "immediate", "--drain-time-s", &drain_time],
        );
        LdsEnvoy {
            envoy,
            dir,
            shim_port,
            version: 1,
            listen,
            host,
        }
    }

    /// Pushes `plugin_config` and waits until Envoy has decided: accepted once the
    /// listener is updated and nothing is warming, so that a new connection meets it.
    pub fn push(&mut self, plugin_config: &Value) -> Push {
        let stat = |name: &str| self.envoy.stat(&format!("listener_manager.{name}"));
        let (accepted, rejected) = (stat("lds.update_success"), stat("lds.update_rejected"));
        self.version += 1;
        let response = lds_response(
            self.host,
            self.shim_port,
            self.listen.port,
            self.version,
            plugin_config,
        );
        write_lds(&self.dir, &response);
        let mut outcome = None;
        wait_until("Envoy's verdict on the pushed listener", STARTUP, || {
            outcome = if stat("lds.update_rejected") > rejected {
                Some(Push::Rejected)
            } else if stat("lds.update_success") > accepted && stat("total_listeners_warming") == 0 {
                Some(Push::Accepted)
            } else {
                None
            };
            outcome.is_some()
        });
        outcome.unwrap()
    }
}

/// An LDS response holding the test listener, serving `plugin_config`, on `port`.
fn lds_response(host: FilterHost, shim_port: u16, port: u16, version: u32, plugin_config: &Value) -> Value {
    let mut listener =
        host.envoy_config(shim_port, plugin_config)["static_resources"]["listeners"][0].clone();
    listener["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
    listener["address"] = loopback(port);
    json!({ "version_info": version.to_string(), "resources": [listener] })
}

/// Writes an LDS response beside the watched directory, then renames it over the watched
/// file: the atomic swap Envoy's docs prescribe, so that Envoy never reads half a file.
fn write_lds(dir: &Path, response: &Value) {
    let staged = dir.join("lds.json.next");
    fs::write(&staged, serde_json::to_vec_pretty(response).unwrap()).unwrap();
    fs::rename(&staged, dir.join("watched/lds.json")).unwrap();
}

/// A bootstrap with Envoy's own `http_filter` (the rate-limit or quota filter) before the
/// router, `routes` to a real upstream on `upstream_port` (HTTP/1.1), and a gRPC (HTTP/2)
/// cluster `grpc_cluster` to the shim's `--grpc-listen` on `grpc_port`.
pub fn native_filter_bootstrap(
    http_filter: Value,
    routes: Value,
    grpc_cluster: &str,
    grpc_port: u16,
    upstream_port: u16,
) -> Value {
    let grpc = json!({ "name": grpc_cluster, "type": "STATIC", "connect_timeout": "0.25s",
        "typed_extension_protocol_options": { "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} } } },
        "load_assignment": { "cluster_name": grpc_cluster,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(grpc_port) } }] }] } });
    let upstream = json!({ "name": "upstream", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": { "cluster_name": "upstream",
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(upstream_port) } }] }] } });
    listener_bootstrap(routes, vec![http_filter], vec![grpc, upstream])
}
