//! The headers and refusals as published client libraries read them, through real Envoy:
//! `ratelimit-header-parser` (npm) and `ratelimit-headers` (PyPI) read each dialect from
//! responses (tests/clients/read_headers.*), and the official `openai` client and
//! urllib3's `Retry` wait by themselves on a 429 (tests/clients/retry_waits.py). Each
//! number a client reads is compared with what the limiter decided: the limit and the
//! count admitted, the window's end, and for waits the instant the next token comes
//! (read from Redis). Where a library cannot read a dialect, the test says so, as
//! docs/CONFIG.md's table does: if a library changes, the table must.

mod support;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};
use support::*;

/// The reading rule: LIMIT requests per aligned hour, per API key.
const LIMIT: u64 = 5;
const HOUR_S: f64 = 3600.0;
/// The retry rule: one request per RETRY_PERIOD_S, per API key (a token bucket).
const RETRY_PERIOD_S: f64 = 20.0;
/// How far a client's reading of a reset may be from the limiter's (its own clock, and
/// whole seconds).
const RESET_SLACK_S: f64 = 2.0;

/// The dialect settings tried, by listener name; "shipped" is the one envoy.yaml ships.
fn dialect_settings() -> Vec<(&'static str, Value)> {
    vec![
        ("shipped", shipped_headers()),
        ("x-ratelimit", json!("x-ratelimit")),
        ("x-ratelimit-seconds", json!("x-ratelimit-seconds")),
        ("envoy-draft-03", json!("envoy-draft-03")),
        ("draft-6", json!("draft-6")),
        ("draft-7", json!("draft-7")),
        ("draft-6+7", json!(["draft-6", "draft-7"])),
        ("draft-10", json!("draft-10")),
        ("x-ratelimit+draft-10", json!(["x-ratelimit", "draft-10"])),
        ("retry-after-ms", json!(["x-ratelimit", "retry-after-ms"])),
    ]
}

/// `response.headers` of the demo's configuration (envoy.yaml).
fn shipped_headers() -> Value {
    let envoy_yaml = yaml_file(&repo_root().join("envoy.yaml"));
    let listener = &envoy_yaml["static_resources"]["listeners"][0];
    let manager = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let wasm = manager["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.wasm")
        .expect("envoy.yaml has the filter");
    let text = wasm["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap();
    let config: Value = serde_json::from_str(text).unwrap();
    config["response"]["headers"].clone()
}

fn plugin_config(headers: &Value) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        "response": { "headers": headers },
        "rules": [
            { "name": "hourly", "match": { "path_prefix": "/read" }, "key": [{ "header": "x-api-key" }],
              "algorithm": "fixed_window", "limit": LIMIT, "period": "1h" },
            { "name": "retry", "match": { "path_prefix": "/retry" }, "key": [{ "header": "x-api-key" }],
              "limit": 1, "period": format!("{RETRY_PERIOD_S}s") },
        ]
    })
}

/// One Envoy with a listener per dialect setting, each with its own filter.
struct Listeners {
    redis: Redis,
    _shim: Shim,
    _envoy: Envoy,
    ports: BTreeMap<String, u16>,
}

impl Listeners {
    fn start(host: FilterHost) -> Listeners {
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let mut config = envoy_config(shim.port, &plugin_config(&json!("none")));
        let template = config["static_resources"]["listeners"][0].clone();
        let listeners: Vec<Value> = dialect_settings()
            .into_iter()
            .map(|(name, headers)| {
                let mut listener = template.clone();
                listener["name"] = json!(name);
                let manager = &mut listener["filter_chains"][0]["filters"][0]["typed_config"];
                manager["http_filters"][0] = host.filter(&plugin_config(&headers));
                listener
            })
            .collect();
        config["static_resources"]["listeners"] = json!(listeners);
        let envoy = Envoy::start_bootstrap(&config);
        let statuses: Value = serde_json::from_str(
            &get(
                &format!("http://127.0.0.1:{}/listeners?format=json", envoy.admin_port),
                &[],
            )
            .body,
        )
        .unwrap();
        let ports = statuses["listener_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|status| {
                let port = status["local_address"]["socket_address"]["port_value"]
                    .as_u64()
                    .unwrap();
                (status["name"].as_str().unwrap().to_string(), port as u16)
            })
            .collect();
        Listeners {
            redis,
            _shim: shim,
            _envoy: envoy,
            ports,
        }
    }

    fn url(&self, listener: &str, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[listener])
    }
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn run_json_lines(command: &mut Command) -> Vec<Value> {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{command:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// What one library read from LIMIT + 2 responses of one listener, and the hour the
/// window ended in (None when the run straddled two hours).
fn read_with(
    listeners: &Listeners,
    library: &str,
    listener: &str,
    api_key: &str,
) -> (Vec<Value>, Option<f64>) {
    let window_end = || (now_s() / HOUR_S).floor() * HOUR_S + HOUR_S;
    let before = window_end();
    let url = listeners.url(listener, "/read");
    let requests = (LIMIT + 2).to_string();
    let lines = match library {
        "npm" => run_json_lines(
            Command::new("node")
                .arg(repo_root().join("tests/clients/read_headers.mjs"))
                .args([&url, api_key, &requests]),
        ),
        _ => run_json_lines(
            Command::new(repo_root().join(".venv/bin/python"))
                .arg(repo_root().join("tests/clients/read_headers.py"))
                .args([&url, api_key, &requests]),
        ),
    };
    let end = (window_end() == before).then_some(before);
    (lines, end)
}

/// Whether what a library read equals what the limiter decided: request i (from 1) of a
/// fresh key admitted while i <= LIMIT, with LIMIT - i left, the window ending at the
/// hour's end.
fn read_right(lines: &[Value], window_end: f64) -> Result<(), String> {
    for (i, line) in (1..).zip(lines) {
        let admitted = i <= LIMIT;
        let expected_status = if admitted { 200 } else { 429 };
        if line["status"] != expected_status {
            return Err(format!("request {i}: status {}", line["status"]));
        }
        if line["limit"].as_u64() != Some(LIMIT) {
            return Err(format!("request {i}: limit {}", line["limit"]));
        }
        let left = if admitted { LIMIT - i } else { 0 };
        if line["remaining"].as_u64() != Some(left) {
            return Err(format!("request {i}: remaining {} not {left}", line["remaining"]));
        }
        match line["reset"].as_f64() {
            Some(reset) if (reset - window_end).abs() <= RESET_SLACK_S => {}
            reset => return Err(format!("request {i}: reset {reset:?} not {window_end}")),
        }
    }
    Ok(())
}

on_both_hosts!(
    published_parsers_read_the_limit_remaining_and_reset_the_limiter_decided,
    clients_that_retry_by_themselves_wait_what_the_limiter_decided,
);

fn published_parsers_read_the_limit_remaining_and_reset_the_limiter_decided(host: FilterHost) {
    let listeners = Listeners::start(host);
    // Which dialects each library reads right; the others it misreads (docs/CONFIG.md).
    let reads: [(&str, &[&str]); 2] = [
        (
            "npm",
            &[
                "shipped",
                "x-ratelimit",
                "x-ratelimit-seconds",
                "envoy-draft-03",
                "draft-6",
                "draft-7",
                "draft-6+7",
                "retry-after-ms",
            ],
        ),
        (
            "pypi",
            &["shipped", "x-ratelimit", "draft-6", "draft-6+7", "retry-after-ms"],
        ),
    ];
    for (library, read) in reads {
        for (listener, _) in dialect_settings() {
            let mut outcome = None;
            for attempt in 0..2 {
                let api_key = format!("{library}-{listener}-{attempt}");
                let (lines, window_end) = read_with(&listeners, library, listener, &api_key);
                assert_eq!(lines.len() as u64, LIMIT + 2);
                if let Some(window_end) = window_end {
                    outcome = Some(read_right(&lines, window_end));
                    break;
                }
            }
            let outcome = outcome.expect("two runs straddled an hour's end");
            if read.contains(&listener) {
                assert_eq!(outcome, Ok(()), "{library} reads {listener}");
            } else {
                assert!(
                    outcome.is_err(),
                    "{library} now reads {listener}: update docs/CONFIG.md"
                );
            }
        }
    }
    // The refusal is the draft's problem, naming the rule.
    let url = listeners.url("x-ratelimit", "/read");
    let replies: Vec<Reply> = (0..=LIMIT)
        .map(|_| get(&url, &[("x-api-key", "problem")]))
        .collect();
    let refusal = replies.last().unwrap();
    assert_eq!(refusal.status, 429);
    let problem: Value = serde_json::from_str(&refusal.body).unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["violated-policies"], json!(["hourly"]));
    assert_eq!(
        problem["retry_after"].as_u64(),
        refusal.header("retry-after").and_then(|v| v.parse().ok())
    );
}

/// Lets `client` retry a refused request on `listener` and checks each wait it chose
/// against the instant the limiter admits again (`precise`: to the millisecond, else
/// rounded up to a whole second as `Retry-After` is).
fn waits_match_the_limiter(listeners: &Listeners, client: &str, listener: &str, precise: bool) {
    let api_key = format!("{client}-{listener}");
    let counters = || -> Vec<String> {
        listeners
            .redis
            .cli(&["KEYS", "*retry/*"])
            .lines()
            .map(str::to_string)
            .collect()
    };
    let earlier = counters();
    let first = get(&listeners.url(listener, "/retry"), &[("x-api-key", &api_key)]);
    assert_eq!(first.status, 200);
    // When the bucket has its next token: its counter's time to live (one token a period).
    let key = counters().into_iter().find(|key| !earlier.contains(key)).unwrap();
    let before = now_s();
    let ttl_ms: f64 = listeners.redis.cli(&["PTTL", &key]).trim().parse().unwrap();
    let admits_at = before + ttl_ms / 1000.0;
    let base = match client {
        "openai" => listeners.url(listener, "/retry/v1"),
        _ => listeners.url(listener, "/retry"),
    };
    let output = run_json_lines(
        Command::new(repo_root().join(".venv/bin/python"))
            .arg(repo_root().join("tests/clients/retry_waits.py"))
            .args([client, &base, &api_key]),
    );
    let report = &output[0];
    assert_eq!(report["outcome"], "refused", "{client} on {listener}: {report}");
    let waits = report["waits"].as_array().unwrap();
    assert_eq!(waits.len(), 2, "{client} retried twice: {report}");
    for wait in waits {
        let seconds = wait["seconds"].as_f64().unwrap();
        let decided = admits_at - wait["at"].as_f64().unwrap();
        let slack = if precise { 0.25 } else { 1.25 };
        assert!(
            seconds >= decided - 0.25 && seconds <= decided + slack,
            "{client} on {listener} waited {seconds} s; the limiter admits in {decided} s"
        );
    }
}

fn clients_that_retry_by_themselves_wait_what_the_limiter_decided(host: FilterHost) {
    let listeners = Listeners::start(host);
    waits_match_the_limiter(&listeners, "openai", "retry-after-ms", true);
    waits_match_the_limiter(&listeners, "openai", "shipped", false);
    waits_match_the_limiter(&listeners, "urllib3", "shipped", false);
}
