//! Test harness: starts real Redis, the real shim binary and real Envoy loading the built
//! `.wasm`, each on free loopback ports, and stops them when dropped.
//!
//! Readiness is polled (Redis PING, the shim's port, Envoy admin `/ready`), never slept
//! for. Binaries come from `make build`; Envoy from `.venv` (or `ENVOY_BIN`).
#![allow(dead_code)] // each test binary uses its own subset

use serde::Deserialize as _;
use serde_json::{json, Value};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn built(relative: &str) -> PathBuf {
    let path = repo_root().join(relative);
    assert!(
        path.exists(),
        "{} is missing: run `make build` first",
        path.display()
    );
    path
}

pub fn wasm_path() -> PathBuf {
    built("target/wasm32-wasip1/release/ratelimit_wasm.wasm")
}

pub fn shim_path() -> PathBuf {
    built("target/release/redis-shim")
}

pub fn envoy_path() -> PathBuf {
    match std::env::var_os("ENVOY_BIN") {
        Some(path) => PathBuf::from(path),
        None => built(".venv/bin/envoy"),
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A directory for one process's config and log, unique within this test run.
fn scratch_dir(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = repo_root().join("target/test-runs").join(format!(
        "{}-{}-{}",
        name,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls `ready` until it holds or `timeout` passes.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} not ready after {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed on drop; its output goes to `log`.
pub struct Process {
    child: Child,
    pub log: PathBuf,
}

impl Process {
    fn spawn(command: &mut Command, log: PathBuf) -> Process {
        let out = fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        Process { child, log }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One redis-cli command against a port; `None` when it fails.
fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

pub struct Redis {
    pub port: u16,
    process: Process,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_on(free_port())
    }

    pub fn start_on(port: u16) -> Redis {
        let dir = scratch_dir("redis");
        let process = Process::spawn(
            Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .current_dir(&dir),
            dir.join("redis.log"),
        );
        let redis = Redis { port, process };
        wait_until("redis", Duration::from_secs(10), || {
            redis.try_cli(&["PING"]).as_deref() == Some("PONG")
        });
        redis
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        redis_cli(self.port, args)
    }

    /// Runs one redis-cli command and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        self.process.kill();
    }
}

pub struct Shim {
    pub port: u16,
    pub process: Process,
}

impl Shim {
    pub fn start(redis_url: &str, extra_args: &[&str]) -> Shim {
        Shim::start_on(free_port(), redis_url, extra_args)
    }

    pub fn start_on(port: u16, redis_url: &str, extra_args: &[&str]) -> Shim {
        let dir = scratch_dir("shim");
        let process = Process::spawn(
            Command::new(shim_path())
                .args(["--listen", &format!("127.0.0.1:{port}"), "--redis-url", redis_url])
                .args(extra_args),
            dir.join("shim.log"),
        );
        let shim = Shim { port, process };
        wait_until("shim", Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        shim
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }
}

pub struct Envoy {
    pub port: u16,
    pub admin_port: u16,
    pub process: Process,
}

impl Envoy {
    /// A counter or gauge from the admin `/stats`, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = get(&format!("http://127.0.0.1:{}/stats", self.admin_port), &[]).body;
        stats
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(": ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Bytes allocated by Envoy's heap, from the admin `/memory`.
    pub fn allocated_bytes(&self) -> u64 {
        let memory = get(&format!("http://127.0.0.1:{}/memory", self.admin_port), &[]).body;
        let json: Value = serde_json::from_str(&memory).unwrap();
        json["allocated"].as_str().unwrap().parse().unwrap()
    }

    /// Starts Envoy with the filter configured by `plugin_config`, calling the shim on
    /// `shim_port`, with a route that answers 200 itself.
    pub fn start(shim_port: u16, plugin_config: &Value) -> Envoy {
        Envoy::start_with_filters(shim_port, plugin_config, &[])
    }

    /// As [`Envoy::start`], with other HTTP filters (e.g. `jwt_authn`) before ours.
    pub fn start_with_filters(shim_port: u16, plugin_config: &Value, filters_before: &[Value]) -> Envoy {
        Envoy::start_with(|port, admin_port| {
            envoy_config_with_filters(port, admin_port, shim_port, plugin_config, filters_before)
        })
    }

    /// Starts Envoy on a bootstrap built for its listener and admin ports.
    pub fn start_with(bootstrap: impl FnOnce(u16, u16) -> Value) -> Envoy {
        let (port, admin_port) = (free_port(), free_port());
        Envoy::start_bootstrap(&bootstrap(port, admin_port), port, admin_port)
    }

    /// Starts Envoy with a whole bootstrap (as JSON) whose listener is on `port` and
    /// admin on `admin_port`, both on 127.0.0.1; waits until the admin says LIVE.
    pub fn start_bootstrap(config: &Value, port: u16, admin_port: u16) -> Envoy {
        Envoy::start_bootstrap_with_workers(config, port, admin_port, 2)
    }

    /// As [`Envoy::start`], with one worker thread: every request meets the same VM.
    pub fn start_one_worker(shim_port: u16, plugin_config: &Value) -> Envoy {
        let (port, admin_port) = (free_port(), free_port());
        let config = envoy_config(port, admin_port, shim_port, plugin_config);
        Envoy::start_bootstrap_with_workers(&config, port, admin_port, 1)
    }

    fn start_bootstrap_with_workers(config: &Value, port: u16, admin_port: u16, workers: u32) -> Envoy {
        let dir = scratch_dir("envoy");
        let config_path = dir.join("envoy.json");
        fs::write(&config_path, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        let process = Process::spawn(
            Command::new(envoy_path())
                .arg("-c")
                .arg(&config_path)
                .args(["--concurrency", &workers.to_string()])
                .args(["--use-dynamic-base-id", "--log-level", "warn"])
                .args(["--component-log-level", "wasm:info"]),
            dir.join("envoy.log"),
        );
        let envoy = Envoy {
            port,
            admin_port,
            process,
        };
        wait_until("envoy", Duration::from_secs(30), || {
            get(&format!("http://127.0.0.1:{admin_port}/ready"), &[])
                .body
                .trim()
                == "LIVE"
        });
        envoy
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }
}

/// An Envoy bootstrap (as JSON) with the filter in front of a direct 200 response.
pub fn envoy_config(port: u16, admin_port: u16, shim_port: u16, plugin_config: &Value) -> Value {
    envoy_config_with_filters(port, admin_port, shim_port, plugin_config, &[])
}

/// As [`envoy_config`], with `filters_before` ahead of the rate-limit filter.
pub fn envoy_config_with_filters(
    port: u16,
    admin_port: u16,
    shim_port: u16,
    plugin_config: &Value,
    filters_before: &[Value],
) -> Value {
    let mut http_filters: Vec<Value> = filters_before.to_vec();
    http_filters.push(wasm_filter(plugin_config));
    http_filters.push(json!({ "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } }));
    let address = |port: u16| json!({ "socket_address": { "address": "127.0.0.1", "port_value": port } });
    json!({
        "static_resources": {
            "listeners": [{
                "name": "test",
                "address": address(port),
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "test",
                        "route_config": { "virtual_hosts": [{
                            "name": "test", "domains": ["*"],
                            "routes": [{ "match": { "prefix": "/" },
                                         "direct_response": { "status": 200, "body": { "inline_string": "ok" } } }]
                        }]},
                        "http_filters": http_filters
                    }
                }]}]
            }],
            "clusters": [{
                "name": "ratelimit_shim",
                "type": "STATIC",
                "connect_timeout": "0.25s",
                // As envoy.yaml: HTTP/2 cleartext to the shim.
                "typed_extension_protocol_options": { "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": { "http2_protocol_options": {} } } },
                "load_assignment": { "cluster_name": "ratelimit_shim",
                    "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": address(shim_port) } }] }] }
            }]
        },
        "admin": { "address": address(admin_port) }
    })
}

pub fn wasm_filter(plugin_config: &Value) -> Value {
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
                    "value": plugin_config.to_string()
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

/// Validates an Envoy config built around `plugin_config`.
pub fn envoy_validate_plugin(plugin_config: &Value) -> (bool, String) {
    let dir = scratch_dir("validate");
    let path = dir.join("envoy.json");
    let config = envoy_config(free_port(), free_port(), free_port(), plugin_config);
    fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    envoy_validate(&path)
}

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
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let envoy = Envoy::start(shim.port, plugin_config);
        Stack { redis, shim, envoy }
    }
}

/// An HTTP response, whatever its status.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A header's value as a number, failing the test when absent or not a number.
    pub fn number(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {value:?} is not a number"))
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build()
}

fn into_reply(result: Result<ureq::Response, ureq::Error>) -> Reply {
    let response = match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(ureq::Error::Transport(e)) => {
            return Reply {
                status: 0,
                headers: vec![],
                body: e.to_string(),
            }
        }
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .filter_map(|name| response.header(&name).map(|v| (name.clone(), v.to_string())))
        .collect();
    let mut body = String::new();
    let _ = response.into_reader().take(1 << 20).read_to_string(&mut body);
    Reply {
        status,
        headers,
        body,
    }
}

/// GET with headers; a transport failure is status 0.
pub fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = agent().get(url);
    for (name, value) in headers {
        request = request.set(name, value);
    }
    into_reply(request.call())
}

/// POST a JSON body with headers; a transport failure is status 0.
pub fn post(url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut request = agent().post(url).set("content-type", "application/json");
    for (name, value) in headers {
        request = request.set(name, value);
    }
    into_reply(request.send_string(body))
}

/// Sends `count` requests at once (released together by a barrier) and returns them.
pub fn concurrently<F>(count: usize, send: F) -> Vec<Reply>
where
    F: Fn(usize) -> Reply + Send + Sync + 'static,
{
    let send = std::sync::Arc::new(send);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(count));
    let handles: Vec<_> = (0..count)
        .map(|i| {
            let (send, barrier) = (send.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                send(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

pub fn count_status(replies: &[Reply], status: u16) -> usize {
    replies.iter().filter(|r| r.status == status).count()
}

/// Writes raw bytes to a port and returns what comes back (for malformed-request tests).
pub fn raw_exchange(port: u16, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

// ---- Added for the shim's production tests: process control, Redis time, clusters. ----

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`TERM`, `STOP`, `CONT`, ...) with the `kill` command.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits for the process to exit on its own, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory in KiB, from `/proc`.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }
}

impl Redis {
    /// Starts Redis with extra `redis-server` arguments (e.g. `--requirepass`).
    pub fn start_with(extra_args: &[&str], cli_auth: Option<&str>) -> Redis {
        let port = free_port();
        let dir = scratch_dir("redis");
        let process = Process::spawn(
            Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(extra_args)
                .current_dir(&dir),
            dir.join("redis.log"),
        );
        let redis = Redis { port, process };
        let mut ping = vec!["--no-auth-warning"];
        if let Some(password) = cli_auth {
            ping.extend(["-a", password]);
        }
        ping.push("PING");
        wait_until("redis", Duration::from_secs(10), || {
            redis.try_cli(&ping).as_deref() == Some("PONG")
        });
        redis
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    /// Redis's clock in milliseconds since the Unix epoch, the clock the scripts use.
    pub fn time_ms(&self) -> u64 {
        let time = self.cli(&["TIME"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        let (seconds, micros) = (parts.next().unwrap(), parts.next().unwrap());
        seconds * 1000 + micros / 1000
    }
}

/// Polls Redis's clock until it reaches `at_ms` (no fixed sleep longer than the poll).
pub fn wait_for_redis_time(redis: &Redis, at_ms: u64) {
    loop {
        let now = redis.time_ms();
        if now >= at_ms {
            return;
        }
        std::thread::sleep(Duration::from_millis((at_ms - now).min(20)));
    }
}

/// A Redis Cluster of three masters (no replicas) on loopback ports.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    nodes: Vec<Process>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let nodes: Vec<Process> = ports
            .iter()
            .map(|port| {
                let dir = scratch_dir("cluster-node");
                Process::spawn(
                    Command::new("redis-server")
                        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                        .args(["--save", "", "--appendonly", "no"])
                        .args(["--cluster-enabled", "yes"])
                        .arg("--cluster-config-file")
                        .arg(dir.join("nodes.conf"))
                        .current_dir(&dir),
                    dir.join("redis.log"),
                )
            })
            .collect();
        let cluster = RedisCluster { ports, nodes };
        for &port in &cluster.ports {
            wait_until("cluster node", Duration::from_secs(10), || {
                cluster.try_cli(port, &["PING"]).as_deref() == Some("PONG")
            });
        }
        let addresses: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        for &port in &cluster.ports {
            wait_until("cluster_state:ok", Duration::from_secs(20), || {
                cluster
                    .try_cli(port, &["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            });
        }
        cluster
    }

    fn try_cli(&self, port: u16, args: &[&str]) -> Option<String> {
        redis_cli(port, args)
    }

    /// Runs one command on the node that owns `key` (redis-cli follows redirections).
    pub fn cli(&self, key_hint: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-c", "-p", &self.ports[0].to_string()])
            .args(key_hint)
            .output()
            .unwrap();
        assert!(output.status.success(), "redis-cli -c {key_hint:?} failed");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The cluster's slot of a key, as Redis computes it.
    pub fn slot(&self, key: &str) -> u16 {
        self.cli(&["CLUSTER", "KEYSLOT", key]).parse().unwrap()
    }

    /// Number of keys over every master.
    pub fn key_count(&self) -> u64 {
        self.ports
            .iter()
            .map(|&port| self.try_cli(port, &["DBSIZE"]).unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// The seed URLs, comma-separated, as `--redis-url` takes them.
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn nodes(&self) -> &[Process] {
        &self.nodes
    }

    /// Stops every node.
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// An HTTP client that keeps its connection alive between requests.
pub fn keep_alive_agent() -> ureq::Agent {
    agent()
}

/// POST with a given agent (reusing its connections); a transport failure is status 0.
pub fn post_with(agent: &ureq::Agent, url: &str, body: &str) -> Reply {
    into_reply(
        agent
            .post(url)
            .set("content-type", "application/json")
            .send_string(body),
    )
}

/// Runs `threads` threads, each with its own keep-alive connection, each sending
/// `per_thread` requests built by `body(thread, i)`; returns every reply.
pub fn load<F>(url: &str, threads: usize, per_thread: usize, body: F) -> Vec<Reply>
where
    F: Fn(usize, usize) -> String + Send + Sync + 'static,
{
    let body = std::sync::Arc::new(body);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (body, barrier, url) = (body.clone(), barrier.clone(), url.to_string());
            std::thread::spawn(move || {
                let agent = keep_alive_agent();
                barrier.wait();
                (0..per_thread)
                    .map(|i| post_with(&agent, &url, &body(t, i)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

/// The algorithms' wire names.
pub const ALGORITHMS: [&str; 4] = [
    "token_bucket",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
];

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

/// Replies that are 200s with `"allowed":true`.
pub fn count_allowed(replies: &[Reply]) -> usize {
    replies
        .iter()
        .filter(|r| r.status == 200 && r.body.starts_with(r#"{"allowed":true"#))
        .count()
}
// ---- Helpers for tests/deploy.rs: shipped configs, started as they are. ----

/// A fresh scratch directory (under `target/test-runs`) for files a test writes.
pub fn scratch(name: &str) -> PathBuf {
    scratch_dir(name)
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
