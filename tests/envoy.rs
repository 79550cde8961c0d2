//! End to end: real Envoy loading the built filter, the real shim, real Redis. The
//! tests named in `on_both_hosts!` run on both hosts: the `.wasm` and the dynamic module.

mod support;

use serde_json::{json, Value};
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::*;

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

on_both_hosts!(
    limit_of_five_admits_five_then_answers_429_with_headers,
    twenty_concurrent_requests_on_one_key_admit_exactly_five,
    two_envoys_sharing_one_shim_admit_exactly_the_limit,
    counter_key_in_redis_has_a_ttl_and_no_raw_api_key,
    unreachable_shim_applies_the_failure_mode_without_hanging,
    hostile_headers_never_crash_the_filter,
);

fn limit_of_five_admits_five_then_answers_429_with_headers(host: FilterHost) {
    let stack = Stack::start_on(host, &api_key_rule(5, "60s"));
    let url = stack.envoy.url("/");
    let key = [("x-api-key", "client-a")];

    for expected_remaining in (0..5).rev() {
        let before = unix_now();
        let reply = get(&url, &key);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.number("x-ratelimit-limit"), 5);
        assert_eq!(reply.number("x-ratelimit-remaining"), expected_remaining);
        // Full again after (5 - remaining) tokens at 12 s each, as a Unix time.
        let reset = reply.number("x-ratelimit-reset");
        let refill = (5 - expected_remaining) * 12;
        assert!(
            reset >= before + refill && reset <= unix_now() + refill + 1,
            "reset {reset}"
        );
        assert_eq!(reply.header("retry-after"), None);
    }

    let refused = get(&url, &key);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.number("x-ratelimit-limit"), 5);
    assert_eq!(refused.number("x-ratelimit-remaining"), 0);
    let retry_after = refused.number("retry-after");
    assert!(
        (1..=12).contains(&retry_after),
        "one token refills in 12 s, got {retry_after}"
    );
    // A refusal's reset is the instant Retry-After names, not the bucket's full time.
    let reset = refused.number("x-ratelimit-reset");
    assert!(
        reset >= unix_now() + retry_after - 1 && reset <= unix_now() + retry_after + 1,
        "reset {reset}, Retry-After {retry_after}"
    );
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["rule"], "per-api-key");
    assert_eq!(body["status"], 429);
    assert_eq!(body["retry_after"], retry_after);

    // Another key has its own budget; a request without the key is not limited.
    assert_eq!(get(&url, &[("x-api-key", "client-b")]).status, 200);
    let unkeyed = get(&url, &[]);
    assert_eq!(unkeyed.status, 200);
    assert_eq!(unkeyed.header("x-ratelimit-limit"), None);
}

fn twenty_concurrent_requests_on_one_key_admit_exactly_five(host: FilterHost) {
    let stack = Stack::start_on(host, &api_key_rule(5, "60s"));
    let url = stack.envoy.url("/");
    let replies = concurrently(20, move |_| get(&url, &[("x-api-key", "hot-key")]));
    assert_eq!(count_status(&replies, 200), 5, "{replies:?}");
    assert_eq!(count_status(&replies, 429), 15, "{replies:?}");
}

/// The second Envoy runs the other host: a fleet mixing them gives a client one limit.
fn two_envoys_sharing_one_shim_admit_exactly_the_limit(host: FilterHost) {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let config = api_key_rule(7, "60s");
    let other = match host {
        FilterHost::Wasm => FilterHost::Native,
        FilterHost::Native => FilterHost::Wasm,
    };
    for (round, hosts) in [("same", [host, host]), ("mixed", [host, other])] {
        let first = hosts[0].start_envoy(shim.port, &config);
        let second = hosts[1].start_envoy(shim.port, &config);
        let urls = [first.url("/"), second.url("/")];
        let key = format!("shared-{round}");
        let replies = concurrently(24, move |i| get(&urls[i % 2], &[("x-api-key", &key)]));
        assert_eq!(count_status(&replies, 200), 7, "{round}: {replies:?}");
        assert_eq!(count_status(&replies, 429), 17, "{round}: {replies:?}");
    }
}

fn counter_key_in_redis_has_a_ttl_and_no_raw_api_key(host: FilterHost) {
    let stack = Stack::start_on(host, &api_key_rule(5, "60s"));
    assert_eq!(
        get(&stack.envoy.url("/"), &[("x-api-key", "sk-live-secret")]).status,
        200
    );
    let keys = stack.redis.cli(&["--scan", "--pattern", "*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].starts_with("rl:per-api-key/"), "{}", keys[0]);
    assert!(
        !keys[0].contains("secret"),
        "raw API key in Redis key {}",
        keys[0]
    );
    let ttl_ms: i64 = stack.redis.cli(&["PTTL", keys[0]]).parse().unwrap();
    // One token spent of a 5-per-60 s bucket: full again in 12 s.
    assert!(ttl_ms > 0 && ttl_ms <= 12_000, "PTTL {ttl_ms}");
}

fn unreachable_shim_applies_the_failure_mode_without_hanging(host: FilterHost) {
    let dead_port = refusing_port();
    for (mode, expected) in [("open", 200), ("closed", 503)] {
        let config = json!({
            "shim_cluster": "ratelimit_shim",
            "timeout": "500ms",
            "failure_mode": mode,
            "rules": [{ "name": "r", "key": [{ "header": "x-api-key" }], "limit": 1, "period": "1m" }]
        });
        let envoy = host.start_envoy(dead_port, &config);
        for _ in 0..3 {
            let reply = get(&envoy.url("/"), &[("x-api-key", "k")]);
            assert_eq!(reply.status, expected, "mode {mode}: {reply:?}");
            if expected == 503 {
                // The draft's problem type for a limiter that cannot admit now.
                let problem: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
                assert_eq!(
                    problem["type"],
                    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
                );
                assert_eq!(problem["violated-policies"], json!(["r"]));
                assert_eq!(reply.header("content-type"), Some("application/problem+json"));
            }
        }
    }
}

#[test]
fn shipped_envoy_yaml_passes_envoy_validation() {
    wasm_path();
    let (ok, output) = envoy_validate(&repo_root().join("envoy.yaml"));
    assert!(ok, "{output}");
    assert!(output.contains("configured with 7 rule(s)"), "{output}");
    // The filter says which release it is, the version of the whole workspace.
    let version = format!("ratelimit-wasm {}:", env!("CARGO_PKG_VERSION"));
    assert!(output.contains(&version), "{output}");
}

#[test]
fn envoy_refuses_bad_plugin_configs_naming_the_field() {
    let rule = |extra: serde_json::Value| {
        let mut rule = json!({ "name": "r", "key": [{ "header": "x-api-key" }], "limit": 5, "period": "1m" });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                rule.as_object_mut().unwrap().remove(k);
            } else {
                rule[k] = v.clone();
            }
        }
        json!({ "shim_cluster": "ratelimit_shim", "rules": [rule] })
    };
    let top = |extra: serde_json::Value| {
        let mut config = json!({ "shim_cluster": "ratelimit_shim",
            "rules": [{ "name": "r", "key": ["client_ip"], "limit": 5, "period": "1m" }] });
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        config
    };
    let cases = [
        (rule(json!({ "limit": null })), "rules[0]: missing field `limit`"),
        (rule(json!({ "limit": 0 })), "rules[0].limit"),
        (rule(json!({ "limit": -5 })), "rules[0].limit"),
        (rule(json!({ "period": "0s" })), "rules[0].period"),
        (rule(json!({ "period": "-1m" })), "rules[0].period"),
        (rule(json!({ "period": "soon" })), "rules[0].period"),
        (rule(json!({ "cost": 9 })), "rules[0].cost"),
        (rule(json!({ "algorithm": "magic" })), "rules[0].algorithm"),
        (rule(json!({ "burst": 3 })), "unknown field `burst`"),
        (rule(json!({ "name": "has space" })), "rules[0].name"),
        (rule(json!({ "key": ["shoe_size"] })), "rules[0].key[0]"),
        (
            rule(json!({ "match": { "path_prefix": "no-slash" } })),
            "rules[0].match.path_prefix",
        ),
        (
            rule(json!({ "match": { "path": "/a", "path_prefix": "/b" } })),
            "rules[0].match.path",
        ),
        (
            rule(json!({ "costs": [{ "match": { "path": "/export" }, "cost": 50 }] })),
            "rules[0].costs[0].cost",
        ),
        (
            rule(json!({ "tiers": [{ "name": "vip", "when": { "header": "x-api-key" }, "limit": 10 }] })),
            "rules[0].tiers[0].when",
        ),
        (
            rule(json!({ "algorithm": "sliding_window_log", "limit": 100000 })),
            "rules[0].limit",
        ),
        (
            rule(json!({ "algorithm": "sliding_window_log", "regions": "replicated" })),
            "rules[0].regions: replicated serves a count that adds across regions",
        ),
        (json!({ "rules": [] }), "missing field `shim_cluster`"),
        (top(json!({ "timeout": "0ms" })), "timeout"),
        (top(json!({ "failure_mode": "sometimes" })), "failure_mode"),
        (top(json!({ "response": { "status": 200 } })), "response.status"),
        (
            top(json!({ "response": { "headers": "fancy" } })),
            "response.headers",
        ),
        // Each of these used to pass validation and then misbehave (#15).
        (
            json!(format!("{} trailing", top(json!({})))),
            "config: not one JSON document",
        ),
        (
            json!([
                "ratelimit_shim",
                null,
                null,
                null,
                4,
                "open",
                0,
                null,
                {},
                null,
                true,
                []
            ]),
            "config: must be a JSON object",
        ),
        (top(json!({ "shim_authority": "" })), "shim_authority"),
        (top(json!({ "shim_authority": "shim\u{0}" })), "shim_authority"),
        (
            top(
                json!({ "response": { "body": "slow down", "content_type": "text/plain\r\nx-injected: 1" } }),
            ),
            "response.content_type",
        ),
    ];
    for (config, expected) in cases {
        let (ok, output) = envoy_validate_plugin(&config);
        assert!(!ok, "{config} was accepted");
        assert!(output.contains("invalid plugin configuration"), "{output}");
        assert!(
            output.contains(expected),
            "{config}: expected {expected:?} in\n{output}"
        );
    }
}

// Regression: the SDK's get_map_value panicked on a non-UTF-8 header value, killing the
// VM (every later request on that worker answered 503).
fn hostile_headers_never_crash_the_filter(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &json!({
            "shim_cluster": "ratelimit_shim",
            "timeout": "5s",
            "xff_num_trusted_hops": 2,
            "rules": [
                { "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": 100, "period": "1m" },
                { "name": "per-ip", "key": ["client_ip"], "limit": 100, "period": "1m" }
            ]
        }),
    );
    let many_hops = (0..4000)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect::<Vec<_>>()
        .join(", ");
    let requests: Vec<Vec<u8>> = vec![
        // Not UTF-8: obs-text bytes are legal in HTTP/1.1 header values.
        b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: \xff\xfe\x80abc\r\nconnection: close\r\n\r\n".to_vec(),
        format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-api-key: {}\r\nconnection: close\r\n\r\n",
            "k".repeat(50_000)
        )
        .into_bytes(),
        format!("GET / HTTP/1.1\r\nhost: x\r\nx-forwarded-for: {many_hops}\r\nconnection: close\r\n\r\n")
            .into_bytes(),
        b"GET / HTTP/1.1\r\nhost: x\r\nx-forwarded-for: ,,,, ,\r\nx-api-key:\r\nconnection: close\r\n\r\n"
            .to_vec(),
    ];
    for request in &requests {
        let answer = raw_exchange(stack.envoy.port, request);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{}",
            &answer[..answer.len().min(200)]
        );
    }
    // The VM is alive and still limiting.
    let reply = get(&stack.envoy.url("/"), &[("x-api-key", "after")]);
    assert_eq!((reply.status, reply.number("x-ratelimit-limit")), (200, 100));
    assert!(
        !stack.envoy.process.log_text().contains("panicked"),
        "{}",
        stack.envoy.process.log_text()
    );
}

/// A TCP proxy in front of the shim that holds every connection until opened: a call
/// made while it is closed stays in flight until the test lets it through.
struct Gate {
    port: u16,
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl Gate {
    fn closed_in_front_of(target_port: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let gate = open.clone();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let gate = gate.clone();
                thread::spawn(move || {
                    let (lock, opened) = &*gate;
                    drop(opened.wait_while(lock.lock().unwrap(), |open| !*open).unwrap());
                    if let Ok(upstream) = TcpStream::connect(("127.0.0.1", target_port)) {
                        pipe(client, upstream);
                    }
                });
            }
        });
        Gate { port, open }
    }

    fn open(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

fn pipe(client: TcpStream, upstream: TcpStream) {
    let (mut from_client, mut to_upstream) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let forward = thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_upstream);
        let _ = to_upstream.shutdown(Shutdown::Write);
    });
    let (mut to_client, mut from_upstream) = (client, upstream);
    let _ = std::io::copy(&mut from_upstream, &mut to_client);
    let _ = to_client.shutdown(Shutdown::Write);
    let _ = forward.join();
}

/// One worker, at most one shim call in flight, a timeout long enough for the test. At
/// 60 s, the root's safety-net tick (half the timeout) never fires within a test, so a
/// request that fails to wake the dispatcher fails the test's waits.
fn one_call_at_a_time(limit: u64) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "60s",
        "shim_calls_in_flight": 1,
        "rules": [{ "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": limit, "period": "1m" }]
    })
}

fn paused_requests(envoy: &Envoy) -> u64 {
    envoy.stat("http.test.downstream_rq_active")
}

#[test]
fn requests_arriving_during_a_call_go_to_the_shim_together_and_keep_their_own_limits() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let gate = Gate::closed_in_front_of(shim.port);
    let envoy = Envoy::start_one_worker(gate.port, &one_call_at_a_time(4));
    let url = envoy.url("/");
    let sender = thread::spawn(move || {
        concurrently(30, move |i| {
            get(&url, &[("x-api-key", &format!("key-{}", i % 3))])
        })
    });
    wait_until("30 requests paused in the filter", Duration::from_secs(8), || {
        paused_requests(&envoy) == 30
    });
    gate.open();
    let replies = sender.join().unwrap();
    for key in 0..3 {
        let statuses: Vec<u16> = replies
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == key)
            .map(|(_, reply)| reply.status)
            .collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            4,
            "key-{key}: {statuses:?}"
        );
        assert_eq!(
            statuses.iter().filter(|s| **s == 429).count(),
            6,
            "key-{key}: {statuses:?}"
        );
    }
    // The first call, then everything that queued behind it in one batch.
    let calls = envoy.stat("cluster.ratelimit_shim.upstream_rq_total");
    assert!((1..=2).contains(&calls), "30 requests took {calls} shim calls");
}

#[test]
fn a_request_whose_client_leaves_while_it_waits_is_never_sent() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let gate = Gate::closed_in_front_of(shim.port);
    let envoy = Envoy::start_one_worker(gate.port, &one_call_at_a_time(10));
    let send = |key: &'static str| {
        let url = envoy.url("/");
        thread::spawn(move || get(&url, &[("x-api-key", key)]))
    };
    let first = send("first");
    wait_until("the first call in flight", Duration::from_secs(8), || {
        envoy.stat("cluster.ratelimit_shim.upstream_rq_total") == 1
    });
    let mut leaving = TcpStream::connect(("127.0.0.1", envoy.port)).unwrap();
    leaving
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\nx-api-key: leaving\r\n\r\n")
        .unwrap();
    wait_until("the second request queued", Duration::from_secs(8), || {
        paused_requests(&envoy) == 2
    });
    drop(leaving);
    wait_until("the second request gone", Duration::from_secs(8), || {
        paused_requests(&envoy) == 1
    });
    let third = send("third");
    wait_until("the third request queued", Duration::from_secs(8), || {
        paused_requests(&envoy) == 2
    });
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(third.join().unwrap().status, 200);
    assert_eq!(envoy.stat("cluster.ratelimit_shim.upstream_rq_total"), 2);
    assert_eq!(
        redis.cli(&["DBSIZE"]),
        "2",
        "only the first and third keys were charged"
    );
}

#[test]
fn requests_queued_behind_a_call_that_never_returns_fail_within_their_timeout() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let gate = Gate::closed_in_front_of(shim.port);
    let mut config = one_call_at_a_time(10);
    config["timeout"] = json!("1s");
    config["failure_mode"] = json!("closed");
    let envoy = Envoy::start_one_worker(gate.port, &config);
    let url = envoy.url("/");
    let first = thread::spawn({
        let url = url.clone();
        move || get(&url, &[("x-api-key", "first")])
    });
    wait_until("the first call in flight", Duration::from_secs(8), || {
        envoy.stat("cluster.ratelimit_shim.upstream_rq_total") == 1
    });
    let queued =
        thread::spawn(move || concurrently(3, move |i| get(&url, &[("x-api-key", &format!("queued-{i}"))])));
    let mut statuses = vec![first.join().unwrap().status];
    statuses.extend(queued.join().unwrap().iter().map(|reply| reply.status));
    assert_eq!(statuses, vec![503; 4], "every one failed closed");
    assert_eq!(
        envoy.stat("wasmcustom.ratelimit.per-key.shim_timeouts"),
        4,
        "{}",
        get(
            &format!("http://127.0.0.1:{}/stats?filter=ratelimit", envoy.admin_port),
            &[]
        )
        .body
    );
    assert_eq!(paused_requests(&envoy), 0);
}

// Regression: header values that are not UTF-8 were decoded lossily, so every such API
// key shared one counter: one client could exhaust another's.
#[test]
fn api_keys_that_are_not_utf8_each_have_their_own_counter() {
    let stack = Stack::start(&json!({
        "shim_cluster": "ratelimit_shim", "timeout": "5s", "failure_mode": "closed",
        "rules": [{ "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": 2, "period": "1m" }]
    }));
    let request = |key: &[u8]| {
        let mut bytes = b"GET / HTTP/1.1\r\nhost: x\r\nx-api-key: ".to_vec();
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
        let answer = raw_exchange(stack.envoy.port, &bytes);
        answer.get(9..12).unwrap_or_default().to_string()
    };
    let first: Vec<String> = (0..3).map(|_| request(b"\xff\x80abc")).collect();
    assert_eq!(first, ["200", "200", "429"]);
    assert_eq!(request(b"\xfe\x80abc"), "200", "another key, another counter");
}

// Regression: a shim_cluster Envoy does not define passed validation and then failed every
// request by its failure mode, with nothing but a warning per request to say why.
#[test]
fn an_unknown_shim_cluster_is_said_once_loudly_and_counted() {
    let envoy = Envoy::start(
        refusing_port(),
        &json!({ "shim_cluster": "no_such_cluster", "timeout": "5s", "failure_mode": "closed",
                 "rules": [{ "name": "r", "key": ["client_ip"], "limit": 5, "period": "1m" }] }),
    );
    let statuses: Vec<u16> = (0..3).map(|_| get(&envoy.url("/"), &[]).status).collect();
    assert_eq!(statuses, [503, 503, 503], "failing closed");
    assert_eq!(envoy.stat("wasmcustom.ratelimit.r.shim_errors"), 3);
    let log = envoy.process.log_text();
    let said = log
        .matches("calls to the shim fail: no cluster named \"no_such_cluster\"")
        .count();
    // Once per worker that saw a request.
    assert!((1..=2).contains(&said), "said {said} times:\n{log}");
}

// Regression: with x-api-key sent twice the filter keyed on the first value only, so a
// client could hold one value fixed where an upstream read it and rotate the other.
#[test]
fn a_repeated_key_header_keys_on_all_of_its_values() {
    let stack = Stack::start(&json!({
        "shim_cluster": "ratelimit_shim", "timeout": "5s", "failure_mode": "closed",
        "rules": [{ "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": 2, "period": "1m" }]
    }));
    let request = |keys: &[&str]| {
        let mut text = String::from("GET / HTTP/1.1\r\nhost: x\r\n");
        for key in keys {
            text.push_str(&format!("x-api-key: {key}\r\n"));
        }
        text.push_str("connection: close\r\n\r\n");
        let answer = raw_exchange(stack.envoy.port, text.as_bytes());
        answer.get(9..12).unwrap_or_default().to_string()
    };
    // A fixed first value with a rotating second one is a different key each time...
    for i in 0..3 {
        assert_eq!(request(&["fixed", &format!("rotating-{i}")]), "200");
    }
    // ...and the same pair twice is one client, limited as one.
    let same: Vec<String> = (0..3).map(|_| request(&["a", "b"])).collect();
    assert_eq!(same, ["200", "200", "429"]);
    // The first value alone is another client again: every value counts.
    assert_eq!(request(&["a"]), "200");
}
