//! Leases against their stated bounds (docs/LOCAL.md), in both directions: three Envoys
//! of two workers each, one shim, one Redis, every 200 a real admission (the rules fail
//! closed, so a failure would show as a 503, never as a 200). Those in `on_both_hosts!`
//! run on the `.wasm` and on the dynamic module.

mod support;

use serde_json::{json, Value};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::*;

const ENVOYS: usize = 3;
const LIMIT: usize = 100;
const LEASE: usize = 10;
/// What docs/LOCAL.md promises a burst: each other Envoy holds at most one lease's
/// leftover (`size - 1` tokens) that it may not spend.
const BURST_FLOOR: usize = LIMIT - (ENVOYS - 1) * (LEASE - 1);

fn config(algorithm: &str, period: &str, ttl: &str) -> Value {
    json!({ "shim_cluster": "ratelimit_shim", "timeout": "5s", "failure_mode": "closed",
            "rules": [{ "name": "leased", "algorithm": algorithm, "key": [{ "header": "x-api-key" }],
                        "limit": LIMIT, "period": period, "lease": { "size": LEASE, "ttl": ttl } }] })
}

struct Fleet {
    _redis: Redis,
    _shim: Shim,
    envoys: Vec<Envoy>,
}

impl Fleet {
    fn start(host: FilterHost, config: &Value) -> Fleet {
        let redis = Redis::start();
        let shim = Shim::start(&redis.url(), &[]);
        let envoys = (0..ENVOYS).map(|_| host.start_envoy(shim.port, config)).collect();
        Fleet {
            _redis: redis,
            _shim: shim,
            envoys,
        }
    }

    fn stat(&self, name: &str) -> u64 {
        self.envoys.iter().map(|envoy| envoy.stat(name)).sum()
    }
}

/// `threads` connections per Envoy in `envoys`, released together, each sending
/// `per_thread` requests for `key`; returns the statuses per Envoy.
fn burst(fleet: &Fleet, envoys: &[usize], threads: usize, per_thread: usize, key: &str) -> Vec<Vec<u16>> {
    let barrier = Arc::new(Barrier::new(envoys.len() * threads));
    let handles: Vec<_> = envoys
        .iter()
        .map(|&e| {
            let url = fleet.envoys[e].url("/");
            (0..threads)
                .map(|_| {
                    let (url, key, barrier) = (url.clone(), key.to_string(), barrier.clone());
                    std::thread::spawn(move || {
                        let agent = agent();
                        barrier.wait();
                        (0..per_thread)
                            .map(|_| get_with(&agent, &url, &[("x-api-key", &key)]).status)
                            .collect::<Vec<u16>>()
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect();
    handles
        .into_iter()
        .map(|per_envoy| per_envoy.into_iter().flat_map(|h| h.join().unwrap()).collect())
        .collect()
}

fn admitted(statuses: &[u16]) -> usize {
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "only admissions and refusals: {statuses:?}"
    );
    statuses.iter().filter(|&&s| s == 200).count()
}

on_both_hosts!(
    a_burst_spread_over_envoys_admits_the_limit_within_the_stated_bound,
    a_burst_on_one_envoy_leaves_the_others_their_share,
    leases_never_carry_tokens_across_a_fixed_window,
    leases_cut_shim_calls_at_least_by_half_their_size_under_the_limit,
);

// Regression: every request of a burst asked for its own lease, ten grants drained the
// limit into whichever worker got them, and the rest of the burst was refused while
// those tokens sat unspent: 10 to 101 of 100 admitted.
fn a_burst_spread_over_envoys_admits_the_limit_within_the_stated_bound(host: FilterHost) {
    let fleet = Fleet::start(host, &config("token_bucket", "1h", "5s"));
    for round in 0..3 {
        let key = format!("burst-{round}");
        let statuses = burst(&fleet, &[0, 1, 2], 20, 10, &key);
        let admitted: usize = statuses.iter().map(|s| admitted(s)).sum();
        eprintln!("round {round}: {admitted} of 600 admitted");
        assert!(admitted <= LIMIT, "{admitted} admitted over the limit");
        assert!(
            admitted >= BURST_FLOOR,
            "{admitted} admitted, floor {BURST_FLOOR}"
        );
    }
}

// Regression: after a burst on one Envoy, it kept 51-97 leased tokens while requests to
// the other Envoys were refused.
fn a_burst_on_one_envoy_leaves_the_others_their_share(host: FilterHost) {
    let fleet = Fleet::start(host, &config("token_bucket", "1h", "5s"));
    let first = admitted(&burst(&fleet, &[0], 30, 1, "shared")[0]);
    assert_eq!(first, 30);
    let others: usize = burst(&fleet, &[1, 2], 20, 1, "shared")
        .iter()
        .map(|s| admitted(s))
        .sum();
    // 70 tokens were left: the first Envoy holds at most one lease's leftover of them.
    assert_eq!(others, 40, "requests to the other Envoys were refused");
    let url = fleet.envoys[0].url("/");
    let agent = agent();
    let mut more = 0;
    for _ in 0..LIMIT {
        more += usize::from(get_with(&agent, &url, &[("x-api-key", "shared")]).status == 200);
    }
    // What the other Envoys leased and never spent is the only shortfall.
    let total = first + others + more;
    assert!((BURST_FLOOR..=LIMIT).contains(&total), "{total} admitted in all");
}

/// Milliseconds since the Unix epoch: Redis on this machine keeps the same clock.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn sleep_until(ms: u64) {
    let now = now_ms();
    if ms > now {
        std::thread::sleep(Duration::from_millis(ms - now));
    }
}

// Regression: tokens leased in the last moments of a fixed window were spent in the
// next one on top of its full limit: up to 184 of 100 admitted inside one window.
fn leases_never_carry_tokens_across_a_fixed_window(host: FilterHost) {
    const PERIOD_MS: u64 = 4_000;
    let fleet = Fleet::start(host, &config("fixed_window", "4s", "3s"));
    let mut rounds = 0;
    for attempt in 0..6 {
        let key = format!("window-{attempt}");
        // Late in a window, every Envoy leases; then a flood just after the boundary.
        let boundary = (now_ms() / PERIOD_MS + 1) * PERIOD_MS;
        sleep_until(boundary - 400);
        let late = burst(&fleet, &[0, 1, 2], 10, 1, &key);
        let late_done = now_ms();
        sleep_until(boundary + 20);
        let statuses = burst(&fleet, &[0, 1, 2], 20, 5, &key);
        if late_done >= boundary || now_ms() >= boundary + PERIOD_MS {
            // A machine too slow for the scenario's timing this time: the late burst
            // spilled into the next window, or the flood into a third. Try again.
            eprintln!("attempt {attempt}: timing missed, again");
            continue;
        }
        let late: usize = late.iter().map(|s| admitted(s)).sum();
        let next_window: usize = statuses.iter().map(|s| admitted(s)).sum();
        eprintln!("attempt {attempt}: {late} admitted late in a window, {next_window} of 300 in the next");
        assert_eq!(late, 30);
        assert!(
            next_window <= LIMIT,
            "{next_window} admitted in one window of {LIMIT}"
        );
        assert!(
            next_window >= BURST_FLOOR,
            "{next_window} admitted, floor {BURST_FLOOR}"
        );
        rounds += 1;
        if rounds == 2 {
            return;
        }
    }
    panic!("only {rounds} of 6 attempts met the scenario's timing");
}

fn leases_cut_shim_calls_at_least_by_half_their_size_under_the_limit(host: FilterHost) {
    let fleet = Fleet::start(host, &config("token_bucket", "1h", "1m"));
    let url = fleet.envoys[0].url("/");
    let agent = agent();
    let sent = 60;
    for _ in 0..sent {
        assert_eq!(get_with(&agent, &url, &[("x-api-key", "calm")]).status, 200);
    }
    let calls = fleet.stat(&host.stat("leased.shim_checks")) as usize;
    assert!(
        calls * LEASE / 2 <= sent,
        "{calls} shim calls for {sent} requests"
    );
}

/// The Wasm filter's alone: the dynamic module has no tick yet to give a lease back
/// early (docs/NATIVE.md, "Not yet"); its leftover comes back as its counter refills.
#[test]
fn a_quiet_envoy_gives_its_unspent_lease_back() {
    let host = FilterHost::Wasm;
    // Ten an hour: nothing refills during the test. A 1 s timeout ticks every 500 ms.
    let config = json!({ "shim_cluster": "ratelimit_shim", "timeout": "1s", "failure_mode": "closed",
                         "deny_cache": false,
                         "rules": [{ "name": "leased", "key": [{ "header": "x-api-key" }], "limit": 10,
                                     "period": "1h", "lease": { "size": 10, "ttl": "1s" } }] });
    let fleet = Fleet::start(host, &config);
    let (quiet, busy) = (fleet.envoys[0].url("/"), fleet.envoys[1].url("/"));
    let agent = agent();
    let ask = |url: &str| get_with(&agent, url, &[("x-api-key", "quiet")]).status == 200;
    // The quiet Envoy leases half of the ten and spends one; the busy one gets the rest.
    assert!(ask(&quiet));
    let busy_first: usize = (0..6).map(|_| usize::from(ask(&busy))).sum();
    assert_eq!(busy_first, 5);
    // Once the quiet Envoy's lease expires, its four unspent tokens go back to the shim.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut busy_later = 0;
    while busy_later < 4 && Instant::now() < deadline {
        if ask(&busy) {
            busy_later += 1;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert_eq!(busy_later, 4, "the quiet Envoy's leftover came back");
    assert!(!ask(&busy) && !ask(&quiet), "and not a token more than the limit");
}
