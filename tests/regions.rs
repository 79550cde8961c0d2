//! Regions end to end (docs/REGIONS.md, docs/CONFIG.md "Regions"): three regions, each
//! its own Redis, shim (the binary) and real Envoy loading the built `.wasm`, whose
//! filter calls its own region's shim; each shim reads the other regions' Redis through
//! `bench/delay_proxy.rs` at 20 ms one way. A client spreads 3 x 30 requests of one user
//! over the three Envoys at once, against a fixed window of 30 an hour per rule:
//! `independent` admits the limit in each region (90), `home` exactly the limit (30),
//! `replicated` at most the limit, and once every region has applied every region's
//! spending, each Envoy refuses.
//!
//! The filter's local layers are off (no local bucket, no lease, no deny cache), so what
//! is counted is what the shims decided, and `failure_mode: "closed"` with a generous
//! `timeout` keeps a slow answer from passing as an admission.

mod support;

/// The shim's region harness, `redis-shim/tests/support/regions.rs`, included as it is
/// over this package's support (same `Process`, `Redis`, `ShimProcess`, ports and
/// scratch directories, which its `use super::*` finds here), so that one file holds the
/// regions' wiring.
#[allow(dead_code)]
#[path = "../redis-shim/tests/support/regions.rs"]
mod regions;

/// What the region harness asks of its link processes. The shim's test `Process` keeps
/// a watchdog for servers a static holds past every test; this package's `Process` is
/// killed when dropped, and every link here is owned by the test's [`Regions`], so
/// dropping them (a panic unwinds too) is enough.
trait TieToTestProcess {
    fn tie_to_test_process(&mut self);
}

impl TieToTestProcess for Process {
    fn tie_to_test_process(&mut self) {}
}

use regions::Regions;
use serde_json::{json, Value};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};
use support::*;

/// One way between regions: 20 ms, a WAN's order.
const DELAY_US: u64 = 20_000;
const LIMIT: u64 = 30;
const ENVOYS: usize = 3;
/// Threads per Envoy, each sending `LIMIT / THREADS` requests one after the other.
const THREADS: usize = 10;
const RUNGS: [&str; 3] = ["independent", "home", "replicated"];

/// One fixed-window rule per rung, named after it, on the path `/<rung>`, keyed on
/// `x-user`; no local bucket, no lease, no deny cache.
fn plugin_config() -> Value {
    let rules: Vec<Value> = RUNGS
        .iter()
        .map(|rung| {
            json!({ "name": rung, "match": { "path_prefix": format!("/{rung}") },
                    "key": [{ "header": "x-user" }], "algorithm": "fixed_window",
                    "limit": LIMIT, "period": "1h", "regions": rung })
        })
        .collect();
    json!({
        "shim_cluster": "ratelimit_shim",
        // Generous: a home check pays a cross-region round trip, and on a loaded
        // two-core machine a slow answer must fail closed (a 503, failing the test),
        // never open into an admission that blurs the counts.
        "timeout": "5s",
        "failure_mode": "closed",
        // Every request asks its shim: a refusal cached in Envoy is not the shims' count.
        "deny_cache": false,
        "rules": rules
    })
}

/// The three regions and an Envoy in each, calling that region's shim.
struct World {
    regions: Regions,
    envoys: Vec<Envoy>,
}

impl World {
    fn start() -> World {
        let regions = Regions::start(ENVOYS, DELAY_US, &[]);
        let config = plugin_config();
        let shim_ports: Vec<u16> = regions
            .regions
            .iter()
            .map(|region| region.shim.as_ref().expect("the region's shim runs").port)
            .collect();
        // One after the other, from this thread: Envoy asks for SIGTERM when its parent
        // dies (PR_SET_PDEATHSIG), and Linux sends it when the spawning thread ends, so
        // an Envoy started from a thread of its own would stop as that thread returns.
        let envoys = shim_ports
            .iter()
            .map(|&port| Envoy::start(port, &config))
            .collect();
        World { regions, envoys }
    }

    /// `LIMIT` requests of `user` to `/<rung>` at each Envoy, `THREADS` threads each, all
    /// released together; every reply with the index of the Envoy that sent it.
    fn burst(&self, rung: &str, user: &str) -> Vec<(usize, Reply)> {
        let barrier = Barrier::new(ENVOYS * THREADS);
        let replies = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for (index, envoy) in self.envoys.iter().enumerate() {
                for _ in 0..THREADS {
                    let (url, barrier, replies) = (envoy.url(&format!("/{rung}")), &barrier, &replies);
                    scope.spawn(move || {
                        let agent = agent();
                        barrier.wait();
                        for _ in 0..LIMIT as usize / THREADS {
                            let reply = get_with(&agent, &url, &[("x-user", user)]);
                            replies.lock().unwrap().push((index, reply));
                        }
                    });
                }
            }
        });
        replies.into_inner().unwrap()
    }

    /// One request of `user` to `/<rung>` at Envoy `index`.
    fn one(&self, index: usize, rung: &str, user: &str) -> Reply {
        get(&self.envoys[index].url(&format!("/{rung}")), &[("x-user", user)])
    }

    /// Per region, the replicated counter of `rung`'s rule as that region's Redis holds
    /// it: the sum of every region's component (0 before any reached it).
    fn replicated_counts(&self, rung: &str) -> Vec<u64> {
        self.regions
            .regions
            .iter()
            .map(|region| {
                counters(&region.redis, rung)
                    .iter()
                    .map(|key| {
                        let fields = region.redis.cli(&["HGETALL", key]);
                        let lines: Vec<&str> = fields.lines().map(str::trim).collect();
                        lines
                            .chunks(2)
                            .filter(|pair| pair.len() == 2 && pair[0].starts_with("c:"))
                            .map(|pair| pair[1].parse::<u64>().unwrap())
                            .sum::<u64>()
                    })
                    .sum()
            })
            .collect()
    }

    /// Polls until every region's Redis holds `spent` for `rung`'s counter; how long it
    /// took.
    fn converged(&self, rung: &str, spent: u64) -> Duration {
        let started = Instant::now();
        wait_until(
            "every region holding every region's spending",
            Duration::from_secs(10),
            || self.replicated_counts(rung).iter().all(|&count| count == spent),
        );
        started.elapsed()
    }
}

/// The counters (hashes) of `rung`'s rule in a region's Redis.
fn counters(redis: &Redis, rung: &str) -> Vec<String> {
    redis
        .cli(&["--scan", "--pattern", &format!("rl:{rung}/*")])
        .lines()
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .filter(|key| redis.cli(&["TYPE", key]).trim() == "hash")
        .map(String::from)
        .collect()
}

/// The counter keys of `rung`'s rule in a region's Redis, whatever their type.
fn keys(redis: &Redis, rung: &str) -> usize {
    redis
        .cli(&["--scan", "--pattern", &format!("rl:{rung}/*")])
        .lines()
        .filter(|key| !key.trim().is_empty())
        .count()
}

/// A user no earlier run on these servers has been.
fn user(rung: &str) -> String {
    format!("{rung}-{}", std::process::id())
}

/// What a burst got: admissions per Envoy, and each refusal's `X-RateLimit-Remaining`
/// and `Retry-After`.
struct Tally {
    admitted: [u64; ENVOYS],
    refusals: Vec<(u64, u64)>,
}

impl Tally {
    fn total(&self) -> u64 {
        self.admitted.iter().sum()
    }

    /// The distinct (remaining, retry-after) pairs of the refusals, with their numbers.
    fn refusals_seen(&self) -> Vec<((u64, u64), usize)> {
        let mut seen: Vec<((u64, u64), usize)> = Vec::new();
        for refusal in &self.refusals {
            match seen.iter_mut().find(|(pair, _)| pair == refusal) {
                Some((_, count)) => *count += 1,
                None => seen.push((*refusal, 1)),
            }
        }
        seen
    }
}

/// Fails the test on anything but a 200 or the filter's 429 for `rung`'s rule with its
/// rate-limit headers.
fn tally(rung: &str, replies: &[(usize, Reply)]) -> Tally {
    let mut tally = Tally {
        admitted: [0; ENVOYS],
        refusals: Vec::new(),
    };
    for (index, reply) in replies {
        match reply.status {
            200 => {
                assert_eq!(reply.number("x-ratelimit-limit"), LIMIT, "{reply:?}");
                tally.admitted[*index] += 1;
            }
            429 => tally.refusals.push(refused(rung, reply)),
            _ => panic!("{rung}: neither an admission nor a refusal: {reply:?}"),
        }
    }
    tally
}

/// The filter's refusal by `rung`'s rule, with its rate-limit headers: its remaining and
/// its retry-after.
fn refused(rung: &str, reply: &Reply) -> (u64, u64) {
    assert_eq!(reply.status, 429, "{rung}: {reply:?}");
    assert_eq!(reply.number("x-ratelimit-limit"), LIMIT, "{reply:?}");
    let remaining = reply.number("x-ratelimit-remaining");
    assert!(remaining < LIMIT, "{reply:?}");
    assert!(reply.number("x-ratelimit-reset") > 0, "{reply:?}");
    let retry_after = reply.number("retry-after");
    assert!(retry_after >= 1, "{reply:?}");
    let body: Value = serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {reply:?}"));
    assert_eq!(body["rule"], rung, "{reply:?}");
    (remaining, retry_after)
}

#[test]
fn three_regions_through_envoy_admit_per_region_exactly_or_within_the_limit_by_rung() {
    let started = Instant::now();
    let world = World::start();
    eprintln!(
        "three regions, each Redis, shim and Envoy, up in {:?}",
        started.elapsed()
    );

    // independent: each region counts alone, so each admits its 30.
    let independent = tally("independent", &world.burst("independent", &user("independent")));
    eprintln!(
        "independent, 30 at each of 3 Envoys at once: {:?} admitted",
        independent.admitted
    );
    assert_eq!(
        independent.admitted, [LIMIT; ENVOYS],
        "each region counts on its own"
    );

    // home: one region counts every region's requests, exactly.
    let home = tally("home", &world.burst("home", &user("home")));
    eprintln!(
        "home, 30 at each of 3 Envoys at once: {:?} admitted, {} in all; refusals (remaining, retry-after): {:?}",
        home.admitted,
        home.total(),
        home.refusals_seen()
    );
    assert_eq!(
        home.total(),
        LIMIT,
        "the home region counts every region's requests"
    );
    assert_eq!(home.refusals.len() as u64, 2 * LIMIT, "the rest refused");
    assert!(
        home.refusals.iter().all(|&(remaining, _)| remaining == 0),
        "a home refusal is the count at its limit: {:?}",
        home.refusals_seen()
    );
    let holding: Vec<usize> = world
        .regions
        .regions
        .iter()
        .map(|r| keys(&r.redis, "home"))
        .collect();
    assert_eq!(
        holding.iter().filter(|&&held| held > 0).count(),
        1,
        "one region's Redis holds the home counter: {holding:?}"
    );

    // replicated: a burst everywhere from the same knowledge admits at most the limit
    // (the regions' shares of it add up to it), and at least one region's share.
    let user = user("replicated");
    let replicated = tally("replicated", &world.burst("replicated", &user));
    let mut total = replicated.total();
    eprintln!(
        "replicated, 30 at each of 3 Envoys at once: {:?} admitted, {total} in all; refusals (remaining, retry-after): {:?}",
        replicated.admitted,
        replicated.refusals_seen()
    );
    assert!(total <= LIMIT, "{total} admitted in a burst everywhere");
    assert!(
        total >= LIMIT / ENVOYS as u64,
        "{total}: every region spends at least its share"
    );
    let took = world.converged("replicated", total);
    eprintln!("replicated: every region's Redis held all {total} after {took:?}");

    // What the burst left (the shares of the remainder renew as peers confirm) is there
    // to spend, at most: a round of one request at each Envoy until it is spent.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rounds = 0;
    while total < LIMIT {
        assert!(
            Instant::now() < deadline,
            "{total} of {LIMIT} spent after {rounds} rounds"
        );
        rounds += 1;
        for index in 0..ENVOYS {
            let reply = world.one(index, "replicated", &user);
            total += tally("replicated", &[(index, reply)]).total();
            assert!(total <= LIMIT, "{total} admitted");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if rounds > 0 {
        eprintln!("replicated: the remainder spent in {rounds} rounds of one request per Envoy");
        let took = world.converged("replicated", LIMIT);
        eprintln!("replicated: every region's Redis held all {LIMIT} after {took:?}");
    }
    for index in 0..ENVOYS {
        let (remaining, _) = refused("replicated", &world.one(index, "replicated", &user));
        assert_eq!(remaining, 0, "region {index} knows every region's spending");
    }
    assert_eq!(
        world.replicated_counts("replicated"),
        [LIMIT; ENVOYS],
        "refusals charge nothing"
    );
    eprintln!("three regions through Envoy: {:?} in all", started.elapsed());
}
