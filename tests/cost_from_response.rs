//! `cost_from_response` end to end: real Envoy in front of a real upstream that reports
//! each request's tokens (tests/support/upstream.rs, `x-report`), the real shim and Redis. The admission
//! charges the estimate; when the response ends, the counter is settled at the reported
//! cost, read from a header, a trailer or a JSON body: more charged (into debt, refused
//! with a truthful Retry-After), or the rest given back. A response reporting nothing
//! leaves the estimate, counted; a client that goes away mid-response is still settled;
//! a settlement lost with its call (the shim gone) is counted.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

/// Every rule: 1,000 tokens a minute (one token per 60 ms), an estimate of 100.
const LIMIT: u64 = 1_000;
const ESTIMATE: u64 = 100;
const MS_PER_TOKEN: u64 = 60;
/// Longest a settlement may take to reach Redis on a loaded machine.
const SETTLED_WITHIN: Duration = Duration::from_secs(10);

fn rule(name: &str, path: &str, algorithm: &str, source: Value) -> Value {
    json!({ "name": name, "match": { "path_prefix": path }, "key": [{ "header": "x-api-key" }],
            "algorithm": algorithm, "limit": LIMIT, "period": "1m", "cost": ESTIMATE,
            "cost_from_response": source })
}

fn plugin_config() -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        "response": { "headers": "both" },
        "rules": [
            rule("by-header", "/header", "token_bucket", json!({ "header": "x-usage-tokens" })),
            rule("by-trailer", "/trailer", "token_bucket", json!({ "trailer": "x-usage-tokens" })),
            rule("by-json", "/json", "token_bucket", json!({ "json_field": "usage.total_tokens" })),
            rule("by-window", "/window", "fixed_window", json!({ "header": "x-usage-tokens" })),
        ]
    })
}

/// The test bootstrap with every route going to the upstream, which may send trailers.
fn bootstrap(shim_port: u16, upstream_port: u16) -> Value {
    let mut config = envoy_config(shim_port, &plugin_config());
    let manager =
        &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    manager["route_config"]["virtual_hosts"][0]["routes"] =
        json!([{ "match": { "prefix": "/" }, "route": { "cluster": "llm", "timeout": "10s" } }]);
    config["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "name": "llm",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": { "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http_protocol_options": { "enable_trailers": true } } } },
            "load_assignment": { "cluster_name": "llm",
                "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": loopback(upstream_port) } }] }] }
        }));
    config
}

struct LlmStack {
    redis: Redis,
    _shim: Shim,
    _upstream: Upstream,
    envoy: Envoy,
}

impl LlmStack {
    fn start() -> LlmStack {
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let upstream = Upstream::start();
        let envoy = Envoy::start_bootstrap(&bootstrap(shim.port, upstream.port));
        LlmStack {
            redis,
            _shim: shim,
            _upstream: upstream,
            envoy,
        }
    }

    fn ask(&self, path: &str, api_key: &str, report: &str, tokens: u64) -> Reply {
        let tokens = tokens.to_string();
        get(
            &self.envoy.url(path),
            &[
                ("x-api-key", api_key),
                ("x-report", report),
                ("x-tokens", &tokens),
            ],
        )
    }

    /// The one counter of `rule`.
    fn key(&self, rule: &str) -> String {
        let keys = self.redis.cli(&["KEYS", &format!("*{rule}/*")]);
        let keys: Vec<&str> = keys.lines().collect();
        assert_eq!(keys.len(), 1, "one counter for {rule}: {keys:?}");
        keys[0].to_string()
    }

    /// How far ahead of now a token bucket's full time lies: its tokens taken, in ms.
    fn taken_ms(&self, key: &str) -> u64 {
        self.redis
            .cli(&["PTTL", key])
            .trim()
            .parse::<i64>()
            .unwrap()
            .max(0) as u64
    }

    /// Waits until the counter of `rule` shows the settlement (`settled` says when).
    fn wait_settled(&self, rule: &str, settled: impl Fn(u64) -> bool) {
        let key = self.key(rule);
        wait_until(&format!("{rule} settled"), SETTLED_WITHIN, || {
            settled(self.taken_ms(&key))
        });
    }

    fn stat(&self, rule: &str, stat: &str) -> u64 {
        self.envoy.stat(&format!("wasmcustom.ratelimit.{rule}.{stat}"))
    }
}

#[test]
fn each_source_settles_the_reported_cost_in_the_same_counter() {
    let stack = LlmStack::start();
    for (rule, path, report) in [
        ("by-header", "/header", "header"),
        ("by-trailer", "/trailer", "trailer"),
        ("by-json", "/json", "json"),
    ] {
        let admitted = stack.ask(path, "client-a", report, 600);
        assert_eq!(admitted.status, 200, "{rule}: {}", admitted.body);
        // The admission charged the estimate: what the client is told at once.
        assert_eq!(
            admitted.number("x-ratelimit-remaining"),
            LIMIT - ESTIMATE,
            "{rule}"
        );
        // 600 tokens taken: the bucket is full again 600 * 60 ms from now, less what
        // refilled since (the estimate alone would be 6 s).
        stack.wait_settled(rule, |taken_ms| taken_ms > 30_000);
        assert_eq!(stack.stat(rule, "cost_settled"), 1, "{rule}");
        let next = stack.ask(path, "client-a", report, ESTIMATE);
        assert_eq!(next.status, 200, "{rule}: {}", next.body);
        let remaining = next.number("x-ratelimit-remaining");
        // 1000 - 600 - 100, plus at most a few seconds of refill on a slow machine.
        assert!(
            (300..=400).contains(&remaining),
            "{rule}: remaining {remaining} after a settled 600 and an estimate of 100"
        );
    }
}

#[test]
fn a_cost_below_the_estimate_is_given_back_and_one_above_the_limit_is_debt() {
    let stack = LlmStack::start();
    let cheap = stack.ask("/header", "cheap", "header", 10);
    assert_eq!(cheap.status, 200, "{}", cheap.body);
    // 100 charged, 90 given back: 10 tokens, 600 ms of the bucket.
    let key = stack.key("by-header");
    wait_until("refund", SETTLED_WITHIN, || {
        stack.taken_ms(&key) <= 10 * MS_PER_TOKEN
    });
    let next = stack.ask("/header", "cheap", "header", ESTIMATE);
    assert!(next.number("x-ratelimit-remaining") >= LIMIT - 10 - ESTIMATE);

    // 1,500 tokens used against an estimate of 100: 500 beyond a full bucket.
    let heavy = stack.ask("/json", "heavy", "json", 1_500);
    assert_eq!(heavy.status, 200, "{}", heavy.body);
    stack.wait_settled("by-json", |taken_ms| taken_ms > 60_000);
    let refused = stack.ask("/json", "heavy", "json", ESTIMATE);
    assert_eq!(refused.status, 429, "{}", refused.body);
    // Admitted again once the debt is repaid and the estimate has refilled:
    // (1,500 + 100 - 1,000) tokens * 60 ms = 36 s from the charge, less the time since.
    let retry_after = refused.number("retry-after");
    assert!(
        (30..=36).contains(&retry_after),
        "Retry-After {retry_after} s for a debt of 500 tokens plus an estimate of 100"
    );
    assert_eq!(refused.number("x-ratelimit-remaining"), 0);
    let draft = refused.header("ratelimit").unwrap();
    assert!(draft.contains(&format!("t={retry_after}")), "{draft}");
    // Another client is not affected.
    assert_eq!(stack.ask("/json", "light", "json", ESTIMATE).status, 200);

    // A report past every bound is charged at most 100 limits beyond the estimate
    // (wire::MAX_DEBT_LIMITS): 100,100 tokens, 6,006 s of the bucket, not years.
    let huge = stack.ask("/trailer", "huge", "trailer", 1_000_000_000_000);
    assert_eq!(huge.status, 200, "{}", huge.body);
    stack.wait_settled("by-trailer", |taken_ms| taken_ms > 6_000_000);
    let refused = stack.ask("/trailer", "huge", "trailer", ESTIMATE);
    assert_eq!(refused.status, 429, "{}", refused.body);
    let retry_after = refused.number("retry-after");
    // (100,100 + 100 - 1,000) tokens * 60 ms, less the time since the charge.
    assert!(
        (5_900..=5_952).contains(&retry_after),
        "Retry-After {retry_after}"
    );
}

#[test]
fn a_window_counts_past_its_limit_until_it_ends() {
    let stack = LlmStack::start();
    let admitted = stack.ask("/window", "w", "header", 1_200);
    assert_eq!(admitted.status, 200, "{}", admitted.body);
    let key = stack.key("by-window");
    wait_until("window settled", SETTLED_WITHIN, || {
        stack.redis.cli(&["HGET", &key, "n"]).trim() == "1200"
    });
    let refused = stack.ask("/window", "w", "header", ESTIMATE);
    assert_eq!(refused.status, 429, "{}", refused.body);
    // Refused until the window ends, as its reset says.
    let retry_after = refused.number("retry-after");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let reset_at = refused.number("x-ratelimit-reset");
    let now_s = stack.redis.time_ms() / 1000;
    assert!(
        reset_at.abs_diff(now_s + retry_after) <= 1,
        "reset {reset_at}, now {now_s}, retry {retry_after}"
    );
}

#[test]
fn a_response_without_a_cost_keeps_the_estimate_and_is_counted() {
    let stack = LlmStack::start();
    for (rule, path) in [
        ("by-header", "/header"),
        ("by-trailer", "/trailer"),
        ("by-json", "/json"),
    ] {
        let admitted = stack.ask(path, "silent", "none", 0);
        assert_eq!(admitted.status, 200, "{}", admitted.body);
        wait_until(&format!("{rule} unreported"), SETTLED_WITHIN, || {
            stack.stat(rule, "cost_unreported") == 1
        });
        assert_eq!(stack.stat(rule, "cost_settled"), 0);
        // The estimate stays: 100 tokens, 6 s of the bucket (less what refilled).
        let taken_ms = stack.taken_ms(&stack.key(rule));
        assert!(
            (4_000..=ESTIMATE * MS_PER_TOKEN).contains(&taken_ms),
            "{rule}: {taken_ms}"
        );
    }
}

#[test]
fn a_client_that_goes_away_mid_response_is_still_settled() {
    let stack = LlmStack::start();
    let agent = agent();
    let response = agent
        .get(&stack.envoy.url("/header"))
        .set("x-api-key", "gone")
        .set("x-report", "stall")
        .set("x-tokens", "800")
        .call()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.header("x-usage-tokens"), Some("800"));
    // The body never ends: the client hangs up.
    drop(response);
    drop(agent);
    stack.wait_settled("by-header", |taken_ms| taken_ms > 40_000);
    assert_eq!(stack.stat("by-header", "cost_settled"), 1);
}

#[test]
fn a_settlement_lost_with_its_call_is_counted() {
    let redis = Redis::start();
    let mut shim = Shim::start(&redis.url(), &[]);
    let upstream = Upstream::start();
    let envoy = Envoy::start_bootstrap(&bootstrap(shim.port, upstream.port));
    let agent = agent();
    let response = agent
        .get(&envoy.url("/header"))
        .set("x-api-key", "lost")
        .set("x-report", "stall")
        .set("x-tokens", "800")
        .call()
        .unwrap();
    assert_eq!(response.status(), 200);
    // The shim goes away while the response streams: the settlement has nowhere to go.
    shim.kill();
    drop(response);
    drop(agent);
    wait_until("the lost settlement counted", SETTLED_WITHIN, || {
        envoy.stat("wasmcustom.ratelimit.adjustments_lost") >= 1
    });
    assert_eq!(envoy.stat("wasmcustom.ratelimit.by-header.cost_settled"), 1);
    // Redis keeps the estimate: 100 tokens, at most 6 s of the bucket.
    let keys = redis.cli(&["KEYS", "*by-header/*"]);
    let taken_ms: u64 = redis.cli(&["PTTL", keys.trim()]).trim().parse().unwrap();
    assert!(taken_ms <= ESTIMATE * MS_PER_TOKEN, "{taken_ms}");
}
