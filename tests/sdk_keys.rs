//! The demo's `llm-tokens` rule limits the official SDKs as they send their keys: real
//! Envoy running envoy.yaml's own configuration (routes, filters, plugin config), in front
//! of the demo's stand-in upstream (`scripts/llm-upstream.py`), driven by the `openai`
//! and `anthropic` packages from `.venv` (tests/clients/sdk_keys.py).
//!
//! - openai sends `Authorization: Bearer KEY` to /v1/chat/completions;
//! - anthropic sends `x-api-key: KEY` to /v1/messages, or `Authorization: Bearer KEY`
//!   when given an auth token.
//!
//! Each is refused by `llm-tokens` (429, seen as the SDK's RateLimitError) once its key
//! has used the rule's 1,000 tokens, another key is not, and one key is one client
//! whichever header carries it.

mod support;

use serde_json::{json, Value};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;
use support::*;

/// What each request reports using; the rule allows 1,000 a minute, admitting on 100.
const TOKENS: u64 = 400;

/// The demo's stand-in language-model upstream, on a port of its own.
fn start_llm_upstream() -> (Process, ClaimedPort) {
    let claimed = claim_port();
    let port = claimed.port;
    let process = Process::spawn(
        Command::new("python3")
            .arg(repo_root().join("scripts/llm-upstream.py"))
            .arg(port.to_string()),
        scratch("llm-upstream").join("llm.log"),
    );
    wait_until("the llm upstream", Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (process, claimed)
}

/// One SDK's requests, each a JSON line of tests/clients/sdk_keys.py.
fn drive(envoy: &Envoy, client: &str, key: &str, count: u32) -> Vec<Value> {
    let output = Command::new(repo_root().join(".venv/bin/python"))
        .arg(repo_root().join("tests/clients/sdk_keys.py"))
        .args([
            client,
            &envoy.url(""),
            key,
            &TOKENS.to_string(),
            &count.to_string(),
        ])
        // Only the key given on the command line: none from the environment.
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{client}: sdk_keys.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

/// The requests answered before the refusal, checking that the last line is the
/// llm-tokens rule's 429.
fn answered_before_refusal(client: &str, lines: &[Value]) -> usize {
    let (refusal, answered) = lines
        .split_last()
        .unwrap_or_else(|| panic!("{client}: no output"));
    assert_eq!(
        refusal["outcome"], "refused",
        "{client}: never refused: {lines:?}"
    );
    assert_eq!(refusal["status"], 429, "{client}: {refusal}");
    assert_eq!(
        refusal["body"]["violated-policies"],
        json!(["llm-tokens"]),
        "{client}: {refusal}"
    );
    assert!(refusal["retry_after"].as_str().is_some(), "{client}: {refusal}");
    for line in answered {
        assert_eq!(line["outcome"], "answered", "{client}: {line}");
        // The SDK read the usage out of its API's own response format.
        assert_eq!(line["tokens"], TOKENS, "{client}: {line}");
    }
    answered.len()
}

#[test]
fn the_official_sdks_are_limited_by_the_demos_llm_rule() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let (_llm, llm_port) = start_llm_upstream();
    let envoy = Envoy::start_bootstrap(&shipped_envoy_config("envoy.yaml", shim.port, llm_port.port));
    let run = std::process::id();

    for client in ["openai", "anthropic", "anthropic-bearer"] {
        let key = format!("sk-{client}-{run}");
        let lines = drive(&envoy, client, &key, 8);
        let answered = answered_before_refusal(client, &lines);
        // 1,000 tokens, 400 charged per answer: two or three answers fit (the third is
        // admitted on the estimate of 100 if the second's charge has not landed), then
        // the key is refused; a settlement still in flight may let one more through.
        assert!(
            (2..=4).contains(&answered),
            "{client}: {answered} answered before the refusal: {lines:?}"
        );
        // Another key of the same SDK is another client, still answered.
        let other = drive(&envoy, client, &format!("{key}-other"), 1);
        assert_eq!(other[0]["outcome"], "answered", "{client}: {other:?}");
    }

    // One key is one client whichever header carries it: the key the bearer-token client
    // spent is refused at once when sent as x-api-key, to either API.
    let spent = format!("sk-anthropic-bearer-{run}");
    for client in ["anthropic", "openai"] {
        let lines = drive(&envoy, client, &spent, 1);
        assert_eq!(lines[0]["outcome"], "refused", "{client}: {lines:?}");
        assert_eq!(lines[0]["body"]["violated-policies"], json!(["llm-tokens"]));
    }

    // The demo's own path (scripts/demo.sh posts to /v1/chat with x-api-key) is still
    // the rule's, answered in OpenAI's format with the usage header the rule charges.
    let demo_key = format!("demo-{run}");
    let reply = post(
        &envoy.url("/v1/chat"),
        &[("x-api-key", &demo_key), ("x-demo-tokens", "700")],
        "hello",
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-usage-tokens"), Some("700"));
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["usage"]["total_tokens"], 700, "{body}");
    assert_eq!(body["object"], "chat.completion", "{body}");
}
