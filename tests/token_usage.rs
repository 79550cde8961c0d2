//! `cost_from_response: { "token_usage" }` end to end: Envoy's own `ai_protocol_manager`
//! filter reads each language-model response (OpenAI's chat completions, as JSON and as
//! a stream of events) and publishes its token counts as typed filter metadata
//! (`envoy.ai.token_usage`); the rate-limit filter settles its counter from them, in
//! real Envoy from the pinned wheel, in front of a real upstream, the real shim and Redis.
//! Either filter order works: the filter reads the metadata once the stream is over. A
//! response the manager could not read is charged the rule's `unreported_cost`.
//!
//! The upstream (tests/support/upstream.rs) reports `x-prompt-tokens` as the prompt's
//! and `x-tokens` as the completion's (a stream) or the total (JSON).

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::*;

/// 1,000 tokens a minute (one per 60 ms), an estimate of 100 charged at admission.
const LIMIT: u64 = 1_000;
const ESTIMATE: u64 = 100;
const MS_PER_TOKEN: u64 = 60;
const UNREPORTED: u64 = 700;
const SETTLED_WITHIN: Duration = Duration::from_secs(10);

fn plugin_config() -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        "rules": [{
            "name": "by-usage", "match": { "path_prefix": "/v1/chat/completions" },
            "key": [{ "header": "x-api-key" }], "limit": LIMIT, "period": "1m", "cost": ESTIMATE,
            "cost_from_response": {
                "token_usage": { "fields": [
                    { "path": "input_tokens" }, { "path": "output_tokens", "weight": 4 }] },
                "unreported_cost": UNREPORTED
            }
        }]
    })
}

/// Envoy's AI protocol manager, reading every route's responses as OpenAI chat
/// completions.
fn protocol_manager() -> Value {
    json!({
        "name": "envoy.filters.http.ai_protocol_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ai_protocol_manager.v3.AiProtocolManager",
            "response_handling": { "token_usage": {
                "include_unconfigured_routes": true,
                "default_llm_protocol": "OPENAI_CHAT_COMPLETIONS"
            } }
        }
    })
}

struct Stack {
    redis: Redis,
    _shim: Shim,
    _upstream: Upstream,
    envoy: Envoy,
}

impl Stack {
    /// The manager before the rate-limit filter (`manager_first`), so that it encodes
    /// the response after it, or after it, so that it encodes first.
    fn start(manager_first: bool) -> Stack {
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let upstream = Upstream::start();
        let mut config = envoy_config_to_upstream(shim.port, &plugin_config(), upstream.port);
        let filters = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["http_filters"]
            .as_array_mut()
            .unwrap();
        let ours = filters
            .iter()
            .position(|filter| filter["name"] == "envoy.filters.http.wasm")
            .unwrap();
        filters.insert(if manager_first { ours } else { ours + 1 }, protocol_manager());
        let envoy = Envoy::start_bootstrap(&config);
        Stack {
            redis,
            _shim: shim,
            _upstream: upstream,
            envoy,
        }
    }

    /// Sends one request for a client seen for the first time; its reply and the
    /// counter its admission made.
    fn ask(&self, api_key: &str, report: &str, prompt: u64, tokens: u64) -> (Reply, String) {
        self.ask_with(api_key, report, prompt, tokens, &[])
    }

    fn ask_with(
        &self,
        api_key: &str,
        report: &str,
        prompt: u64,
        tokens: u64,
        more: &[(&str, &str)],
    ) -> (Reply, String) {
        let counters = || -> Vec<String> {
            let keys = self.redis.cli(&["KEYS", "*by-usage/*"]);
            keys.lines().map(str::to_string).collect()
        };
        let before = counters();
        let (prompt, tokens) = (prompt.to_string(), tokens.to_string());
        let mut headers = vec![
            ("x-api-key", api_key),
            ("x-report", report),
            ("x-prompt-tokens", &prompt),
            ("x-tokens", &tokens),
        ];
        headers.extend_from_slice(more);
        let reply = get(&self.envoy.url("/v1/chat/completions"), &headers);
        assert_eq!(reply.status, 200, "{api_key}: {}", reply.body);
        let fresh: Vec<String> = counters()
            .into_iter()
            .filter(|key| !before.contains(key))
            .collect();
        assert_eq!(fresh.len(), 1, "one new counter for {api_key}: {fresh:?}");
        (reply, fresh[0].clone())
    }

    /// Waits until `key` holds between `low` and `high` tokens (as the time until its
    /// bucket is full again, less what refilled since the charge).
    fn wait_holds(&self, what: &str, key: &str, low: u64, high: u64) {
        let taken_ms = || -> u64 {
            let pttl: i64 = self.redis.cli(&["PTTL", key]).trim().parse().unwrap();
            pttl.max(0) as u64
        };
        let range = low * MS_PER_TOKEN..=high * MS_PER_TOKEN;
        let deadline = Instant::now() + SETTLED_WITHIN;
        loop {
            let taken = taken_ms();
            if range.contains(&taken) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the counter holds {taken} ms, not {range:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stat(&self, stat: &str) -> u64 {
        self.envoy.stat(&format!("wasmcustom.ratelimit.by-usage.{stat}"))
    }
}

/// Each response settles its counter at input + 4 × output tokens, as Envoy read them.
fn settles_from_the_managers_counts(manager_first: bool) {
    let stack = Stack::start(manager_first);
    let order = if manager_first {
        "manager first"
    } else {
        "manager second"
    };

    // OpenAI's chunks, the usage in the last: 30 + 4 × 200 = 830 tokens (more than the
    // estimate of 100, and more than the unreported cost of 700).
    let (streamed, key) = stack.ask("streamed", "openai-stream", 30, 200);
    assert_eq!(
        streamed.body.matches("data: ").count(),
        6,
        "{order}: the stream passes whole"
    );
    stack.wait_holds(&format!("{order}: stream"), &key, 800, 830);
    assert_eq!(stack.stat("cost_settled"), 1, "{order}");

    // A JSON completion of 12 prompt and 3 completion tokens: 24, the rest of the
    // estimate given back.
    let (_, key) = stack.ask("json", "json", 12, 15);
    stack.wait_holds(&format!("{order}: json"), &key, 0, 24);
    assert_eq!(stack.stat("cost_settled"), 2, "{order}");

    // A client asking for a compressed body (which neither filter could read) gets it
    // whole and uncompressed, and pays: 40 + 4 × 50 = 240.
    let (gzip, key) = stack.ask_with("gzip", "openai-stream", 40, 50, &[("accept-encoding", "gzip")]);
    assert!(gzip.body.contains("\"usage\""), "{order}: {}", gzip.body);
    stack.wait_holds(&format!("{order}: gzip"), &key, 200, 240);
    assert_eq!(stack.stat("cost_settled"), 3, "{order}");

    // A body the manager cannot read as a completion: the unreported cost, counted.
    let (_, key) = stack.ask("plain", "plain", 0, 0);
    stack.wait_holds(&format!("{order}: unread"), &key, UNREPORTED - 30, UNREPORTED);
    assert_eq!(stack.stat("cost_unreported"), 1, "{order}");
    assert_eq!(stack.stat("cost_settled"), 3, "{order}");
}

#[test]
fn the_counter_settles_at_the_token_usage_envoy_publishes_with_the_manager_first() {
    settles_from_the_managers_counts(true);
}

#[test]
fn the_counter_settles_at_the_token_usage_envoy_publishes_with_the_manager_second() {
    settles_from_the_managers_counts(false);
}
