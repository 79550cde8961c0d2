//! Rule changes without a restart: Envoy takes a new listener, the plugin configuration
//! with it, from a file-based LDS in a watched directory (as a control plane, or Istio
//! for a WasmPlugin, pushes one) while traffic flows. Requests waiting on a lease when a
//! swap lands each get their answer within their timeout. A raised limit applies from the
//! first request after the swap and a counter exhausted before it refills at the new
//! rate; a changed period starts fresh counters; a broken configuration is refused with
//! the field named while the previous one keeps serving; and across every swap no
//! request fails or hangs. docs/CONFIG.md ("Changing rules live") explains each.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use support::*;

/// One token-bucket rule keyed on `x-api-key`.
fn policy(limit: u64, period: &str) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "5s",
        // Off, so that every answer below comes from the counter in Redis: with it, an
        // Envoy keeps refusing a client it saw refused for up to a second after the swap,
        // whatever the new limit (docs/CONFIG.md).
        "deny_cache": false,
        "rules": [{ "name": "per-api-key", "key": [{ "header": "x-api-key" }],
                    "limit": limit, "period": period }]
    })
}

/// Longest a request may take before it counts as hung, on a loaded machine.
const HANG: Duration = Duration::from_secs(10);
/// Each load thread stops after this many requests, whatever happens: a bounded load.
const MAX_PER_THREAD: usize = 6_000;

/// One answer the load got: status (0 for a transport error), time taken, body.
type Answer = (u16, Duration, String);

/// Requests in the background, each thread on its own keep-alive connection (so that
/// some are on the old filter chain when a swap lands), until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<Vec<Answer>>>,
}

impl Load {
    fn start(url: &str, threads: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let threads = (0..threads)
            .map(|thread| {
                let (stop, answered, url) = (stop.clone(), answered.clone(), url.to_string());
                std::thread::spawn(move || {
                    let agent = agent();
                    let key = format!("load-{thread}");
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) && answers.len() < MAX_PER_THREAD {
                        let started = Instant::now();
                        let reply = get_with(&agent, &url, &[("x-api-key", &key)]);
                        answers.push((reply.status, started.elapsed(), reply.body));
                        answered.fetch_add(1, Ordering::Relaxed);
                        // Pacing, not a wait: about 100 requests a second per thread keeps
                        // the load steady without starving Envoy's main thread on 2 cores.
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    answers
                })
            })
            .collect();
        Load {
            stop,
            answered,
            threads,
        }
    }

    /// Waits until `more` requests have been answered from now on: the load runs on
    /// across what the test did before.
    fn runs_on(&self, more: usize) {
        let from = self.answered.load(Ordering::Relaxed);
        wait_until("the background load", Duration::from_secs(60), || {
            self.answered.load(Ordering::Relaxed) >= from + more
        });
    }

    fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    }
}

on_both_hosts!(rules_change_live_under_load_and_a_broken_change_is_refused);

fn rules_change_live_under_load_and_a_broken_change_is_refused(host: FilterHost) {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let mut lds = LdsEnvoy::start_on(host, shim.port, &policy(5, "10m"), 2, 1);
    let url = lds.envoy.url("/");
    // Every assertion uses a new connection: one opened before a swap may still be served
    // by the previous filter chain until it drains.
    let request = |key: &str| get(&url, &[("x-api-key", key)]);
    let load = Load::start(&url, 2);
    load.runs_on(20);

    for _ in 0..5 {
        assert_eq!(request("exhausted").status, 200);
    }
    let refused = request("exhausted");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(
        refused.number("retry-after") > 60,
        "one token per 2 min: {refused:?}"
    );

    // Raised from 5 to 20: the first request after the swap meets the new limit.
    assert_eq!(lds.push(&policy(20, "10m")), Push::Accepted);
    let first = request("raised");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.number("x-ratelimit-limit"), 20, "{first:?}");
    // The bucket emptied at 5 keeps its fill, empty, and refills at the new rate: one
    // token per 30 s instead of per 2 min.
    let still = request("exhausted");
    assert_eq!(still.status, 429, "{still:?}");
    assert!(still.number("retry-after") <= 30, "{still:?}");
    let admitted = 1 + (0..20).filter(|_| request("raised").status == 200).count();
    assert_eq!(admitted, 20);
    load.runs_on(20);

    // A new period names new counters: every client starts from the full new limit.
    assert_eq!(lds.push(&policy(30, "1h")), Push::Accepted);
    let renewed = request("exhausted");
    assert_eq!(renewed.status, 200, "{renewed:?}");
    assert_eq!(renewed.number("x-ratelimit-limit"), 30, "{renewed:?}");
    assert_eq!(renewed.number("x-ratelimit-remaining"), 29, "{renewed:?}");
    load.runs_on(20);

    // A broken configuration is refused, naming the field, and the last good one serves.
    assert_eq!(lds.push(&policy(40, "0s")), Push::Rejected);
    let log = lds.envoy.process.log_text();
    assert!(
        log.contains("invalid plugin configuration: rules[0].period"),
        "{log}"
    );
    assert!(log.contains("config rejected"), "{log}");
    let kept = request("after-the-broken-push");
    assert_eq!(kept.status, 200, "{kept:?}");
    assert_eq!(kept.number("x-ratelimit-limit"), 30, "{kept:?}");
    load.runs_on(20);

    let answers = load.finish();
    assert!(answers.len() >= 80, "{} answers", answers.len());
    let failed: Vec<&Answer> = answers
        .iter()
        .filter(|(status, _, _)| ![200, 429].contains(status))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(5)]
    );
    let slowest = answers.iter().map(|(_, took, _)| *took).max().unwrap();
    assert!(slowest < HANG, "a request took {slowest:?}");
    // Both kinds of answer crossed the swaps: the load was refused and admitted.
    assert!(answers.iter().any(|(status, _, _)| *status == 429));
    assert!(answers.iter().any(|(status, _, _)| *status == 200));
}

/// A lease rule that fails closed, over a shim that never answers: the first request of
/// a key acquires its lease, and the others wait for that acquisition.
fn lease_policy(limit: u64) -> Value {
    json!({
        "shim_cluster": "ratelimit_shim",
        "timeout": "3s",
        "rules": [{ "name": "leased", "key": [{ "header": "x-api-key" }], "limit": limit,
                    "period": "1m", "lease": { "size": 4, "ttl": "5s" }, "failure_mode": "closed" }]
    })
}

// Teardown: the plugin configuration is replaced while requests wait on a lease whose
// acquisition is still in flight (the worker's dispatcher, src/dispatch/rounds.rs, must
// leave none of them paused). Each gets its answer, the rule's failure mode, within its
// timeout, and the new configuration serves.
#[test]
fn a_reload_while_requests_wait_on_a_lease_leaves_none_paused() {
    const WAITING: usize = 6;
    // A shim that accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    // One worker, so that every request after the first waits for its acquisition; old
    // connections drain for longer than the timeout, so that none is cut before it.
    let mut lds = LdsEnvoy::start_with(silent_port, &lease_policy(10), 1, 10);
    let url = lds.envoy.url("/");
    let started = Instant::now();
    let waiting: Vec<JoinHandle<(u16, Duration)>> = (0..WAITING)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let sent = Instant::now();
                let reply = get(&url, &[("x-api-key", "waits")]);
                (reply.status, sent.elapsed())
            })
        })
        .collect();
    wait_until(
        "every request paused in the filter",
        Duration::from_secs(10),
        || lds.envoy.stat("http.test.downstream_rq_active") == WAITING as u64,
    );
    assert_eq!(
        lds.envoy.stat("wasmcustom.ratelimit.leased.shim_checks"),
        1,
        "one acquisition in flight, the others wait for it"
    );
    assert_eq!(lds.push(&lease_policy(20)), Push::Accepted);
    let pushed = started.elapsed();

    let answers: Vec<(u16, Duration)> = waiting.into_iter().map(|h| h.join().unwrap()).collect();
    let earliest = answers.iter().map(|(_, took)| *took).min().unwrap();
    assert!(
        pushed < earliest,
        "the push landed at {pushed:?}, before any answer: {answers:?}"
    );
    // The timeout (3 s) and a margin for this noisy machine; a request left paused would
    // hang until the drain (10 s) cut it.
    for (status, took) in &answers {
        assert_eq!(*status, 503, "failed closed: {answers:?}");
        assert!(*took < Duration::from_secs(5), "{answers:?}");
    }
    assert_eq!(
        lds.envoy.stat("wasmcustom.ratelimit.leased.failed_closed"),
        WAITING as u64
    );
    drop(silent);
}
