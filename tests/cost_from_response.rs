//! `cost_from_response` end to end: real Envoy in front of a real upstream that reports
//! each request's tokens (tests/support/upstream.rs, `x-report`), the real shim and Redis. The admission
//! charges the estimate; when the response ends, the counter is settled at the reported
//! cost, read from a header, a trailer, a JSON body or a stream of events (driven by the
//! official `openai` client): more charged (into debt, refused with a truthful
//! Retry-After), or the rest given back. A response reporting nothing is charged the
//! rule's `unreported_cost`, counted; nothing the client sends makes it cheaper (gzip, a
//! range, going away mid-response); debt stays within its bound per counter however
//! many responses report at once; reading bodies costs Envoy no memory per byte; a
//! settlement lost with its call (the shim gone) is counted. Those in `on_both_hosts!`
//! run on the `.wasm` and on the dynamic module.

mod support;

use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;
use support::*;

/// Every rule: 1,000 tokens a minute (one token per 60 ms), an estimate of 100.
const LIMIT: u64 = 1_000;
const ESTIMATE: u64 = 100;
const MS_PER_TOKEN: u64 = 60;
/// Longest a settlement may take to reach Redis on a loaded machine.
const SETTLED_WITHIN: Duration = Duration::from_secs(10);
/// What the rules that state it charge a response whose cost never arrived.
const UNREPORTED: u64 = 4_000;

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
            rule("by-stream", "/stream", "token_bucket", json!({ "json_fields": [
                { "path": "usage.prompt_tokens" }, { "path": "usage.completion_tokens", "weight": 4 }],
                "unreported_cost": UNREPORTED })),
            rule("by-anthropic", "/anthropic", "token_bucket", json!({ "json_fields": [
                { "path": "message.usage.input_tokens" }, { "path": "usage.output_tokens", "weight": 5 }],
                "unreported_cost": UNREPORTED })),
            rule("priced", "/priced", "token_bucket",
                json!({ "json_field": "usage.total_tokens", "unreported_cost": UNREPORTED })),
            rule("by-index", "/index", "token_bucket", json!({ "json_field": "choices.0.n" })),
            // Older configurations set the most of a body kept: still loads, no effect.
            rule("big", "/big", "token_bucket", json!({ "json_field": "usage.total_tokens", "max_body_bytes": 1_048_576 })),
            json!({ "name": "tiny", "match": { "path_prefix": "/tiny" }, "key": [{ "header": "x-api-key" }],
                   "limit": 10, "period": "1m", "cost": 1, "cost_from_response": { "header": "x-usage-tokens" } }),
        ]
    })
}

/// The test bootstrap with every route going to the upstream, which may send trailers.
fn bootstrap(host: FilterHost, shim_port: u16, upstream_port: u16, plugin_config: &Value) -> Value {
    let mut config = host.envoy_config(shim_port, plugin_config);
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
    host: FilterHost,
}

impl LlmStack {
    fn start() -> LlmStack {
        LlmStack::start_on(FilterHost::Wasm)
    }

    fn start_on(host: FilterHost) -> LlmStack {
        LlmStack::start_with(host, &plugin_config(), 2)
    }

    fn start_with(host: FilterHost, plugin_config: &Value, workers: u32) -> LlmStack {
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let upstream = Upstream::start();
        let envoy = Envoy::start_bootstrap_with_workers(
            &bootstrap(host, shim.port, upstream.port, plugin_config),
            workers,
        );
        LlmStack {
            redis,
            _shim: shim,
            _upstream: upstream,
            envoy,
            host,
        }
    }

    fn ask(&self, path: &str, api_key: &str, report: &str, tokens: u64) -> Reply {
        self.ask_with(path, api_key, report, tokens, &[])
    }

    fn ask_with(&self, path: &str, api_key: &str, report: &str, tokens: u64, more: &[(&str, &str)]) -> Reply {
        let tokens = tokens.to_string();
        let mut headers = vec![
            ("x-api-key", api_key),
            ("x-report", report),
            ("x-tokens", &tokens),
        ];
        headers.extend_from_slice(more);
        get(&self.envoy.url(path), &headers)
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
        self.envoy.stat(&self.host.stat(&format!("{rule}.{stat}")))
    }
}

on_both_hosts!(
    each_source_settles_the_reported_cost_in_the_same_counter,
    a_cost_below_the_estimate_is_given_back_and_one_above_the_limit_is_debt,
    a_window_counts_past_its_limit_until_it_ends,
    a_response_without_a_cost_keeps_the_estimate_and_is_counted,
    a_client_that_goes_away_mid_response_is_still_settled,
    a_stream_read_by_the_official_openai_client_is_charged_its_weighted_usage,
    nothing_the_client_sends_makes_the_response_cheaper,
    debt_stays_within_its_bound_per_counter_however_many_responses_report_at_once,
    a_path_through_an_array_settles_and_a_repeated_header_counts_its_largest_value,
);

fn each_source_settles_the_reported_cost_in_the_same_counter(host: FilterHost) {
    let stack = LlmStack::start_on(host);
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

fn a_cost_below_the_estimate_is_given_back_and_one_above_the_limit_is_debt(host: FilterHost) {
    let stack = LlmStack::start_on(host);
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

fn a_window_counts_past_its_limit_until_it_ends(host: FilterHost) {
    let stack = LlmStack::start_on(host);
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

fn a_response_without_a_cost_keeps_the_estimate_and_is_counted(host: FilterHost) {
    let stack = LlmStack::start_on(host);
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

fn a_client_that_goes_away_mid_response_is_still_settled(host: FilterHost) {
    let stack = LlmStack::start_on(host);
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
    let envoy = Envoy::start_bootstrap(&bootstrap(
        FilterHost::Wasm,
        shim.port,
        upstream.port,
        &plugin_config(),
    ));
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

fn a_stream_read_by_the_official_openai_client_is_charged_its_weighted_usage(host: FilterHost) {
    let stack = LlmStack::start_on(host);
    let output = Command::new(repo_root().join(".venv/bin/python"))
        .arg(repo_root().join("tests/clients/openai_stream.py"))
        .args([&stack.envoy.url("/stream/v1"), "streamer", "300", "9"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let read: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        read["text"], "Hello there!",
        "the client read the whole stream: nothing held back"
    );
    assert_eq!(
        (read["prompt_tokens"].as_u64(), read["completion_tokens"].as_u64()),
        (Some(9), Some(300))
    );
    // 9 x 1 + 300 x 4 = 1,209 tokens: 1,209 x 60 ms of the bucket (the estimate alone is
    // 6 s; the unweighted total 18.5 s).
    stack.wait_settled("by-stream", |taken_ms| taken_ms > 60_000);
    assert!(stack.taken_ms(&stack.key("by-stream")) <= 1_209 * MS_PER_TOKEN);
    assert_eq!(stack.stat("by-stream", "cost_settled"), 1);

    // Anthropic's shape: input tokens in the first event, output tokens in the last.
    let streamed = stack.ask_with(
        "/anthropic",
        "claude",
        "anthropic-stream",
        100,
        &[("x-prompt-tokens", "20")],
    );
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert!(streamed.body.contains("message_stop"), "{}", streamed.body);
    // 20 + 100 x 5 = 520 tokens: 31.2 s of the bucket.
    stack.wait_settled("by-anthropic", |taken_ms| taken_ms > 25_000);
    assert!(stack.taken_ms(&stack.key("by-anthropic")) <= 520 * MS_PER_TOKEN);
}

fn nothing_the_client_sends_makes_the_response_cheaper(host: FilterHost) {
    let stack = LlmStack::start_on(host);
    // It accepts gzip, as a content or a transfer coding: the upstream is asked for identity, so the body stays readable.
    let gzip = stack.ask_with(
        "/priced",
        "gzip",
        "json",
        900,
        &[("accept-encoding", "gzip, br"), ("te", "gzip")],
    );
    assert_eq!(gzip.status, 200, "{}", gzip.body);
    assert_eq!(
        gzip.header("content-encoding"),
        None,
        "the upstream was asked for identity"
    );
    assert!(gzip.body.contains(r#""total_tokens":900"#), "{}", gzip.body);
    // It asks for the first bytes only: the whole body comes, with its usage.
    let range = stack.ask_with("/priced", "range", "json", 900, &[("range", "bytes=0-10")]);
    assert_eq!(range.status, 200, "{}", range.body);
    // It goes away before the usage arrives: charged the rule's unreported_cost.
    let agent = agent();
    let response = agent
        .get(&stack.envoy.url("/priced"))
        .set("x-api-key", "aborts")
        .set("x-report", "stall-json")
        .call()
        .unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    drop(agent);
    wait_until("settled", SETTLED_WITHIN, || {
        stack.stat("priced", "cost_settled") == 2 && stack.stat("priced", "cost_unreported") == 1
    });
    let keys = stack.redis.cli(&["KEYS", "*priced/*"]);
    let mut taken: Vec<u64> = keys.lines().map(|key| stack.taken_ms(key)).collect();
    taken.sort();
    // 900 tokens each for gzip and range (54 s), 4,000 for the abort (240 s): none at the
    // estimate (6 s).
    assert_eq!(taken.len(), 3, "{keys}");
    assert!(taken[0] > 45_000 && taken[1] <= 900 * MS_PER_TOKEN, "{taken:?}");
    assert!(
        taken[2] > 230_000 && taken[2] <= UNREPORTED * MS_PER_TOKEN,
        "{taken:?}"
    );
}

fn debt_stays_within_its_bound_per_counter_however_many_responses_report_at_once(host: FilterHost) {
    let stack = LlmStack::start_on(host);
    // Ten requests admitted at once on 10 a minute, each reporting ~1e20 tokens.
    let barrier = std::sync::Barrier::new(10);
    let replies: Vec<u16> = std::thread::scope(|scope| {
        let asks: Vec<_> = (0..10)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    stack.ask("/tiny", "flood", "header", u64::MAX).status
                })
            })
            .collect();
        asks.into_iter().map(|ask| ask.join().unwrap()).collect()
    });
    // Normally all ten; on a loaded machine a thread may send its request only after an
    // earlier one's debt landed, and is rightly refused. Two settling at once still test
    // the bound per counter.
    let admitted = replies.iter().filter(|status| **status == 200).count() as u64;
    assert!(
        admitted >= 2 && replies.iter().all(|status| matches!(status, 200 | 429)),
        "{replies:?}"
    );
    let key = stack.key("tiny");
    wait_until("the admitted settled", SETTLED_WITHIN, || {
        stack.stat("tiny", "cost_settled") == admitted
    });
    // Each settlement went to the shim as its response ended; the first to land puts the
    // counter 100 periods deep.
    wait_until("debt in Redis", SETTLED_WITHIN, || {
        stack.taken_ms(&key) > 5_000_000
    });
    // At most MAX_DEBT_LIMITS (100) limits of debt: the bucket is full again within 101
    // periods, not 1,001.
    let taken_ms = stack.taken_ms(&key);
    assert!(
        (5_000_000..=101 * 60_000).contains(&taken_ms),
        "{taken_ms} ms of debt"
    );
    assert_eq!(stack.ask("/tiny", "flood", "header", 1).status, 429);
}

#[test]
fn reading_bodies_costs_envoy_no_memory_per_byte_and_a_worker_budget_bounds_the_readers() {
    const RESPONSES: usize = 200;
    let stack = LlmStack::start();
    let round = |path: &'static str| {
        std::thread::scope(|scope| {
            let asks: Vec<_> = (0..RESPONSES)
                .map(|i| {
                    let stack = &stack;
                    scope.spawn(move || stack.ask(path, &format!("client-{i}"), "big-json", 50).status)
                })
                .collect();
            let statuses: Vec<u16> = asks.into_iter().map(|ask| ask.join().unwrap()).collect();
            assert!(
                statuses.iter().all(|status| *status == 200),
                "{path}: {statuses:?}"
            );
        })
    };
    // The baseline: the same 1 MiB responses through a route no rule reads. Envoy's own
    // buffers live in its heap and vary with how fast the clients read; the VMs' memory
    // is outside it.
    round("/plain");
    let baseline = stack.envoy.resident_outside_heap_bytes();
    round("/big");
    wait_until("200 settled", SETTLED_WITHIN, || {
        stack.stat("big", "cost_settled") == RESPONSES as u64
    });
    let grown = stack.envoy.resident_outside_heap_bytes().saturating_sub(baseline);
    eprintln!(
        "reading 200 bodies of 1 MiB: +{} KiB outside Envoy's heap",
        grown >> 10
    );
    // Kept whole, as before, the bodies took 1 MiB each in the VM, and kept it.
    assert!(
        grown < 16 << 20,
        "Envoy grew {} MiB outside its heap reading 200 bodies of 1 MiB",
        grown >> 20
    );

    // One worker whose budget holds a few readers: past it a response is charged as
    // unreported, counted; the budget comes back as responses end.
    let mut config = json!({ "shim_cluster": "ratelimit_shim", "timeout": "5s", "cost_body_budget_bytes": 1024,
        "rules": [rule("priced", "/priced", "token_bucket",
            json!({ "json_field": "usage.total_tokens", "unreported_cost": UNREPORTED }))] });
    config["rules"][0]["limit"] = json!(100_000);
    let stack = LlmStack::start_with(FilterHost::Wasm, &config, 1);
    let agent = agent();
    let held: Vec<_> = (0..8)
        .map(|i| {
            agent
                .get(&stack.envoy.url("/priced"))
                .set("x-api-key", &format!("held-{i}"))
                .set("x-report", "stall-json")
                .call()
                .unwrap()
        })
        .collect();
    drop(held);
    drop(agent);
    wait_until("8 unreported", SETTLED_WITHIN, || {
        stack.stat("priced", "cost_unreported") == 8
    });
    let over = stack.stat("priced", "cost_over_budget");
    assert!(
        (1..8).contains(&over),
        "{over} of 8 held responses over a 1 KiB budget"
    );
    let read = stack.ask("/priced", "after", "json", 700);
    assert_eq!(read.status, 200, "{}", read.body);
    wait_until("read again", SETTLED_WITHIN, || {
        stack.stat("priced", "cost_settled") == 1
    });
}

#[test]
fn mistakes_that_can_never_work_are_refused_when_envoy_loads_them() {
    let plugin = |rule: Value| json!({ "shim_cluster": "ratelimit_shim", "rules": [rule] });
    let base = || json!({ "name": "r", "key": [{ "header": "x-api-key" }], "limit": 10, "period": "1m" });
    let with = |field: &str, value: Value| {
        let mut rule = base();
        rule[field] = value;
        rule
    };
    let mut concurrency = with("algorithm", json!("concurrency"));
    concurrency.as_object_mut().unwrap().remove("period");
    concurrency["max_duration"] = json!("1ms");
    for (rule, field) in [
        (concurrency, "rules[0].max_duration"),
        (with("period", json!(" 10s")), "rules[0].period"),
        (with("period", json!("10S")), "rules[0].period"),
        (
            with("cost_from_response", json!({ "json_field": "choices. 0" })),
            "rules[0].cost_from_response.json_field",
        ),
        (
            with(
                "cost_from_response",
                json!({ "header": "x", "unreported_cost": "max" }),
            ),
            "rules[0].cost_from_response.unreported_cost",
        ),
    ] {
        let (loaded, output) = envoy_validate_plugin(&plugin(rule));
        assert!(!loaded, "{field}: loaded");
        assert!(output.contains(field), "{field} not named in:\n{output}");
    }
    // Loud, not refused: a rule that charges only the estimate to a client that aborts.
    let (loaded, output) =
        envoy_validate_plugin(&plugin(with("cost_from_response", json!({ "header": "x" }))));
    assert!(loaded, "{output}");
    assert!(
        output.contains("rules[0].cost_from_response.unreported_cost is not set"),
        "{output}"
    );
}

fn a_path_through_an_array_settles_and_a_repeated_header_counts_its_largest_value(host: FilterHost) {
    let stack = LlmStack::start_on(host);
    let admitted = stack.ask("/index", "indexed", "json", 600);
    assert_eq!(admitted.status, 200, "{}", admitted.body);
    stack.wait_settled("by-index", |taken_ms| taken_ms > 30_000);
    assert_eq!(stack.stat("by-index", "cost_settled"), 1);
    // `x-usage-tokens: 1` then `x-usage-tokens: 600`: 600 charged, not 1.
    let twice = stack.ask("/header", "twice", "header-twice", 600);
    assert_eq!(twice.status, 200, "{}", twice.body);
    stack.wait_settled("by-header", |taken_ms| taken_ms > 30_000);
}
