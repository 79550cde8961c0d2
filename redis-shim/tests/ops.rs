//! The shim in operation: health and readiness, failing fast with Redis down or
//! blackholed (stopped with SIGSTOP: connections open, nothing answers) while memory
//! stays flat, the in-flight bound (admin calls included), graceful shutdown on SIGTERM, `/metrics` as
//! Prometheus text, JSON logs and `--help`.

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::*;

fn check_body(key: &str) -> String {
    checks_body(&[check_of(key, "token_bucket", 100, 60_000)])
}

/// The value of an unlabelled sample, or of one with exactly these labels.
fn sample(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name_and_labels} in\n{metrics}"))
        .parse()
        .unwrap()
}

fn metrics(shim: &impl ShimEndpoint) -> String {
    let reply = get(&shim.url("/metrics"), &[]);
    assert_eq!(reply.status, 200);
    reply.body
}

fn wait_for_in_flight(shim: &impl ShimEndpoint, count: u64) {
    wait_until("checks in flight", Duration::from_secs(10), || {
        sample(&metrics(shim), "rlshim_in_flight") as u64 == count
    });
}

/// Posts one check per thread, each on its own connection, and returns the threads.
fn post_in_background(shim: &impl ShimEndpoint, count: usize) -> Vec<std::thread::JoinHandle<Reply>> {
    (0..count)
        .map(|i| {
            let url = shim.url("/v1/check");
            std::thread::spawn(move || post(&url, &[], &check_body(&format!("k{i}"))))
        })
        .collect()
}

#[test]
fn readiness_follows_redis_and_checks_fail_fast_without_it() {
    let mut redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--redis-timeout-ms", "10000"]);
    assert_eq!(get(&shim.url("/readyz"), &[]).status, 200);
    assert_eq!(get(&shim.url("/healthz"), &[]).status, 200);
    redis.stop();
    assert_eq!(get(&shim.url("/readyz"), &[]).status, 503);
    // Liveness does not follow Redis: restarting the shim would not bring Redis back.
    assert_eq!(get(&shim.url("/healthz"), &[]).status, 200);
    let started = Instant::now();
    let reply = post(&shim.url("/v1/check"), &[], &check_body("k"));
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(reply.body.contains("redis"), "{}", reply.body);
    // "Fast" means the refused connection answers, not the 10 s Redis timeout: the
    // bound is half of that timeout, whatever the machine's speed.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn blackholed_redis_fails_checks_fast_with_flat_memory_then_recovers() {
    let redis = Redis::start();
    let shim = ShimProcess::start(&redis.url(), &["--redis-timeout-ms", "20"]);
    let url = shim.url("/v1/check");
    assert_eq!(post(&url, &[], &check_body("k")).status, 200);
    redis.process().signal("STOP");
    let blackholed = |label: &str, per_connection: usize| {
        let started = Instant::now();
        let url = url.clone();
        let replies = load(&url, 100, per_connection, |t, i| check_body(&format!("k{t}-{i}")));
        assert_eq!(count_status(&replies, 503), replies.len(), "{label}");
        assert!(replies.iter().all(|r| r.body.contains("redis")), "{label}");
        started.elapsed()
    };
    // Regression: a multiplexed connection kept every unanswered command queued, about
    // 260 bytes per check, until the connection was replaced after a timeout. The
    // warm-up is as large as half the measured round, so that allocator arenas and
    // connection buffers have reached their steady size before RSS is read.
    const PER_CONNECTION: usize = 200;
    blackholed("warm-up", PER_CONNECTION / 2);
    let rss_before = shim.process.rss_kib();
    let elapsed = blackholed("measured", PER_CONNECTION);
    let rss_after = shim.process.rss_kib();
    let checks = 100 * PER_CONNECTION as u64;
    eprintln!(
        "{checks} checks against a blackholed Redis in {elapsed:?}; shim RSS {rss_before} KiB -> {rss_after} KiB"
    );
    // Checks on one connection go one after another, each bounded by the 20 ms timeout:
    // 4 s if every check waits its whole timeout. A check that hangs waits for the
    // client's 30 s, so a bound of 30 s tells the two apart on a loaded machine.
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    // The leak would hold 260 bytes x 20,000 checks, about 5 MiB: the bound is half of
    // that, twice the most allocator noise seen under load (2 MiB with 10,000 checks).
    let leak_kib = checks * 260 / 1024;
    assert!(
        rss_after < rss_before + leak_kib / 2,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    assert!(
        sample(&metrics(&shim), "rlshim_redis_errors_total{kind=\"timeout\"}") >= (checks * 3 / 2) as f64
    );
    redis.process().signal("CONT");
    wait_until("recovery after the blackhole", Duration::from_secs(10), || {
        post(&url, &[], &check_body("after")).status == 200
    });
    assert_eq!(get(&shim.url("/readyz"), &[]).status, 200);
}

/// Fills the in-flight bound (`bound`) with checks held by a stopped Redis, then checks
/// that `one_more` is refused 503 overloaded at once; then lets Redis answer the checks.
fn assert_refused_past_the_bound(
    redis: &Redis,
    shim: &impl ShimEndpoint,
    bound: usize,
    one_more: impl FnOnce() -> Reply,
) {
    redis.process().signal("STOP");
    let waiting = post_in_background(shim, bound);
    wait_for_in_flight(shim, bound as u64);
    let refused = one_more();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("overloaded"), "{}", refused.body);
    redis.process().signal("CONT");
    for handle in waiting {
        let reply = handle.join().unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
    }
}

#[test]
fn checks_past_the_in_flight_bound_get_503_at_once() {
    let redis = Redis::start();
    let shim = Shim::start(
        &redis.url(),
        &["--max-in-flight", "4", "--redis-timeout-ms", "10000"],
    );
    assert_refused_past_the_bound(&redis, &shim, 4, || {
        post(&shim.url("/v1/check"), &[], &check_body("one-too-many"))
    });
    assert_eq!(
        sample(
            &metrics(&shim),
            "rlshim_requests_total{endpoint=\"check\",outcome=\"overloaded\"}"
        ),
        1.0
    );
}

// The admin endpoints go through the same template as the checks.
#[test]
fn admin_calls_past_the_in_flight_bound_get_503_at_once_like_checks() {
    const ADMIN_TOKEN: &str = "adm1n";
    let redis = Redis::start();
    let shim = Shim::start(
        &redis.url(),
        &[
            "--admin-token",
            ADMIN_TOKEN,
            "--max-in-flight",
            "2",
            "--redis-timeout-ms",
            "10000",
        ],
    );
    let show = || {
        post(
            &shim.url("/v1/admin/counters/show"),
            &[("x-ratelimit-token", ADMIN_TOKEN)],
            &check_body("k0"),
        )
    };
    assert_refused_past_the_bound(&redis, &shim, 2, show);
    assert_eq!(show().status, 200, "the checks' permits are given back");
    let text = metrics(&shim);
    assert_eq!(
        sample(
            &text,
            "rlshim_requests_total{endpoint=\"check\",outcome=\"overloaded\"}"
        ),
        0.0,
        "an admin call is not a check request"
    );
    assert_eq!(
        sample(
            &text,
            "rlshim_requests_total{endpoint=\"counters_show\",outcome=\"overloaded\"}"
        ),
        1.0,
        "the admin call refused at the bound counts under its endpoint"
    );
}

// An admin call shows in rlshim_requests_total under its endpoint whether it was answered
// or refused, and not in the check traffic the alerts' ratios are about.
#[test]
fn admin_calls_count_by_endpoint_answered_or_refused() {
    const ADMIN_TOKEN: &str = "adm1n";
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--admin-token", ADMIN_TOKEN]);
    let reset = |token: &str| {
        post(
            &shim.url("/v1/admin/counters/reset"),
            &[("x-ratelimit-token", token)],
            &check_body("k0"),
        )
    };
    assert_eq!(reset(ADMIN_TOKEN).status, 200);
    assert_eq!(reset("not-the-admin-token").status, 401);
    let text = metrics(&shim);
    let value = |labels: &str| sample(&text, &format!("rlshim_requests_total{{{labels}}}"));
    assert_eq!(value("endpoint=\"counters_reset\",outcome=\"ok\""), 1.0, "{text}");
    assert_eq!(
        value("endpoint=\"counters_reset\",outcome=\"unauthorized\""),
        1.0,
        "{text}"
    );
    assert_eq!(
        value("endpoint=\"check\",outcome=\"unauthorized\""),
        0.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "rlshim_check_duration_seconds_count"),
        0.0,
        "{text}"
    );
}

#[test]
fn sigterm_answers_every_check_in_flight_then_exits() {
    let redis = Redis::start();
    let mut shim = ShimProcess::start(&redis.url(), &["--redis-timeout-ms", "10000"]);
    // Stopping Redis holds the checks in flight, so SIGTERM surely arrives during them.
    redis.process().signal("STOP");
    let in_flight = post_in_background(&shim, 20);
    wait_for_in_flight(&shim, 20);
    shim.process.signal("TERM");
    wait_until("the listener to close", Duration::from_secs(5), || {
        TcpStream::connect(("127.0.0.1", shim.port)).is_err()
    });
    redis.process().signal("CONT");
    for handle in in_flight {
        let reply = handle.join().unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
        let answer: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(answer["allowed"], true);
    }
    let status = shim.process.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(shim.process.log_text().contains("redis-shim stopped"));
}

#[test]
fn sigterm_gives_up_on_checks_after_the_shutdown_timeout() {
    let redis = Redis::start();
    let mut shim = ShimProcess::start(
        &redis.url(),
        &["--redis-timeout-ms", "30000", "--shutdown-timeout-ms", "300"],
    );
    redis.process().signal("STOP");
    let stuck = post_in_background(&shim, 1);
    wait_for_in_flight(&shim, 1);
    shim.process.signal("TERM");
    let status = shim.process.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert_eq!(stuck.into_iter().next().unwrap().join().unwrap().status, 0);
    redis.process().signal("CONT");
}

/// Checks the Prometheus text exposition format (version 0.0.4) line by line and
/// returns every sample, keyed by `name{labels}` as written.
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    let is_name = |name: &str| {
        !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    assert!(text.ends_with('\n'), "the exposition ends with a line feed");
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (keyword, name, rest) = (parts.next().unwrap(), parts.next().unwrap(), parts.next());
            assert!(is_name(name), "{line}");
            if keyword == "TYPE" {
                let kind = rest.unwrap();
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "{line}"
                );
                assert!(
                    types.insert(name.into(), kind.into()).is_none(),
                    "TYPE twice: {line}"
                );
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            other => other.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        let name = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
                for label in labels.split(',') {
                    let (key, quoted) = label.split_once('=').unwrap_or_else(|| panic!("{line}"));
                    assert!(is_name(key), "{line}");
                    assert!(
                        quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'),
                        "{line}"
                    );
                }
                name
            }
            None => series,
        };
        assert!(is_name(name), "{line}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = name.strip_suffix(suffix)?;
                (types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("sample before its TYPE: {line}"));
        if kind == "counter" {
            assert!(value >= 0.0, "{line}");
        }
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "sample twice: {line}"
        );
    }
    // Histograms: cumulative buckets ending in +Inf, equal to _count.
    for (family, _) in types.iter().filter(|(_, kind)| *kind == "histogram") {
        let mut buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|(series, value)| {
                let le = series.strip_prefix(&format!("{family}_bucket{{le=\""))?;
                let le = le.strip_suffix("\"}")?;
                Some((
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap()
                    },
                    *value,
                ))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{family}: {buckets:?}"
        );
        assert_eq!(buckets.last().map(|b| b.0), Some(f64::INFINITY), "{family}");
        assert_eq!(
            buckets.last().map(|b| b.1),
            samples.get(&format!("{family}_count")).copied()
        );
    }
    samples
}

#[test]
fn metrics_parse_as_prometheus_text_and_count_what_happened() {
    let redis = Redis::start();
    let shim = ShimProcess::start(&redis.url(), &[]);
    let url = shim.url("/v1/check");
    let window = check_of("m", "fixed_window", 2, 60_000);
    let shadow = with(
        check_of("s", "sliding_window_log", 1, 60_000),
        "shadow",
        serde_json::json!(true),
    );
    for _ in 0..3 {
        post(&url, &[], &checks_body(&[window.clone(), shadow.clone()]));
    }
    assert_eq!(post(&url, &[], "not json").status, 400);
    let reply = get(&shim.url("/metrics"), &[]);
    assert!(
        reply
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{reply:?}"
    );
    let samples = parse_prometheus(&reply.body);
    let value = |series: &str| *samples.get(series).unwrap_or_else(|| panic!("no {series}"));
    assert_eq!(
        value("rlshim_requests_total{endpoint=\"check\",outcome=\"allowed\"}"),
        2.0
    );
    assert_eq!(
        value("rlshim_requests_total{endpoint=\"check\",outcome=\"denied\"}"),
        1.0
    );
    assert_eq!(
        value("rlshim_requests_total{endpoint=\"check\",outcome=\"invalid\"}"),
        1.0
    );
    assert_eq!(
        value("rlshim_checks_total{algorithm=\"fixed_window\",outcome=\"allowed\"}"),
        2.0
    );
    assert_eq!(
        value("rlshim_checks_total{algorithm=\"fixed_window\",outcome=\"denied\"}"),
        1.0
    );
    assert_eq!(
        value("rlshim_checks_total{algorithm=\"sliding_window_log\",outcome=\"allowed\"}"),
        1.0
    );
    assert_eq!(
        value("rlshim_checks_total{algorithm=\"sliding_window_log\",outcome=\"shadow_denied\"}"),
        2.0
    );
    assert_eq!(value("rlshim_check_duration_seconds_count"), 4.0);
    assert_eq!(value("rlshim_in_flight"), 0.0);
    assert_eq!(value("rlshim_redis_errors_total{kind=\"timeout\"}"), 0.0);
    assert!(shim.process.log_text().contains("shadow check would deny"));
}

#[test]
fn json_logs_are_one_object_per_line() {
    let redis = Redis::start();
    let shim = ShimProcess::start(&redis.url(), &["--log-format", "json"]);
    let shadow = with(
        check_of("s", "fixed_window", 1, 60_000),
        "shadow",
        serde_json::json!(true),
    );
    for _ in 0..2 {
        decide_at(&shim.url("/v1/check"), std::slice::from_ref(&shadow));
    }
    let log = shim.process.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string()));
    assert!(lines.iter().any(|l| l["listen"].is_string()), "{log}");
    let denial = lines
        .iter()
        .find(|l| l["message"] == "shadow check would deny")
        .unwrap_or_else(|| panic!("{log}"));
    assert_eq!(denial["key"], "rl:s");
    assert_eq!(denial["algorithm"], "fixed_window");
}

#[test]
fn help_lists_every_flag_and_its_environment_variable() {
    let output = std::process::Command::new(shim_path())
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for (flag, env) in [
        ("--listen", "RLSHIM_LISTEN"),
        ("--redis-url", "RLSHIM_REDIS_URL"),
        ("--redis-mode", "RLSHIM_REDIS_MODE"),
        ("--redis-timeout-ms", "RLSHIM_REDIS_TIMEOUT_MS"),
        ("--key-prefix", "RLSHIM_KEY_PREFIX"),
        ("--token", "RLSHIM_TOKEN"),
        ("--admin-token", "RLSHIM_ADMIN_TOKEN"),
        ("--max-in-flight", "RLSHIM_MAX_IN_FLIGHT"),
        ("--shutdown-timeout-ms", "RLSHIM_SHUTDOWN_TIMEOUT_MS"),
        ("--log-format", "RLSHIM_LOG_FORMAT"),
    ] {
        assert!(
            help.contains(flag) && help.contains(env),
            "{flag} / {env} in\n{help}"
        );
    }
}

#[test]
fn a_bad_configuration_is_refused_at_start() {
    let output = std::process::Command::new(shim_path())
        .args(["--listen", "127.0.0.1:0", "--key-prefix", "rl{x}:"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("key prefix"), "{text}");
}

// Regression: after Redis restarted while the shim was idle, the first check met the
// connection Redis had closed and failed (the filter then applied its failure mode).
#[test]
fn the_first_check_after_an_idle_redis_restart_is_decided() {
    let mut redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let url = shim.url("/v1/check");
    assert_eq!(post(&url, &[], &check_body("before")).status, 200);
    for round in 0..3 {
        redis.restart();
        let reply = post(&url, &[], &check_body(&format!("after-{round}")));
        assert_eq!(reply.status, 200, "round {round}: {reply:?}");
    }
}

#[test]
fn operator_endpoints_are_open_unless_told_to_require_the_token() {
    let redis = Redis::start();
    let open = Shim::start(&redis.url(), &["--token", "t0ken"]);
    assert_eq!(
        get(&open.url("/metrics"), &[]).status,
        200,
        "open by default, for Prometheus"
    );
    assert_eq!(get(&open.url("/readyz"), &[]).status, 200);
    let guarded = Shim::start(&redis.url(), &["--token", "t0ken", "--token-for-operators"]);
    for path in ["/metrics", "/readyz"] {
        assert_eq!(
            get(&guarded.url(path), &[]).status,
            401,
            "{path} without the token"
        );
        assert_eq!(
            get(&guarded.url(path), &[("x-ratelimit-token", "wrong")]).status,
            401,
            "{path}"
        );
        assert_eq!(
            get(&guarded.url(path), &[("x-ratelimit-token", "t0ken")]).status,
            200,
            "{path}"
        );
    }
    assert_eq!(
        get(&guarded.url("/healthz"), &[]).status,
        200,
        "liveness stays open"
    );
}
