//! Requests of concurrent calls (several Envoys, several workers) merged into one
//! check_batch.lua call per target: the whole standalone Redis, or one cluster master
//! (check_node.lua), or one cluster slot while the shim has no map of the masters. Each
//! request is still decided all or nothing on its own, as check_batch.lua decides every
//! request of a call.
//!
//! No call waits for company: while fewer calls than the target's bound are running on
//! it, a caller's requests go at once, alone. Beyond that they queue; when a running call
//! ends, its caller hands the queue (at most [`MAX_MERGED_REQUESTS`] requests) to the
//! first caller waiting, which runs it as one call and answers the others. Under load
//! the calls grow and their number, and Redis's fixed cost per call, shrink.
//!
//! The bound follows how long calls take ([`in_flight_bound`]): one while a call is
//! shorter than [`MERGE_WINDOW_US`] (Redis on the same host: merging the most), more as
//! Redis moves away, so that with every allowed call running one still ends about every
//! window. A queued request then waits about a window, not a round trip to a distant
//! Redis (bench/distance.py: with one call a target and 1 ms each way, a check took two
//! round trips).
//!
//! A caller whose future is dropped (its client went away) while it leads hands the
//! lead on; the callers it was carrying get an error, never a hang.

use crate::store::scripts::{RequestChecks, RequestRows};
use crate::store::{Answer, StoreError};
use ratelimit_wire::Check;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::oneshot;

/// How long a queued request should wait at most, about: a call's duration over the
/// calls allowed on its target. On one host a call takes less, and one call a target
/// merges the most (bench/RESULTS.md: with 4 callers 1.4 requests per call against 1.16
/// with two in flight, and 1.6x the checks per second).
pub const MERGE_WINDOW_US: u64 = 500;
/// Most calls running at once on one target, however far Redis is: 16 calls of
/// [`MAX_MERGED_REQUESTS`] per round trip.
pub const MAX_IN_FLIGHT: usize = 16;

/// Calls allowed at once on a target whose calls take `call_us` (a moving average).
pub fn in_flight_bound(call_us: u64) -> usize {
    (call_us.div_ceil(MERGE_WINDOW_US) as usize).clamp(1, MAX_IN_FLIGHT)
}
/// Requests in one merged call, bounding Redis's time in it (about 10 µs each).
pub const MAX_MERGED_REQUESTS: usize = 64;

/// What runs a merged call: check_batch.lua over a list of requests, on a target.
pub trait BatchRunner<K> {
    fn run_batch(&self, target: K, requests: &[RequestChecks<'_>]) -> impl Future<Output = Answer> + Send;
}

/// A request of a caller waiting in a queue, owned so another caller can send it.
struct OwnedRequest {
    keys: Vec<String>,
    checks: Vec<Check>,
}

/// A caller waiting for its turn.
struct Waiter<K: Target> {
    requests: Vec<OwnedRequest>,
    turn: oneshot::Sender<Turn<K>>,
}

/// What a waiting caller is told.
enum Turn<K: Target> {
    /// Run your requests and these waiters' in one call, then answer them.
    Lead(Leadership<K>),
    /// Your requests' answer, from another caller's call.
    Done(Answer),
}

/// Where a call goes: calls to one target can be merged.
pub trait Target: Copy + PartialEq + Send + 'static {}
impl<K: Copy + PartialEq + Send + 'static> Target for K {}

/// The calls of one target.
struct Calls<K: Target> {
    in_flight: usize,
    queue: Vec<Waiter<K>>,
}

type Targets<K> = Arc<Mutex<Vec<(K, Calls<K>)>>>;

/// A running call's place on its target and the waiters it carries: dropped, it frees
/// the place, passing it to the next waiter. The carried waiters not answered by then
/// see their channel closed.
struct Leadership<K: Target> {
    targets: Targets<K>,
    target: K,
    carried: Vec<Waiter<K>>,
    /// Holds the place still (false once handed back another way).
    holds: bool,
}

impl<K: Target> Drop for Leadership<K> {
    fn drop(&mut self) {
        if self.holds {
            hand_off(&self.targets, self.target);
        }
    }
}

fn lock<K: Target>(targets: &Targets<K>) -> MutexGuard<'_, Vec<(K, Calls<K>)>> {
    targets.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A call on `target_key` ended: its place goes to the first waiter still listening, with
/// the queue behind it (up to the merge bound), or is freed.
fn hand_off<K: Target>(targets: &Targets<K>, target_key: K) {
    let mut all = lock(targets);
    let Some(index) = all.iter().position(|(key, _)| *key == target_key) else {
        return;
    };
    let target = &mut all[index].1;
    while !target.queue.is_empty() {
        let mut taken = 0;
        let cut = target
            .queue
            .iter()
            .position(|waiter| {
                taken += waiter.requests.len();
                taken > MAX_MERGED_REQUESTS
            })
            .unwrap_or(target.queue.len())
            .max(1);
        let mut batch: Vec<Waiter<K>> = target.queue.drain(..cut).collect();
        let leader = batch.remove(0);
        let leadership = Leadership {
            targets: targets.clone(),
            target: target_key,
            carried: batch,
            holds: true,
        };
        match leader.turn.send(Turn::Lead(leadership)) {
            Ok(()) => return,
            Err(Turn::Lead(mut refused)) => {
                // That caller is gone: the next one leads; no second hand-off on drop.
                refused.holds = false;
                let mut rest = std::mem::take(&mut refused.carried);
                rest.append(&mut target.queue);
                target.queue = rest;
            }
            Err(Turn::Done(_)) => unreachable!("a Lead was sent"),
        }
    }
    target.in_flight -= 1;
    if target.in_flight == 0 {
        all.swap_remove(index);
    }
}

/// Merges the requests of concurrent calls per target (see the module's comment).
pub struct Coalescer<K: Target> {
    targets: Targets<K>,
    /// A moving average of how long calls take, µs (every target's: one Redis or one
    /// cluster's nodes, at one distance).
    call_us: Arc<AtomicU64>,
}

impl<K: Target> Default for Coalescer<K> {
    fn default() -> Self {
        Coalescer {
            targets: Arc::new(Mutex::new(Vec::new())),
            call_us: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl<K: Target> Coalescer<K> {
    /// Decides `requests` (all on `target_key`) with `runner`, alone or merged with
    /// other callers' requests.
    pub async fn check_requests(
        &self,
        runner: &impl BatchRunner<K>,
        target_key: K,
        requests: &[RequestChecks<'_>],
    ) -> Answer {
        let waiting = {
            let mut all = lock(&self.targets);
            let index = match all.iter().position(|(key, _)| *key == target_key) {
                Some(index) => index,
                None => {
                    all.push((
                        target_key,
                        Calls {
                            in_flight: 0,
                            queue: Vec::new(),
                        },
                    ));
                    all.len() - 1
                }
            };
            let target = &mut all[index].1;
            if target.in_flight < in_flight_bound(self.call_us.load(Ordering::Relaxed)) {
                target.in_flight += 1;
                None
            } else {
                let (turn, waiting) = oneshot::channel();
                let requests = requests
                    .iter()
                    .map(|request| OwnedRequest {
                        keys: request.keys.to_vec(),
                        checks: request.checks.to_vec(),
                    })
                    .collect();
                target.queue.push(Waiter { requests, turn });
                Some(waiting)
            }
        };
        let leadership = match waiting {
            None => Leadership {
                targets: self.targets.clone(),
                target: target_key,
                carried: Vec::new(),
                holds: true,
            },
            Some(waiting) => match waiting.await {
                Ok(Turn::Done(answer)) => return answer,
                Ok(Turn::Lead(leadership)) => leadership,
                Err(_) => {
                    return Err(StoreError::Script(
                        "the call carrying this request was dropped".into(),
                    ))
                }
            },
        };
        lead(leadership, requests, runner, &self.call_us).await
    }
}

/// Runs the leader's `own` requests and its carried waiters' in one call, answers the
/// waiters and returns its own answer; the place is handed on when `leadership` drops.
async fn lead<K: Target>(
    mut leadership: Leadership<K>,
    own: &[RequestChecks<'_>],
    runner: &impl BatchRunner<K>,
    call_us: &AtomicU64,
) -> Answer {
    let carried = std::mem::take(&mut leadership.carried);
    let mut all: Vec<RequestChecks<'_>> = own
        .iter()
        .map(|r| RequestChecks {
            keys: r.keys,
            checks: r.checks,
        })
        .collect();
    for waiter in &carried {
        all.extend(waiter.requests.iter().map(|r| RequestChecks {
            keys: &r.keys,
            checks: &r.checks,
        }));
    }
    let started = Instant::now();
    let answer = runner.run_batch(leadership.target, &all).await;
    let took = started.elapsed().as_micros().min(u64::MAX as u128) as u64;
    // Weight 1/8: a few slow calls move the bound, one does not.
    let average = call_us.load(Ordering::Relaxed);
    call_us.store(average - average / 8 + took / 8, Ordering::Relaxed);
    drop(leadership);
    match answer {
        Ok(mut rows) => {
            let mut rest = rows.split_off(own.len());
            for waiter in carried {
                let theirs: Vec<RequestRows> = rest.drain(..waiter.requests.len()).collect();
                let _ = waiter.turn.send(Turn::Done(Ok(theirs)));
            }
            Ok(rows)
        }
        Err(error) => {
            for waiter in carried {
                let _ = waiter.turn.send(Turn::Done(Err(error.duplicate())));
            }
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::Row;
    use ratelimit_wire::Algorithm;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    /// Answers each request with one row whose `remaining` is its first check's limit;
    /// every call waits for a permit, so calls can be held in flight.
    struct HeldRunner {
        permits: Semaphore,
        calls: Mutex<Vec<usize>>,
        running: AtomicUsize,
    }

    impl BatchRunner<u8> for HeldRunner {
        async fn run_batch(&self, _: u8, requests: &[RequestChecks<'_>]) -> Answer {
            self.running.fetch_add(1, Ordering::SeqCst);
            self.permits.acquire().await.unwrap().forget();
            self.calls.lock().unwrap().push(requests.len());
            let row = |limit: u64| Row {
                admits: true,
                remaining: limit,
                reset_ms: 0,
                retry_after_ms: 0,
                granted: 1,
                stamp: 0,
                lease_window_ms: 0,
            };
            Ok(requests
                .iter()
                .map(|r| Ok(vec![row(r.checks[0].limit)]))
                .collect())
        }
    }

    fn check(limit: u64) -> Check {
        Check {
            key: "k".into(),
            algorithm: Algorithm::TokenBucket,
            limit,
            period_ms: 1000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
            regions: Default::default(),
        }
    }

    async fn call(coalescer: &Coalescer<u8>, runner: &HeldRunner, limit: u64) -> u64 {
        let keys = ["k".to_string()];
        let checks = [check(limit)];
        let requests = [RequestChecks {
            keys: &keys,
            checks: &checks,
        }];
        let answer = coalescer.check_requests(runner, 0, &requests).await.unwrap();
        assert_eq!(answer.len(), 1);
        answer[0].as_ref().unwrap()[0].remaining
    }

    fn runner() -> HeldRunner {
        HeldRunner {
            permits: Semaphore::new(0),
            calls: Mutex::new(Vec::new()),
            running: AtomicUsize::new(0),
        }
    }

    /// Six callers against `bound` calls allowed: `bound` go alone, the rest share one.
    async fn six_callers(coalescer: Coalescer<u8>, bound: usize) {
        let runner = runner();
        let callers = futures_util::future::join_all((1..=6).map(|limit| call(&coalescer, &runner, limit)));
        let release = async {
            while runner.running.load(Ordering::SeqCst) < bound {
                tokio::task::yield_now().await;
            }
            runner.permits.add_permits(bound + 1);
        };
        let (answers, ()) = tokio::join!(callers, release);
        assert_eq!(answers, vec![1, 2, 3, 4, 5, 6]);
        let mut calls = runner.calls.lock().unwrap().clone();
        calls.sort();
        let mut expected = vec![1; bound];
        expected.push(6 - bound);
        assert_eq!(calls, expected, "the queued callers in one call");
        assert!(lock(&coalescer.targets).is_empty(), "an idle target is forgotten");
    }

    #[tokio::test]
    async fn callers_beyond_the_calls_in_flight_share_one_call_and_each_gets_its_own_rows() {
        six_callers(Coalescer::default(), 1).await;
    }

    #[tokio::test]
    async fn calls_to_a_distant_redis_run_side_by_side() {
        let coalescer = Coalescer::default();
        coalescer.call_us.store(3 * MERGE_WINDOW_US, Ordering::Relaxed);
        six_callers(coalescer, 3).await;
    }

    #[test]
    fn the_bound_grows_with_the_calls_duration_and_stops() {
        assert_eq!(in_flight_bound(0), 1);
        assert_eq!(in_flight_bound(MERGE_WINDOW_US), 1);
        assert_eq!(in_flight_bound(MERGE_WINDOW_US + 1), 2);
        assert_eq!(in_flight_bound(4 * MERGE_WINDOW_US), 4);
        assert_eq!(in_flight_bound(u64::MAX), MAX_IN_FLIGHT);
    }

    #[tokio::test]
    async fn a_caller_alone_goes_at_once() {
        let (coalescer, runner) = (Coalescer::default(), runner());
        runner.permits.add_permits(2);
        assert_eq!(call(&coalescer, &runner, 7).await, 7);
        assert_eq!(call(&coalescer, &runner, 8).await, 8);
        assert_eq!(*runner.calls.lock().unwrap(), vec![1, 1]);
    }

    #[tokio::test]
    async fn a_leader_dropped_mid_call_hands_its_place_to_the_caller_waiting() {
        let (coalescer, runner) = (Coalescer::default(), runner());
        // One call in flight, held; two callers queue.
        let mut callers = [1, 2, 3].map(|limit| Box::pin(call(&coalescer, &runner, limit)));
        for caller in &mut callers {
            // Polled once (Timeout polls first), then left pending.
            let polled = tokio::time::timeout(std::time::Duration::from_millis(1), caller).await;
            assert!(polled.is_err());
        }
        let [first, second, third] = callers;
        drop(first); // the first caller's client went away mid-call
                     // The second caller leads now, carrying the third, in one call.
        runner.permits.add_permits(1);
        let answers = futures_util::future::join_all([second, third]).await;
        assert_eq!(answers, vec![2, 3]);
        assert_eq!(*runner.calls.lock().unwrap(), vec![2]);
        assert!(lock(&coalescer.targets).is_empty());
    }

    #[tokio::test]
    async fn the_callers_a_dropped_leader_carried_get_an_error_not_a_hang() {
        let (coalescer, runner) = (Coalescer::default(), runner());
        let keys = ["k".to_string()];
        let checks = [check(1)];
        let requests = [RequestChecks {
            keys: &keys,
            checks: &checks,
        }];
        let mut callers = [0, 1, 2].map(|_| Box::pin(coalescer.check_requests(&runner, 0, &requests)));
        for caller in &mut callers {
            let polled = tokio::time::timeout(std::time::Duration::from_millis(1), caller).await;
            assert!(polled.is_err(), "held or queued");
        }
        let [first, second, third] = callers;
        drop(first); // the second caller leads, carrying the third, in a call held in flight
        let mut second = second;
        let polled = tokio::time::timeout(std::time::Duration::from_millis(1), &mut second).await;
        assert!(polled.is_err());
        assert_eq!(
            runner.running.load(Ordering::SeqCst),
            2,
            "the second caller's call started"
        );
        drop(second);
        let carried = third.await;
        assert!(matches!(carried, Err(StoreError::Script(_))), "{carried:?}");
        assert!(lock(&coalescer.targets).is_empty());
    }
}
