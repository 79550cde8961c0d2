//! Layered rules in real Envoy: matching, key sources, tiers, weighted costs, shadow rules,
//! header styles and the algorithms at a window boundary; those in `on_both_hosts!` on
//! the `.wasm` and on the dynamic module.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

fn config(rules: Value) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        // A shim error must show as a refusal, never pass as an admission.
        "failure_mode": "closed",
        "xff_num_trusted_hops": 1,
        "response": { "headers": "both" },
        "rules": rules
    })
}

/// The `r` of one policy in a draft `RateLimit` header.
fn draft_remaining(reply: &Reply, rule: &str) -> u64 {
    let header = reply
        .header("ratelimit")
        .unwrap_or_else(|| panic!("no RateLimit header: {reply:?}"));
    let item = header
        .split(", ")
        .find(|item| item.starts_with(&format!("\"{rule}\";")))
        .unwrap_or_else(|| panic!("no {rule} in {header}"));
    let r = item.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
    r.parse().unwrap()
}

on_both_hosts!(
    a_client_over_its_ip_cap_is_refused_by_the_ip_rule_and_its_user_budget_is_not_charged,
    a_spoofed_forwarded_for_does_not_change_the_key,
    a_premium_key_gets_its_tiers_limit_and_a_weighted_route_consumes_its_cost,
    a_per_endpoint_rule_applies_only_to_its_path_and_method,
    a_shadow_rule_never_refuses_but_its_counter_moves,
    a_custom_status_body_and_draft_headers_reach_the_client,
);

fn a_client_over_its_ip_cap_is_refused_by_the_ip_rule_and_its_user_budget_is_not_charged(host: FilterHost) {
    let mut config = config(json!([
        { "name": "per-user", "key": [{ "header": "x-user-id" }], "limit": 10, "period": "1m" },
        { "name": "per-ip", "key": ["client_ip"], "limit": 3, "period": "1m" }
    ]));
    // The shim's refusal is under test: with the deny cache, this Envoy would refuse the
    // 4th request alone (the 3rd took per-ip's last token) and say nothing of per-user.
    config["deny_cache"] = json!(false);
    let stack = Stack::start_on(host, &config);
    let url = stack.envoy.url("/");
    let from = |ip: &str| [("x-user-id", "alice"), ("x-forwarded-for", ip)].map(|(k, v)| (k, v.to_string()));
    let send = |ip: &str| {
        let headers = from(ip);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        get(&url, &headers)
    };
    for _ in 0..3 {
        assert_eq!(send("198.51.100.1").status, 200);
    }
    let refused = send("198.51.100.1");
    assert_eq!(refused.status, 429, "{refused:?}");
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["rule"], "per-ip");
    assert_eq!(
        draft_remaining(&refused, "per-user"),
        7,
        "the refused request charged per-user"
    );
    // From another address Alice still has 7 of her 10, minus this request.
    let elsewhere = send("198.51.100.2");
    assert_eq!(elsewhere.status, 200);
    assert_eq!(draft_remaining(&elsewhere, "per-user"), 6);
    assert_eq!(draft_remaining(&elsewhere, "per-ip"), 2);
    // X-RateLimit-* describe the most restrictive rule.
    assert_eq!(elsewhere.number("x-ratelimit-limit"), 3);
    assert!(elsewhere
        .header("ratelimit-policy")
        .unwrap()
        .contains(r#""per-user";q=10;w=60"#));
}

fn a_spoofed_forwarded_for_does_not_change_the_key(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &config(json!([
            { "name": "per-ip", "key": ["client_ip"], "limit": 2, "period": "1m" }
        ])),
    );
    let url = stack.envoy.url("/");
    let statuses: Vec<u16> = [
        "1.1.1.1, 203.0.113.7",
        "2.2.2.2, 203.0.113.7",
        "203.0.113.7",
        "9.9.9.9,203.0.113.7",
    ]
    .iter()
    .map(|xff| get(&url, &[("x-forwarded-for", xff)]).status)
    .collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(
        get(&url, &[("x-forwarded-for", "203.0.113.7, 203.0.113.8")]).status,
        200
    );
}

fn a_premium_key_gets_its_tiers_limit_and_a_weighted_route_consumes_its_cost(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &config(json!([{
            "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": 4, "period": "1m",
            "tiers": [
                { "name": "vip", "when": { "header": "x-api-key", "prefix": "vip:" }, "limit": 40 },
                { "name": "premium", "when": { "header": "x-tier", "equals": "premium" }, "limit": 20 }
            ],
            "costs": [{ "match": { "path_prefix": "/export" }, "cost": 3 }]
        }])),
    );
    let url = stack.envoy.url("/items");
    let free = get(&url, &[("x-api-key", "free-1")]);
    assert_eq!(
        (
            free.number("x-ratelimit-limit"),
            free.number("x-ratelimit-remaining")
        ),
        (4, 3)
    );
    let vip = get(&url, &[("x-api-key", "vip:1")]);
    assert_eq!(
        (
            vip.number("x-ratelimit-limit"),
            vip.number("x-ratelimit-remaining")
        ),
        (40, 39)
    );
    let premium = get(&url, &[("x-api-key", "p-1"), ("x-tier", "premium")]);
    assert_eq!(premium.number("x-ratelimit-limit"), 20);

    let export = stack.envoy.url("/export/all");
    let first = get(&export, &[("x-api-key", "exporter")]);
    assert_eq!(first.number("x-ratelimit-remaining"), 1, "an export costs 3 of 4");
    assert_eq!(get(&export, &[("x-api-key", "exporter")]).status, 429);
    assert_eq!(
        get(&url, &[("x-api-key", "exporter")]).status,
        200,
        "a plain request still fits"
    );
}

fn a_per_endpoint_rule_applies_only_to_its_path_and_method(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &config(json!([
            { "name": "search", "match": { "path_prefix": "/search", "methods": ["GET"] },
              "key": ["client_ip"], "limit": 1, "period": "1m" }
        ])),
    );
    assert_eq!(get(&stack.envoy.url("/search?q=a"), &[]).status, 200);
    assert_eq!(get(&stack.envoy.url("/search?q=b"), &[]).status, 429);
    let elsewhere = get(&stack.envoy.url("/home"), &[]);
    assert_eq!(elsewhere.status, 200);
    assert_eq!(
        elsewhere.header("x-ratelimit-limit"),
        None,
        "no rule applied to /home"
    );
    assert_eq!(
        post(&stack.envoy.url("/search"), &[], "{}").status,
        200,
        "POST is not limited"
    );
}

fn a_shadow_rule_never_refuses_but_its_counter_moves(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &config(json!([
            { "name": "live", "key": [{ "header": "x-api-key" }], "limit": 100, "period": "1m" },
            { "name": "trial", "key": [{ "constant": "everyone" }], "limit": 2, "period": "1m", "shadow": true }
        ])),
    );
    let url = stack.envoy.url("/");
    for i in 0..5 {
        let reply = get(&url, &[("x-api-key", "k")]);
        assert_eq!(reply.status, 200, "request {i}: {reply:?}");
        assert_eq!(
            reply.number("x-ratelimit-limit"),
            100,
            "shadow rules stay out of the headers"
        );
        assert!(!reply.header("ratelimit-policy").unwrap().contains("trial"));
    }
    let keys = stack.redis.cli(&["--scan", "--pattern", "rl:trial/*"]);
    assert_eq!(keys.lines().count(), 1, "the shadow counter was never written");
    wait_until("shadow refusal logged", Duration::from_secs(5), || {
        stack
            .envoy
            .process
            .log_text()
            .contains("shadow rule trial would refuse")
    });
}

fn a_custom_status_body_and_draft_headers_reach_the_client(host: FilterHost) {
    let stack = Stack::start_on(
        host,
        &json!({
            "shim_cluster": "ratelimit_shim",
            "timeout": "5s",
            "response": { "status": 503, "headers": "ietf-draft", "body": "slow down, {rule}: retry in {retry_after}s",
                          "content_type": "text/plain" },
            "rules": [{ "name": "per-key", "key": [{ "header": "x-api-key" }], "limit": 1, "period": "30s" }]
        }),
    );
    let url = stack.envoy.url("/");
    let allowed = get(&url, &[("x-api-key", "k")]);
    assert_eq!(allowed.header("ratelimit-policy"), Some(r#""per-key";q=1;w=30"#));
    assert_eq!(allowed.header("x-ratelimit-limit"), None);
    let refused = get(&url, &[("x-api-key", "k")]);
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("content-type"), Some("text/plain"));
    let retry_after = refused.number("retry-after");
    assert_eq!(
        refused.body,
        format!("slow down, per-key: retry in {retry_after}s")
    );
    let t: u64 = refused
        .header("ratelimit")
        .unwrap()
        .rsplit("t=")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= t, "Retry-After {retry_after} earlier than t={t}");
}

/// Sends `limit` requests late in one window and `limit` early in the next, returning
/// how many of each burst were admitted. A burst that a slow machine stretched across a
/// window boundary proves nothing: the attempt is repeated on a fresh key.
fn boundary_burst(algorithm: &str, limit: u64) -> (usize, usize) {
    const PERIOD_MS: u64 = 2_000;
    let stack = Stack::start(&config(json!([
        { "name": "burst", "key": [{ "header": "x-api-key" }], "algorithm": algorithm, "limit": limit, "period": "2s" }
    ])));
    let url = stack.envoy.url("/");
    let window = || stack.redis.time_ms() / PERIOD_MS;
    for attempt in 0..3 {
        let key = format!("k{attempt}");
        // Admitted count, and whether the burst stayed inside one window.
        let burst = || {
            let start = window();
            let admitted = (0..limit)
                .filter(|_| get(&url, &[("x-api-key", key.as_str())]).status == 200)
                .count();
            (admitted, window() == start)
        };
        wait_until("late in a window", Duration::from_secs(5), || {
            (1_300..1_500).contains(&(stack.redis.time_ms() % PERIOD_MS))
        });
        let late_window = window();
        let (late, late_in_one_window) = burst();
        wait_until("early in the next window", Duration::from_secs(5), || {
            stack.redis.time_ms() % PERIOD_MS < 400
        });
        let next_is_adjacent = window() == late_window + 1;
        let (early, early_in_one_window) = burst();
        if late_in_one_window && early_in_one_window && next_is_adjacent {
            return (late, early);
        }
    }
    panic!("three attempts at a boundary burst all crossed a window boundary");
}

#[test]
fn fixed_window_lets_a_boundary_burst_of_twice_the_limit_through() {
    assert_eq!(boundary_burst("fixed_window", 5), (5, 5));
}

#[test]
fn sliding_window_log_never_exceeds_the_limit_in_any_window() {
    assert_eq!(boundary_burst("sliding_window_log", 5), (5, 0));
}

#[test]
fn sliding_window_counter_stays_close_to_the_limit_at_a_boundary() {
    let (late, early) = boundary_burst("sliding_window_counter", 10);
    assert_eq!(late, 10);
    // At most ~20% into the new window, ~80% of the previous 10 still count.
    assert!(early <= 3, "{early} admitted right after the boundary");
}

#[test]
fn token_bucket_admits_capacity_plus_refill_at_a_boundary() {
    let (late, early) = boundary_burst("token_bucket", 5);
    assert_eq!(late, 5);
    // Between the bursts (0.5 to 1.1 s) the bucket refills at 2.5 tokens per second.
    assert!((1..=3).contains(&early), "{early}");
}

mod jwt {
    //! HS256 tokens signed here and verified by Envoy's `jwt_authn` filter.
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use hmac::{Hmac, Mac};
    use serde_json::{json, Value};

    pub const SECRET: &[u8] = b"test-only-secret-of-thirty-two-bytes";

    pub fn token(claims: &Value, secret: &[u8]) -> String {
        let header = URL_SAFE_NO_PAD.encode(json!({ "alg": "HS256", "typ": "JWT" }).to_string());
        let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signing_input = format!("{header}.{payload}");
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
        mac.update(signing_input.as_bytes());
        format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    /// `jwt_authn` with one provider; requests without a token pass unverified.
    pub fn filter() -> Value {
        let jwks = json!({ "keys": [{ "kty": "oct", "alg": "HS256", "k": URL_SAFE_NO_PAD.encode(SECRET) }] });
        json!({
            "name": "envoy.filters.http.jwt_authn",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
                "providers": { "test": {
                    "issuer": "test-issuer",
                    "local_jwks": { "inline_string": jwks.to_string() },
                    "payload_in_metadata": "jwt_payload"
                }},
                "rules": [{ "match": { "prefix": "/" }, "requires": { "requires_any": { "requirements": [
                    { "provider_name": "test" }, { "allow_missing": {} }
                ]}}}]
            }
        })
    }
}

#[test]
fn a_verified_jwt_claim_keys_the_counter_and_selects_the_tier() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let envoy = Envoy::start_with_filters(
        shim.port,
        &config(json!([{
            "name": "per-subject", "key": [{ "jwt_claim": "sub" }], "limit": 2, "period": "1m",
            "tiers": [{ "name": "premium", "when": { "jwt_claim": "tier", "equals": "premium" }, "limit": 5 }]
        }])),
        &[jwt::filter()],
    );
    let url = envoy.url("/");
    let bearer = |claims: Value| format!("Bearer {}", jwt::token(&claims, jwt::SECRET));
    let alice = bearer(json!({ "iss": "test-issuer", "sub": "alice" }));
    let statuses: Vec<u16> = (0..3)
        .map(|_| get(&url, &[("authorization", alice.as_str())]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    // Another subject has its own counter; a premium subject gets its tier's limit.
    let bob = bearer(json!({ "iss": "test-issuer", "sub": "bob", "tier": "premium" }));
    let reply = get(&url, &[("authorization", bob.as_str())]);
    assert_eq!((reply.status, reply.number("x-ratelimit-limit")), (200, 5));
    // A token that fails verification never reaches the limiter's keys.
    let forged = format!(
        "Bearer {}",
        jwt::token(
            &json!({ "iss": "test-issuer", "sub": "alice" }),
            b"wrong-secret-wrong-secret-wrong!!"
        )
    );
    assert_eq!(get(&url, &[("authorization", forged.as_str())]).status, 401);
    // Without a token the rule has no key and does not apply.
    let anonymous = get(&url, &[]);
    assert_eq!(
        (anonymous.status, anonymous.header("x-ratelimit-limit")),
        (200, None)
    );
}

// Regression: Envoy hands a number claim to the filter as the 8 bytes of a double; when
// those were not UTF-8 (most integers) the rule did not apply: 6 of 6 admitted, limit 5.
#[test]
fn a_claim_keys_its_rule_whatever_its_json_type() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let envoy = Envoy::start_with_filters(
        shim.port,
        &config(json!([{ "name": "per-uid", "key": [{ "jwt_claim": "uid" }], "limit": 2, "period": "1m" }])),
        &[jwt::filter()],
    );
    let url = envoy.url("/");
    let values = [
        json!(1),
        json!(1000),
        json!(12345),
        json!(99999),
        json!(2147483648u64),
        json!(7),
        json!(-3),
        json!(1.5),
        json!(true),
        json!("alice"),
        json!({ "a": 1 }),
        json!([1, 2]),
    ];
    for uid in values {
        let token = format!(
            "Bearer {}",
            jwt::token(&json!({ "iss": "test-issuer", "uid": uid }), jwt::SECRET)
        );
        let statuses: Vec<u16> = (0..3)
            .map(|_| get(&url, &[("authorization", token.as_str())]).status)
            .collect();
        assert_eq!(statuses, [200, 200, 429], "uid {uid}");
    }
}

// Regression: a rule whose algorithm changed kept its counter keys; the new script found
// a key of the old type (WRONGTYPE) and every request failed, open or closed, until the
// old keys expired.
#[test]
fn changing_a_rules_algorithm_or_period_decides_correctly_from_the_first_request() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let rule = |algorithm: &str, period: &str| {
        config(
            json!([{ "name": "per-key", "algorithm": algorithm, "key": [{ "header": "x-api-key" }],
                        "limit": 3, "period": period }]),
        )
    };
    let statuses = |envoy: &Envoy| -> Vec<u16> {
        (0..4)
            .map(|_| get(&envoy.url("/"), &[("x-api-key", "k")]).status)
            .collect()
    };
    // The same rule, reconfigured in turn, against the same Redis.
    for (algorithm, period) in [
        ("token_bucket", "1h"),
        ("fixed_window", "1h"),
        ("sliding_window_log", "1h"),
        ("sliding_window_counter", "1h"),
        ("sliding_window_counter", "2h"),
    ] {
        let envoy = Envoy::start(shim.port, &rule(algorithm, period));
        assert_eq!(statuses(&envoy), [200, 200, 200, 429], "{algorithm} per {period}");
    }
}
