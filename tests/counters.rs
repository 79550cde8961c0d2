//! `redis-shim counters` end to end, with the built binary: real Envoy refuses a client,
//! `show` reports it (nothing left, the retry-after Envoy sent) without charging, and
//! after `reset` the client is admitted again (within the deny cache's second) while
//! another client stays refused.
//! The admin endpoints refuse every caller without their token, and a shim with no token
//! at all refuses them outright.

mod support;

use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::*;

/// What Envoy sends the shim.
const ENVOY_TOKEN: &str = "envoy-token-for-checks";
/// What the admin endpoints require, when the shim has one.
const ADMIN_TOKEN: &str = "admin-token-for-operators";

fn plugin_config() -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "shim_token": ENVOY_TOKEN,
        "timeout": "5s",
        "rules": [
            { "name": "per-api-key", "key": [{ "header": "x-api-key" }], "limit": 3, "period": "1m" },
            { "name": "per-envoy", "scope": "local", "key": ["client_ip"], "limit": 1000, "period": "1s" },
            { "name": "search", "match": { "path_prefix": "/search" }, "key": ["client_ip"],
              "limit": 10, "period": "1m" }
        ]
    })
}

/// Runs `redis-shim counters ARGS` (the built binary), without the environment's token.
fn counters(args: &[&str]) -> Output {
    Command::new(shim_path())
        .arg("counters")
        .args(args)
        .env_remove("RLSHIM_ADMIN_TOKEN")
        .output()
        .unwrap()
}

/// `counters ACTION --json` for the client `api_key`, which must succeed; its JSON.
fn counters_json(action: &str, config: &Path, shim: &Shim, api_key: &str, extra: &[&str]) -> Value {
    let header = format!("x-api-key={api_key}");
    let url = shim.url("");
    let config = config.to_str().unwrap();
    let mut args = vec![action, "--config", config, "--shim", &url, "--token", ADMIN_TOKEN];
    args.extend(["--header", &header, "--json"]);
    args.extend(extra);
    let output = counters(&args);
    assert!(output.status.success(), "counters {args:?}: {output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The report of one rule in a `counters --json` answer.
fn rule<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["rule"] == name)
        .unwrap_or_else(|| panic!("no rule {name} in {report}"))
}

#[test]
fn show_reports_a_refused_client_without_charging_and_reset_lets_it_through() {
    let redis = Redis::start();
    let shim = Shim::start(
        &redis.url(),
        &["--token", ENVOY_TOKEN, "--admin-token", ADMIN_TOKEN],
    );
    let envoy = Envoy::start(shim.port, &plugin_config());
    let config = scratch("counters").join("plugin.json");
    fs::write(&config, plugin_config().to_string()).unwrap();
    let request = |key: &str| get(&envoy.url("/"), &[("x-api-key", key)]);

    assert_eq!(request("abc").status, 200);
    // Showing reads the counter the filter charged (a key computed otherwise would be a
    // full one) and charges nothing, however often it is asked.
    for _ in 0..3 {
        let shown = counters_json("show", &config, &shim, "abc", &["--rule", "per-api-key"]);
        let per_key = rule(&shown, "per-api-key");
        assert_eq!(per_key["status"], "counted", "{shown}");
        assert_eq!(per_key["remaining"], 2, "{shown}");
        assert_eq!(
            shown["rules"].as_array().unwrap().len(),
            1,
            "only the rule asked for"
        );
    }
    assert_eq!(request("abc").status, 200);
    assert_eq!(request("abc").status, 200);
    let refused = request("abc");
    assert_eq!(refused.status, 429, "{refused:?}");
    for _ in 0..4 {
        request("other");
    }
    assert_eq!(request("other").status, 429);

    let shown = counters_json("show", &config, &shim, "abc", &["--client-ip", "127.0.0.1"]);
    let per_key = rule(&shown, "per-api-key");
    assert_eq!(per_key["allowed"], false, "{shown}");
    assert_eq!(per_key["remaining"], 0, "{shown}");
    let retry_after_ms = per_key["retry_after_ms"].as_u64().unwrap();
    // One token per 20 s; the 429 said the same, in whole seconds, a moment earlier.
    assert!((1..=20_000).contains(&retry_after_ms), "{shown}");
    let told = refused.number("retry-after");
    assert!(
        told.abs_diff(retry_after_ms.div_ceil(1000)) <= 1,
        "Envoy said {told} s, show {retry_after_ms} ms"
    );
    assert_eq!(rule(&shown, "per-envoy")["status"], "local", "{shown}");
    assert_eq!(rule(&shown, "search")["status"], "not_applicable", "{shown}");

    // The table an operator reads says the same.
    let url = shim.url("");
    let table = counters(&[
        "show",
        "--config",
        config.to_str().unwrap(),
        "--shim",
        &url,
        "--token",
        ADMIN_TOKEN,
        "--header",
        "x-api-key=abc",
        "--client-ip",
        "127.0.0.1",
    ]);
    let table = String::from_utf8(table.stdout).unwrap();
    for expected in [
        "RETRY-AFTER",
        "per-api-key",
        "3/1m",
        "refused",
        "no Redis counter",
        "does not apply",
    ] {
        assert!(table.contains(expected), "{expected:?} not in\n{table}");
    }

    let reset = counters_json("reset", &config, &shim, "abc", &["--rule", "per-api-key"]);
    assert_eq!(rule(&reset, "per-api-key")["deleted"], true, "{reset}");
    assert_eq!(
        rule(&reset, "per-api-key")["remaining"],
        0,
        "the state before: {reset}"
    );
    // The Envoy's deny cache still holds the refusal, for at most a second: then one
    // request asks the shim, which admits it. Refused requests meanwhile charge nothing.
    let reset_at = Instant::now();
    wait_until("the reset client admitted", Duration::from_secs(10), || {
        request("abc").status == 200
    });
    assert!(
        reset_at.elapsed() < Duration::from_secs(3),
        "the deny cache held a reset client for {:?}",
        reset_at.elapsed()
    );
    assert_eq!(
        request("other").status,
        429,
        "another client's counter is untouched"
    );
    let shown = counters_json("show", &config, &shim, "abc", &["--rule", "per-api-key"]);
    assert_eq!(rule(&shown, "per-api-key")["remaining"], 2, "{shown}");
}

#[test]
fn the_admin_endpoints_always_require_their_token() {
    let redis = Redis::start();
    let body = checks_body(&[check_of("per-api-key/tb60000:{0}", "token_bucket", 3, 60_000)]);
    let show = |shim: &Shim, token: Option<&str>| {
        let headers: Vec<(&str, &str)> = token.map(|t| ("x-ratelimit-token", t)).into_iter().collect();
        post(&shim.url("/v1/admin/counters/show"), &headers, &body)
    };
    let reset_status = |shim: &Shim, token: &str| {
        post(
            &shim.url("/v1/admin/counters/reset"),
            &[("x-ratelimit-token", token)],
            &body,
        )
        .status
    };

    let separate = Shim::start(
        &redis.url(),
        &["--token", ENVOY_TOKEN, "--admin-token", ADMIN_TOKEN],
    );
    assert_eq!(show(&separate, None).status, 401);
    assert_eq!(show(&separate, Some("wrong")).status, 401);
    assert_eq!(
        show(&separate, Some(ENVOY_TOKEN)).status,
        401,
        "Envoy's token is not the admin's"
    );
    assert_eq!(reset_status(&separate, ENVOY_TOKEN), 401);
    let allowed = show(&separate, Some(ADMIN_TOKEN));
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(reset_status(&separate, ADMIN_TOKEN), 200);

    // With only --token, that token opens them.
    let shared = Shim::start(&redis.url(), &["--token", ENVOY_TOKEN]);
    assert_eq!(show(&shared, None).status, 401);
    assert_eq!(show(&shared, Some(ENVOY_TOKEN)).status, 200);

    // With no token at all, never open.
    let open = Shim::start(&redis.url(), &[]);
    for token in [None, Some(""), Some(ENVOY_TOKEN)] {
        let refused = show(&open, token);
        assert_eq!(refused.status, 403, "{refused:?}");
        assert!(refused.body.contains("--admin-token"), "{}", refused.body);
    }
    assert_eq!(reset_status(&open, ADMIN_TOKEN), 403);
    // The check path of a shim without a token stays as open as it was.
    assert_eq!(post(&open.url("/v1/check"), &[], &body).status, 200);

    // The command names what is missing, and what the shim answered.
    let config = scratch("counters").join("plugin.json");
    fs::write(&config, plugin_config().to_string()).unwrap();
    let config = config.to_str().unwrap();
    let url = separate.url("");
    let base = [
        "show",
        "--config",
        config,
        "--shim",
        &url,
        "--header",
        "x-api-key=k",
    ];
    let without = counters(&base);
    assert!(!without.status.success());
    assert!(
        String::from_utf8_lossy(&without.stderr).contains("--token"),
        "{without:?}"
    );
    let wrong = counters(&[&base[..], &["--token", ENVOY_TOKEN]].concat());
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("401"),
        "{wrong:?}"
    );
}

#[test]
fn a_reset_that_misses_a_client_counted_under_another_variant_of_the_rule_says_so() {
    let redis = Redis::start();
    let shim = Shim::start(
        &redis.url(),
        &["--token", ENVOY_TOKEN, "--admin-token", ADMIN_TOKEN],
    );
    let config = scratch("counters").join("plugin.json");
    fs::write(&config, plugin_config().to_string()).unwrap();
    // The key this configuration counts the client in (a token bucket of a minute)...
    let shown = counters_json("show", &config, &shim, "alice", &[]);
    let key = rule(&shown, "per-api-key")["key"].as_str().unwrap().to_string();
    assert!(key.contains("/tb60000:"), "{key}");
    // ...and the one an older configuration (a fixed window of 30 s) exhausted.
    let old_key = key.replace("/tb60000:", "/fw30000:");
    let spent = post(
        &shim.url("/v1/check"),
        &[("x-ratelimit-token", ENVOY_TOKEN)],
        &checks_body(&[with(
            check_of(&old_key, "fixed_window", 3, 30_000),
            "cost",
            json!(3),
        )]),
    );
    assert_eq!(spent.status, 200, "{spent:?}");

    let url = shim.url("");
    let config = config.to_str().unwrap();
    let args = [
        "--config",
        config,
        "--shim",
        &url,
        "--token",
        ADMIN_TOKEN,
        "--header",
        "x-api-key=alice",
    ];
    let show = counters(&[&["show"][..], &args].concat());
    assert!(show.status.success(), "{show:?}");
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&old_key),
        "{show:?}"
    );
    let reset = counters(&[&["reset"][..], &args].concat());
    assert_eq!(reset.status.code(), Some(3), "not a success: {reset:?}");
    assert!(
        String::from_utf8_lossy(&reset.stdout).contains(&old_key),
        "{reset:?}"
    );
    assert!(
        String::from_utf8_lossy(&reset.stderr).contains("another variant"),
        "{reset:?}"
    );
    // Untouched: the operator decides.
    let kept = redis.cli(&["KEYS", "*fw30000*"]);
    assert!(kept.contains(&old_key), "{kept}");
}
