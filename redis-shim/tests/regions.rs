//! Several regions, each its own Redis and shim (the binary), the links between them
//! through delay proxies (docs/REGIONS.md): `home` counts exactly; `replicated` keeps
//! its stated bound in a burst everywhere at once, lets one busy region reach the limit,
//! keeps its bound while a region is cut off and converges once it heals, and neither
//! loses nor doubles spending when a shim is killed with SIGKILL.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::*;

/// One way between regions: 20 ms, a WAN's order.
const DELAY_US: u64 = 20_000;
const LIMIT: u64 = 100;
const HOUR_MS: u64 = 3_600_000;

fn check(key: &str, regions: &str) -> Value {
    json!({"key": key, "algorithm": "fixed_window", "limit": LIMIT, "period_ms": HOUR_MS, "regions": regions})
}

/// A key no other test (or earlier run on the same Redis) has used.
fn fresh_key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}:{{{}-{}}}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Posts `per_region` checks to every region at once (`per_region` threads each); the
/// number admitted.
fn burst(regions: &Regions, check: &Value, per_region: usize) -> u64 {
    let body = json!({ "checks": [check] }).to_string();
    let admitted = AtomicU64::new(0);
    let urls: Vec<String> = (0..regions.len()).map(|index| regions.check_url(index)).collect();
    std::thread::scope(|scope| {
        for url in &urls {
            for _ in 0..per_region {
                let (body, admitted) = (&body, &admitted);
                scope.spawn(move || {
                    if admits(&post(url, &[], body)) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
    });
    admitted.into_inner()
}

fn admits(reply: &Reply) -> bool {
    assert_eq!(reply.status, 200, "{reply:?}");
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    answer["allowed"] == true
}

/// One check at region `index`: whether it admitted, and the `remaining` it reports.
fn one(regions: &Regions, index: usize, check: &Value) -> (bool, u64) {
    let answer = decide_at(&regions.check_url(index), std::slice::from_ref(check));
    (
        answer["allowed"] == true,
        answer["results"][0]["remaining"].as_u64().unwrap(),
    )
}

/// Waits until every region reports `remaining` within one of `LIMIT - spent`, read
/// without charging (`counters show`).
fn converged(regions: &Regions, check: &Value, spent: u64, within: Duration) -> Duration {
    let started = Instant::now();
    let expected = LIMIT.saturating_sub(spent);
    wait_until("every region seeing every region's spending", within, || {
        (0..regions.len()).all(|index| {
            let shown = regions.show(index, check)["results"][0]["remaining"].as_u64();
            shown.unwrap().abs_diff(expected) <= 1
        })
    });
    started.elapsed()
}

#[test]
fn independent_admits_the_limit_in_each_region_and_home_the_limit_once() {
    let regions = Regions::start(3, DELAY_US, &[]);
    let independent = burst(&regions, &check(&fresh_key("independent"), "independent"), 100);
    assert_eq!(independent, 3 * LIMIT, "each region counts on its own");
    let home = burst(&regions, &check(&fresh_key("home"), "home"), 100);
    eprintln!("home, 100 at once in each of 3 regions: {home} admitted");
    assert_eq!(home, LIMIT, "one home region counts every region's checks");
}

#[test]
fn replicated_keeps_its_bound_in_a_burst_everywhere_and_one_region_reaches_the_limit() {
    let regions = Regions::start(3, DELAY_US, &[]);
    let key = check(&fresh_key("burst"), "replicated");
    let admitted = burst(&regions, &key, 100);
    eprintln!("replicated, 100 at once in each of 3 regions: {admitted} admitted");
    // docs/REGIONS.md: regions spending at once from the same knowledge admit at most
    // the limit (their shares of one remainder add up to it).
    assert!(admitted <= LIMIT, "{admitted} admitted in a burst everywhere");
    assert!(
        admitted >= LIMIT / 3,
        "{admitted}: every region spends at least its share"
    );
    converged(&regions, &key, admitted, Duration::from_secs(5));

    // One region alone, 300 checks over 3 s: its share renews as the idle peers confirm.
    let lone = check(&fresh_key("lone"), "replicated");
    let url = regions.check_url(2);
    let body = json!({ "checks": [&lone] }).to_string();
    let mut admitted = 0;
    let started = Instant::now();
    for sent in 0..300u32 {
        let due = started + Duration::from_millis(10) * sent;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        admitted += u64::from(admits(&post(&url, &[], &body)));
    }
    eprintln!("replicated, 300 over 3 s at one region: {admitted} admitted");
    assert!(
        admitted >= LIMIT - 2,
        "one busy region admitted {admitted} of {LIMIT}"
    );
    assert!(admitted <= LIMIT);
}

#[test]
fn a_region_cut_off_spends_at_most_its_share_and_converges_when_healed() {
    let mut regions = Regions::start(3, DELAY_US, &[]);
    let key = check(&fresh_key("partition"), "replicated");
    // Some spending everywhere, known everywhere.
    for index in 0..3 {
        for _ in 0..5 {
            assert!(one(&regions, index, &key).0);
        }
    }
    converged(&regions, &key, 15, Duration::from_secs(5));
    regions.cut_off(2);
    // Traffic everywhere for 5 s while c is cut off.
    let total = 15 + traffic_everywhere(&regions, &key, Duration::from_secs(5));
    eprintln!("replicated, c cut off for 5 s: {total} admitted");
    // docs/REGIONS.md: the majority spends to the limit; the region cut off no more
    // than its share of what it knew remained, ceil((100 - 15) / 3) = 29.
    assert!(total <= LIMIT + 29, "{total} admitted with c cut off");
    assert!(total >= LIMIT, "{total}: the majority carries on to the limit");
    // c, its share spent, refuses while its own count has room: the wait it names is
    // until its peers can confirm (at most the cut-off), not the window's end.
    let answer = decide_at(&regions.check_url(2), std::slice::from_ref(&key));
    let result = &answer["results"][0];
    assert_eq!(answer["allowed"], false, "{answer}");
    assert!(result["remaining"].as_u64().unwrap() > 0, "{answer}");
    assert!(result["retry_after_ms"].as_u64().unwrap() <= 1_000, "{answer}");
    regions.heal(2);
    let took = converged(&regions, &key, total, Duration::from_secs(5));
    eprintln!("converged {took:?} after healing");
    assert!(took < Duration::from_secs(3), "converged {took:?} after healing");
}

/// One check every 20 ms at each region for `duration`; how many were admitted.
fn traffic_everywhere(regions: &Regions, key: &Value, duration: Duration) -> u64 {
    let admitted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for index in 0..regions.len() {
            let admitted = &admitted;
            scope.spawn(move || {
                let started = Instant::now();
                while started.elapsed() < duration {
                    if one(regions, index, key).0 {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
    });
    admitted.into_inner()
}

#[test]
fn a_link_cut_between_two_regions_holds_both_ends_to_their_shares() {
    let mut regions = Regions::start(3, DELAY_US, &[]);
    let key = check(&fresh_key("link"), "replicated");
    regions.cut_between(0, 2);
    // b reaches both a and c: neither may carry on without the other, since neither
    // would see the other's spending.
    let admitted = traffic_everywhere(&regions, &key, Duration::from_secs(4));
    eprintln!("replicated, the link a-c cut for 4 s: {admitted} admitted");
    // docs/REGIONS.md: a and c each spend at most their share beyond what b confirmed.
    assert!(admitted <= LIMIT + 2 * LIMIT.div_ceil(3), "{admitted} admitted");
    regions.heal_between(0, 2);
    converged(&regions, &key, admitted, Duration::from_secs(5));
}

#[test]
fn a_replicated_cost_over_one_regions_share_of_the_limit_is_refused() {
    let regions = Regions::start(3, 0, &[]);
    let mut heavy = check(&fresh_key("heavy"), "replicated");
    heavy["cost"] = json!(LIMIT / 3 + 1);
    let reply = post(
        &regions.check_url(0),
        &[],
        &json!({ "checks": [heavy] }).to_string(),
    );
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(reply.body.contains("checks[0].cost"), "{}", reply.body);
}

#[test]
fn a_shim_killed_mid_run_loses_and_doubles_no_spending() {
    let mut regions = Regions::start(3, DELAY_US, &[]);
    let key = check(&fresh_key("sigkill"), "replicated");
    let mut admitted = 0;
    for round in 0..6 {
        for index in 0..3 {
            admitted += u64::from(one(&regions, index, &key).0);
        }
        if round == 2 {
            // b's shim dies between its spending and its replication of a's and c's.
            regions.kill_shim(1);
            for index in [0, 2] {
                admitted += u64::from(one(&regions, index, &key).0);
            }
            regions.start_shim(1);
        }
    }
    converged(&regions, &key, admitted, Duration::from_secs(5));
    eprintln!("a shim killed and restarted: {admitted} admitted");
    // Every region's Redis holds each region's component exactly once.
    for region in &regions.regions {
        let fields = region
            .redis
            .cli(&["HGETALL", &format!("rl:{}", key["key"].as_str().unwrap())]);
        let lines: Vec<&str> = fields.lines().collect();
        let total: u64 = lines
            .chunks(2)
            .filter(|pair| pair[0].starts_with("c:"))
            .map(|pair| pair[1].parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, admitted, "{}: {fields}", region.name);
    }
    // What `redis-shim counters show` reads: each region's component, as each region holds
    // them, the same everywhere.
    let mut shown = Vec::new();
    for index in 0..regions.len() {
        let answer = regions.show(index, &key);
        let parts = answer["components"][0].as_array().unwrap().clone();
        let sum: u64 = parts.iter().map(|part| part[1].as_u64().unwrap()).sum();
        assert_eq!(sum, admitted, "{answer}");
        assert_eq!(answer["results"][0]["remaining"], LIMIT - admitted, "{answer}");
        shown.push(parts);
    }
    assert!(shown.windows(2).all(|pair| pair[0] == pair[1]), "{shown:?}");
}

#[test]
fn a_replicated_sliding_counter_keeps_the_burst_bound_and_converges() {
    let regions = Regions::start(3, DELAY_US, &[]);
    let mut key = check(&fresh_key("sliding"), "replicated");
    key["algorithm"] = json!("sliding_window_counter");
    let admitted = burst(&regions, &key, 60);
    eprintln!("replicated sliding counter, 60 at once in each of 3 regions: {admitted} admitted");
    assert!((LIMIT / 3..=LIMIT).contains(&admitted), "{admitted}");
    converged(&regions, &key, admitted, Duration::from_secs(5));
}

#[test]
fn a_home_out_of_reach_is_a_503_within_the_peer_timeout() {
    let mut regions = Regions::start(3, DELAY_US, &["--peer-timeout-ms", "300"]);
    regions.cut_off(2);
    let url = regions.check_url(0);
    let (mut answered, mut failed) = (0, 0);
    for i in 0..30 {
        let key = check(&fresh_key(&format!("home{i}")), "home");
        let started = Instant::now();
        let reply = post(&url, &[], &json!({ "checks": [key] }).to_string());
        match reply.status {
            200 => answered += 1,
            503 => {
                failed += 1;
                // The peer timeout, and once more on a connection found dropped.
                assert!(
                    started.elapsed() < Duration::from_millis(2 * 300 + 500),
                    "{reply:?}"
                );
            }
            _ => panic!("{reply:?}"),
        }
    }
    eprintln!("home with c cut off, 30 keys at a: {answered} answered, {failed} 503");
    // About a third of the keys live in c: the filter's failure mode decides them.
    assert!(failed > 0 && answered > 0, "{answered} answered, {failed} failed");
}

#[test]
fn a_peer_out_of_reach_at_start_is_a_partition_that_heals() {
    let mut regions = Regions::start(3, DELAY_US, &[]);
    regions.kill_shim(0);
    regions.cut_off(0);
    regions.start_shim(0);
    let metrics_url = regions.check_url(0).replace("/v1/check", "/metrics");
    let reachable = |peer: &str| {
        let text = get(&metrics_url, &[]).body;
        let line = format!("rlshim_region_peer_reachable{{peer=\"{peer}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(line.as_str()).map(|v| v == "1"))
            .unwrap_or_else(|| panic!("no {line} in {text}"))
    };
    assert!(!reachable("b") && !reachable("c"), "a started cut off");
    let key = check(&fresh_key("late"), "replicated");
    for index in 0..3 {
        assert!(one(&regions, index, &key).0);
    }
    regions.heal(0);
    wait_until("a's peers in reach", Duration::from_secs(10), || {
        reachable("b") && reachable("c")
    });
    converged(&regions, &key, 3, Duration::from_secs(5));
}

#[test]
fn without_peers_a_replicated_check_counts_in_its_region_alone() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--region", "a"]);
    let key = check(&fresh_key("alone"), "replicated");
    for expected in (LIMIT - 3..LIMIT).rev() {
        let answer = decide_at(&shim.url("/v1/check"), std::slice::from_ref(&key));
        assert_eq!(answer["results"][0]["remaining"], expected, "{answer}");
    }
}

#[test]
fn a_replicated_sliding_log_is_refused_naming_the_field() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &["--region", "a"]);
    let mut log = check("k", "replicated");
    log["algorithm"] = json!("sliding_window_log");
    let reply = post(
        &shim.url("/v1/check"),
        &[],
        &json!({ "checks": [log] }).to_string(),
    );
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(reply.body.contains("checks[0].regions"), "{}", reply.body);
}

#[test]
fn bad_peer_regions_are_refused_at_start_naming_the_flag() {
    for (flags, named) in [
        (vec!["--region", "a", "--peer-region", "b"], "NAME=REDIS_URL"),
        (
            vec!["--region", "a", "--peer-region", "a=redis://127.0.0.1:1"],
            "named like this region",
        ),
    ] {
        let refusal = Shim::refusal(&[&["--redis-url", "redis://127.0.0.1:1"][..], &flags].concat());
        assert!(
            refusal.contains("--peer-region") && refusal.contains(named),
            "{refusal}"
        );
    }
}
