//! Concurrency limits end to end: real Envoys loading the built filter, the real shim,
//! real Redis, and a real upstream that holds responses open (`support/upstream.rs`).
//! A slot is taken when a request is admitted and given back when its stream ends,
//! however it ends; the Redis sorted set of slots in flight is the ground truth. Those in
//! `on_both_hosts!` run on the `.wasm` and on the dynamic module.

mod support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::*;

const RULE: &str = "in-flight";

fn concurrency_config(limit: u64, max_duration: &str) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        // Generous: a slow answer on a loaded machine must not turn into a fail-open
        // admission, which takes no slot and would blur the counts asserted here.
        "timeout": "5s",
        "response": { "headers": "both" },
        "rules": [{ "name": RULE, "algorithm": "concurrency", "key": [{ "header": "x-api-key" }],
                    "limit": limit, "max_duration": max_duration }]
    })
}

fn start_envoy(host: FilterHost, shim: &Shim, config: &Value, upstream: &Upstream) -> Envoy {
    Envoy::start_bootstrap(&host.envoy_config_to_upstream(shim.port, config, upstream.port))
}

/// Slots taken in Redis right now, over every concurrency key (expired ones included
/// until they are trimmed or their key expires).
fn slots_in_redis(redis: &Redis) -> u64 {
    redis
        .cli(&["--scan", "--pattern", "*/cc*"])
        .lines()
        .filter(|key| !key.trim().is_empty())
        .map(|key| redis.cli(&["ZCARD", key.trim()]).parse::<u64>().unwrap_or(0))
        .sum()
}

/// A request the upstream holds until `release(name)`; the reply arrives when it ends.
fn hold(envoy: &Envoy, api_key: &str, name: &str) -> JoinHandle<Reply> {
    let (url, api_key, name) = (envoy.url("/work"), api_key.to_string(), name.to_string());
    std::thread::spawn(move || {
        get(
            &url,
            &[("x-api-key", &api_key), ("x-upstream", "hold"), ("x-hold", &name)],
        )
    })
}

fn refused_now(envoy: &Envoy, api_key: &str) -> Reply {
    get(&envoy.url("/work"), &[("x-api-key", api_key)])
}

on_both_hosts!(
    the_limit_is_exact_across_two_envoys_and_a_release_lets_the_next_in,
    the_slots_of_a_killed_envoy_come_back_after_max_duration,
    a_local_concurrency_limit_holds_in_one_envoy_and_leaks_no_slot,
    after_redis_loses_its_data_a_limit_admits_up_to_twice_until_the_forgotten_requests_end,
);

fn the_limit_is_exact_across_two_envoys_and_a_release_lets_the_next_in(host: FilterHost) {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = Upstream::start();
    let config = concurrency_config(3, "60s");
    let envoys = [
        start_envoy(host, &shim, &config, &upstream),
        start_envoy(host, &shim, &config, &upstream),
    ];
    let held: Vec<JoinHandle<Reply>> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| hold(&envoys[i % 2], "team-1", name))
        .collect();
    wait_until("three requests held upstream", Duration::from_secs(20), || {
        upstream.in_flight() == 3
    });
    assert_eq!(slots_in_redis(&redis), 3);

    for envoy in &envoys {
        let refused = refused_now(envoy, "team-1");
        assert_eq!(refused.status, 429, "{refused:?}");
        assert_eq!(refused.header("retry-after"), Some("1"));
        assert_eq!(
            refused.header("ratelimit-policy"),
            Some(r#""in-flight";q=3;qu="concurrent-requests""#)
        );
        assert_eq!(refused.header("ratelimit"), Some(r#""in-flight";r=0;t=1"#));
        assert_eq!(refused.number("x-ratelimit-limit"), 3);
        assert_eq!(refused.number("x-ratelimit-remaining"), 0);
        let body: Value = serde_json::from_str(&refused.body).unwrap();
        assert_eq!(body["quota_unit"], "concurrent-requests");
    }
    // Another key has its own slots.
    let other = hold(&envoys[1], "team-2", "other");
    wait_until("team-2 held", Duration::from_secs(20), || {
        upstream.received("other")
    });
    upstream.release("other");
    let other = other.join().unwrap();
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(
        other.header("ratelimit"),
        Some(r#""in-flight";r=2"#),
        "its one request in flight left two slots, and no reset time is promised"
    );

    // One ends: its slot comes back, and the next request (on the other Envoy) gets in.
    upstream.release("a");
    let first = held.into_iter().next().unwrap().join().unwrap();
    assert_eq!(first.status, 200, "{first:?}");
    let state = first.header("ratelimit").unwrap();
    assert!(
        state.starts_with(r#""in-flight";r="#) && !state.contains("t="),
        "{state}"
    );
    wait_until("the released slot back in Redis", Duration::from_secs(10), || {
        slots_in_redis(&redis) == 2
    });
    let next = hold(&envoys[1], "team-1", "d");
    wait_until("the next request held", Duration::from_secs(20), || {
        upstream.received("d")
    });
    assert_eq!(
        refused_now(&envoys[0], "team-1").status,
        429,
        "three in flight again"
    );
    for name in ["b", "c", "d"] {
        upstream.release(name);
    }
    assert_eq!(next.join().unwrap().status, 200);
    wait_until("every slot released", Duration::from_secs(10), || {
        slots_in_redis(&redis) == 0
    });
}

/// How one request of the leak test ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Complete,
    Delayed,
    /// The upstream closes the connection mid-response (after its headers).
    UpstreamReset,
    /// The upstream closes the connection before it answers anything.
    UpstreamResetEarly,
    RouteTimeout,
    LaterFilterRefuses,
    /// The client goes away while the upstream holds the request.
    ClientAbortHeld,
    /// The client goes away right after sending: while the request waits for the shim,
    /// or later.
    ClientAbortAtOnce,
}

fn ending(n: usize) -> Ending {
    match n % 10 {
        0..=2 => Ending::Complete,
        3 => Ending::Delayed,
        4 if n % 20 < 10 => Ending::UpstreamReset,
        4 => Ending::UpstreamResetEarly,
        5 => Ending::LaterFilterRefuses,
        6 => Ending::ClientAbortHeld,
        7 => Ending::ClientAbortAtOnce,
        // Each takes the route timeout: a few of them.
        8 if n % 40 < 10 => Ending::RouteTimeout,
        _ => Ending::Complete,
    }
}

/// Sends one request ending as `ending`; returns its status (0: the client left).
fn send(
    agent: &ureq::Agent,
    envoy: &Envoy,
    upstream: &Upstream,
    api_key: &str,
    name: &str,
    ending: Ending,
) -> u16 {
    let url = envoy.url("/work");
    let with = |extra: &[(&str, &str)]| {
        let mut headers = vec![("x-api-key", api_key)];
        headers.extend_from_slice(extra);
        get_with(agent, &url, &headers).status
    };
    match ending {
        Ending::Complete => with(&[]),
        Ending::Delayed => with(&[("x-upstream", "delay-3")]),
        Ending::UpstreamResetEarly => with(&[("x-upstream", "reset-early")]),
        Ending::RouteTimeout => with(&[("x-upstream", "never")]),
        Ending::LaterFilterRefuses => with(&[("x-envoy-fault-abort-request", "503")]),
        Ending::UpstreamReset => {
            // The response's head arrives, its body never does: its status is all there
            // is to read (the client would otherwise wait for Envoy's delayed close).
            let mut stream = TcpStream::connect(("127.0.0.1", envoy.port)).unwrap();
            let request = format!(
                "GET /work HTTP/1.1\r\nhost: test\r\nx-api-key: {api_key}\r\nx-upstream: reset\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut head = [0u8; 12];
            match stream.read_exact(&mut head) {
                Ok(()) => String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0),
                Err(_) => 0,
            }
        }
        Ending::ClientAbortHeld | Ending::ClientAbortAtOnce => {
            let mut stream = TcpStream::connect(("127.0.0.1", envoy.port)).unwrap();
            let request = format!(
                "GET /work HTTP/1.1\r\nhost: test\r\nx-api-key: {api_key}\r\nx-upstream: hold\r\nx-hold: {name}\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).unwrap();
            if let Ending::ClientAbortHeld = ending {
                // Until the upstream has it, or Envoy answered (refused).
                stream.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut byte = [0u8; 1];
                while !upstream.received(name) && Instant::now() < deadline {
                    if let Ok(1) = stream.read(&mut byte) {
                        break;
                    }
                }
            }
            0
        }
    }
}

/// The Wasm filter's alone: on the dynamic module a call rides a paused stream, and a
/// client that hangs up takes it along with the releases it carried, which then wait
/// for `max_duration` (docs/NATIVE.md, "Not yet").
#[test]
fn no_slot_leaks_after_thousands_of_requests_ending_every_way() {
    let host = FilterHost::Wasm;
    const THREADS: usize = 8;
    const PER_THREAD: usize = 400;
    const LIMIT: u64 = 4;
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = std::sync::Arc::new(Upstream::start());
    let config = concurrency_config(LIMIT, "60s");
    let envoy = std::sync::Arc::new(start_envoy(host, &shim, &config, &upstream));
    let started = Instant::now();
    let workers: Vec<JoinHandle<Vec<(Ending, u16)>>> = (0..THREADS)
        .map(|thread| {
            let (envoy, upstream) = (envoy.clone(), upstream.clone());
            std::thread::spawn(move || {
                let agent = agent();
                // Four threads per key, at a limit of four: keys run full at times.
                let api_key = format!("key-{}", thread % 2);
                (0..PER_THREAD)
                    .map(|n| {
                        let name = format!("t{thread}-{n}");
                        let ending = ending(n + thread);
                        (ending, send(&agent, &envoy, &upstream, &api_key, &name, ending))
                    })
                    .collect()
            })
        })
        .collect();
    let statuses: Vec<(Ending, u16)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let took = started.elapsed();
    assert_eq!(statuses.len(), THREADS * PER_THREAD);
    let count = |status| statuses.iter().filter(|&&(_, s)| s == status).count();
    let mut by_ending = std::collections::BTreeMap::new();
    for (ending, status) in &statuses {
        *by_ending.entry(format!("{ending:?} {status}")).or_insert(0) += 1;
    }
    eprintln!(
        "{} requests in {took:?}, by ending and status: {by_ending:?}",
        statuses.len()
    );
    assert!(count(200) > THREADS * PER_THREAD / 4, "most complete");
    assert!(
        count(503) > 0 && count(504) > 0,
        "fault aborts and route timeouts happened"
    );

    // Every stream has ended: every slot comes back, well before max_duration (60 s).
    wait_until("every slot released", Duration::from_secs(15), || {
        slots_in_redis(&redis) == 0
    });
    wait_until("the upstream holds nothing", Duration::from_secs(10), || {
        upstream.in_flight() == 0
    });
    let allowed = envoy.stat(&host.stat(&format!("{RULE}.allowed")));
    let released = envoy.stat(&host.stat(&format!("{RULE}.released")));
    // An answer that found its client gone is released without being counted allowed.
    assert!(
        released >= allowed && allowed > 0,
        "allowed {allowed}, released {released}"
    );

    // And the full limit is there for each key: LIMIT new holds all admitted.
    let holds: Vec<JoinHandle<Reply>> = (0..2)
        .flat_map(|key| (0..LIMIT).map(move |i| (key, i)))
        .map(|(key, i)| hold(&envoy, &format!("key-{key}"), &format!("after-{key}-{i}")))
        .collect();
    wait_until("every key's full limit held", Duration::from_secs(20), || {
        upstream.in_flight() == 2 * LIMIT as i64
    });
    assert_eq!(refused_now(&envoy, "key-0").status, 429);
    for key in 0..2 {
        for i in 0..LIMIT {
            upstream.release(&format!("after-{key}-{i}"));
        }
    }
    for reply in holds {
        assert_eq!(reply.join().unwrap().status, 200);
    }
    wait_until("every slot released", Duration::from_secs(10), || {
        slots_in_redis(&redis) == 0
    });
}

fn the_slots_of_a_killed_envoy_come_back_after_max_duration(host: FilterHost) {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = Upstream::start();
    let config = concurrency_config(2, "2s");
    let mut doomed = start_envoy(host, &shim, &config, &upstream);
    let survivor = start_envoy(host, &shim, &config, &upstream);
    let held = [hold(&doomed, "k", "x"), hold(&doomed, "k", "y")];
    wait_until("both slots held", Duration::from_secs(20), || {
        upstream.received("x") && upstream.received("y")
    });
    let taken_at = Instant::now();
    doomed.process.kill();
    for reply in held {
        reply.join().unwrap();
    }
    // Nobody released them: the survivor is refused while they last.
    assert_eq!(slots_in_redis(&redis), 2);
    assert_eq!(refused_now(&survivor, "k").status, 429);
    wait_until("the lost slots expired", Duration::from_secs(15), || {
        slots_in_redis(&redis) == 0
    });
    assert!(
        taken_at.elapsed() > Duration::from_millis(1_000),
        "they lasted until max_duration, not less ({:?})",
        taken_at.elapsed()
    );
    let again = [hold(&survivor, "k", "z1"), hold(&survivor, "k", "z2")];
    wait_until("two new holds admitted", Duration::from_secs(20), || {
        upstream.received("z1") && upstream.received("z2")
    });
    upstream.release("z1");
    upstream.release("z2");
    for reply in again {
        assert_eq!(reply.join().unwrap().status, 200);
    }
}

/// concurrency.lua through the shim alone: a slot per admission, its id the stamp, a
/// release by that id, and check.lua still all or nothing when a concurrency check sits
/// beside a rate's.
#[test]
fn the_script_takes_a_slot_per_admission_releases_it_by_id_and_stays_all_or_nothing() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let check_url = shim.url("/v1/check");
    let slots = check_of("slots:{a}", "concurrency", 2, 60_000);
    let rate = check_of("rate:{a}", "token_bucket", 1, 60_000);
    let zcard = || redis.cli(&["ZCARD", "rl:slots:{a}"]).parse::<u64>().unwrap();

    let first = decide_at(&check_url, std::slice::from_ref(&slots));
    assert_eq!(first["allowed"], true);
    assert_eq!(
        (
            first["results"][0]["remaining"].as_u64(),
            first["results"][0]["granted"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let first_id = first["results"][0]["stamp"].as_i64().unwrap();
    assert!(
        first_id > 0 && first_id < (1i64 << 53),
        "an exact Lua number: {first_id}"
    );
    // Both checks admit: both charged, the slot and the token.
    let second = decide_at(&check_url, &[slots.clone(), rate.clone()]);
    assert_eq!(second["allowed"], true);
    let second_id = second["results"][0]["stamp"].as_i64().unwrap();
    assert_ne!(first_id, second_id, "each slot its own id");
    assert_eq!(zcard(), 2);
    // Full: refused with a short wait, nothing charged.
    let full = decide_at(&check_url, std::slice::from_ref(&slots));
    assert_eq!(full["allowed"], false);
    let retry_ms = full["results"][0]["retry_after_ms"].as_u64().unwrap();
    assert!((1..=1_000).contains(&retry_ms), "{retry_ms}");
    assert_eq!(zcard(), 2);

    // Released by id (the filter's return at stream end): one slot free again.
    let release = json!({ "requests": [], "returns": [{ "key": "slots:{a}", "algorithm": "concurrency",
        "limit": 2, "period_ms": 60_000, "amount": 1, "stamp": first_id }] });
    assert_eq!(
        post(&shim.url("/v1/check-batch"), &[], &release.to_string()).status,
        200
    );
    assert_eq!(zcard(), 1);
    let members = redis.cli(&["ZRANGE", "rl:slots:{a}", "0", "-1"]);
    assert_eq!(
        members.trim(),
        second_id.to_string(),
        "the named slot went, not another"
    );

    // The token bucket (spent) refuses: the free slot is not taken either.
    let mixed = decide_at(&check_url, &[slots.clone(), rate.clone()]);
    assert_eq!(mixed["allowed"], false);
    assert_eq!(mixed["results"][0]["allowed"], true);
    assert_eq!(mixed["results"][0]["granted"].as_u64(), Some(0));
    assert_eq!(zcard(), 1, "all or nothing: no slot taken for a refused request");
    // And the full concurrency check refuses a request whose rate admits: no token spent.
    let other_rate = check_of("rate2:{a}", "fixed_window", 1, 60_000);
    let _ = decide_at(&check_url, std::slice::from_ref(&slots));
    let refused = decide_at(&check_url, &[other_rate.clone(), slots.clone()]);
    assert_eq!(refused["allowed"], false);
    assert_eq!(
        decide_at(&check_url, &[other_rate])["allowed"],
        true,
        "its token was not spent"
    );

    // A cost or a lease makes no sense for a slot: refused before Redis.
    let costly = with(slots.clone(), "cost", json!(2));
    assert_eq!(post(&check_url, &[], &checks_body(&[costly])).status, 400);
}

fn a_local_concurrency_limit_holds_in_one_envoy_and_leaks_no_slot(host: FilterHost) {
    const LIMIT: u64 = 3;
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = std::sync::Arc::new(Upstream::start());
    let mut config = concurrency_config(LIMIT, "60s");
    config["rules"][0]["scope"] = json!("local");
    let envoy = std::sync::Arc::new(start_envoy(host, &shim, &config, &upstream));
    let held: Vec<JoinHandle<Reply>> = (0..LIMIT)
        .map(|i| hold(&envoy, "k", &format!("local-{i}")))
        .collect();
    wait_until("the local limit held", Duration::from_secs(20), || {
        upstream.in_flight() == LIMIT as i64
    });
    let refused = refused_now(&envoy, "k");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""in-flight";q=3;qu="concurrent-requests""#)
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(slots_in_redis(&redis), 0, "a local limit never reaches Redis");
    upstream.release("local-0");
    wait_until("one slot free again", Duration::from_secs(10), || {
        envoy.stat(&host.stat(&format!("{RULE}.released"))) == 1
    });
    let next = hold(&envoy, "k", "local-next");
    wait_until("the next request held", Duration::from_secs(20), || {
        upstream.received("local-next")
    });
    for name in ["local-1", "local-2", "local-next"] {
        upstream.release(name);
    }
    for reply in held.into_iter().chain([next]) {
        assert_eq!(reply.join().unwrap().status, 200);
    }

    // Every way a stream ends, from four threads on one key.
    let workers: Vec<JoinHandle<()>> = (0..4)
        .map(|thread| {
            let (envoy, upstream) = (envoy.clone(), upstream.clone());
            std::thread::spawn(move || {
                let agent = agent();
                for n in 0..150 {
                    let name = format!("local-t{thread}-{n}");
                    send(&agent, &envoy, &upstream, "k", &name, ending(n + thread));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let stat = |name: &str| envoy.stat(&host.stat(&format!("{RULE}.{name}")));
    wait_until("every local slot released", Duration::from_secs(15), || {
        stat("released") == stat("allowed")
    });
    let again: Vec<JoinHandle<Reply>> = (0..LIMIT)
        .map(|i| hold(&envoy, "k", &format!("local-again-{i}")))
        .collect();
    wait_until(
        "the full local limit admitted again",
        Duration::from_secs(20),
        || upstream.in_flight() == LIMIT as i64,
    );
    for i in 0..LIMIT {
        upstream.release(&format!("local-again-{i}"));
    }
    for reply in again {
        assert_eq!(reply.join().unwrap().status, 200);
    }
}

// docs/OPERATIONS.md, "When Redis loses its data": the slots of requests in flight are
// forgotten, so as many again are admitted until those end; their releases then free
// nothing that a newer request holds.
fn after_redis_loses_its_data_a_limit_admits_up_to_twice_until_the_forgotten_requests_end(host: FilterHost) {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let upstream = Upstream::start();
    let envoy = start_envoy(host, &shim, &concurrency_config(2, "60s"), &upstream);
    let before: Vec<JoinHandle<Reply>> = ["a", "b"].iter().map(|name| hold(&envoy, "team", name)).collect();
    wait_until("two held", Duration::from_secs(20), || upstream.in_flight() == 2);
    assert_eq!(slots_in_redis(&redis), 2);
    redis.cli(&["FLUSHALL"]);
    let after: Vec<JoinHandle<Reply>> = ["c", "d"].iter().map(|name| hold(&envoy, "team", name)).collect();
    wait_until("four held", Duration::from_secs(20), || upstream.in_flight() == 4);
    assert_eq!(
        refused_now(&envoy, "team").status,
        429,
        "the bound holds again at 2 slots"
    );
    for name in ["a", "b"] {
        upstream.release(name);
    }
    for reply in before {
        assert_eq!(reply.join().unwrap().status, 200);
    }
    let released = host.stat(&format!("{RULE}.released"));
    wait_until("two releases", Duration::from_secs(20), || {
        envoy.stat(&released) == 2
    });
    assert_eq!(
        slots_in_redis(&redis),
        2,
        "the releases of forgotten slots freed nothing"
    );
    for name in ["c", "d"] {
        upstream.release(name);
    }
    for reply in after {
        assert_eq!(reply.join().unwrap().status, 200);
    }
    wait_until("no slot left", Duration::from_secs(20), || {
        slots_in_redis(&redis) == 0
    });
}
