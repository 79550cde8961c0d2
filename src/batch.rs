//! Coalescing of shim calls within one worker: the bookkeeping, free of host calls.
//!
//! Each shim call costs Envoy far more CPU than the filter's own work (an async HTTP
//! client stream, a timer, the paused request's resume), so a worker keeps at most
//! `max_in_flight` calls open. A request that needs the shim waits in the queue; the
//! queue is sent as one batch as soon as a call may start: at once when the worker is
//! idle, and when a call finishes under load, carrying everything that arrived during
//! its round trip. Every request keeps its own deadline, so queueing never makes one
//! wait longer than the configured timeout; and a call carries only requests whose
//! deadlines lie close together, so one that has waited long (behind a slow shim) never
//! cuts short the wait of those that just arrived.

use crate::wire::MAX_BATCH;
use std::collections::VecDeque;

/// A request waiting for a call.
struct Waiting<T> {
    member: T,
    deadline_ms: u64,
}

/// A call on its way to the shim.
pub struct Call<T> {
    /// The requests it carries, in the order of the batch.
    pub members: Vec<T>,
    /// When it was sent, in µs: the shim_call_us histogram.
    pub sent_at_us: u64,
    /// The returns and settlements it carries, lost if it fails.
    pub adjustments: usize,
}

/// What [`Batcher::next`] hands the dispatcher.
pub struct Next<T> {
    /// Requests whose deadline passed while they waited: they fail as timed out.
    pub expired: Vec<T>,
    /// Requests whose HTTP stream went away while they waited: nothing is sent for them.
    pub dropped: Vec<T>,
    /// The requests to send now, if a call may start.
    pub batch: Option<Batch<T>>,
}

/// Requests to send in one call.
#[derive(Debug, PartialEq, Eq)]
pub struct Batch<T> {
    pub members: Vec<T>,
    /// The call's timeout: what is left of the earliest deadline among them.
    pub timeout_ms: u64,
}

pub struct Batcher<T> {
    queue: VecDeque<Waiting<T>>,
    calls: Vec<(u32, Call<T>)>,
    max_in_flight: usize,
    timeout_ms: u64,
    wake_pending: bool,
}

impl<T> Batcher<T> {
    /// At most `max_in_flight` calls at once; `timeout_ms` is each request's allowance.
    pub fn new(max_in_flight: usize, timeout_ms: u64) -> Self {
        Batcher {
            queue: VecDeque::new(),
            calls: Vec::new(),
            max_in_flight: max_in_flight.max(1),
            timeout_ms: timeout_ms.max(1),
            wake_pending: false,
        }
    }

    /// How far apart the deadlines in one call may lie: what a fresh request may lose of
    /// its allowance by sharing a call with older ones.
    fn deadline_spread_ms(&self) -> u64 {
        (self.timeout_ms / 8).max(1)
    }

    /// Queues a request. True when the caller must wake the dispatcher: a call may start
    /// and no wake-up is pending. Otherwise the pending wake-up or the end of a call in
    /// flight sends it.
    pub fn push(&mut self, member: T, deadline_ms: u64) -> bool {
        self.queue.push_back(Waiting { member, deadline_ms });
        self.wake_for_adjustments()
    }

    /// Something other than a request (tokens given back, costs settled) waits for a call. True when
    /// the caller must wake the dispatcher, as for [`Batcher::push`].
    pub fn wake_for_adjustments(&mut self) -> bool {
        let wake = !self.wake_pending && self.calls.len() < self.max_in_flight;
        self.wake_pending |= wake;
        wake
    }

    /// The wake-up was delivered (or could not be sent).
    pub fn woken(&mut self) {
        self.wake_pending = false;
    }

    /// Takes the requests to send in the next call, if one may start. `is_live` tells
    /// the requests whose HTTP stream has gone away.
    pub fn next(&mut self, now_ms: u64, is_live: impl Fn(&T) -> bool) -> Next<T> {
        let mut next = Next {
            expired: Vec::new(),
            dropped: Vec::new(),
            batch: None,
        };
        if self.calls.len() >= self.max_in_flight {
            return next;
        }
        let mut members = Vec::new();
        // Grouped by the first one's deadline; the call lasts until the earliest.
        let mut first_deadline = None;
        let mut earliest_deadline = u64::MAX;
        while members.len() < MAX_BATCH {
            let Some(waiting) = self.queue.pop_front() else {
                break;
            };
            if !is_live(&waiting.member) {
                next.dropped.push(waiting.member);
                continue;
            }
            if waiting.deadline_ms <= now_ms {
                next.expired.push(waiting.member);
                continue;
            }
            let first = *first_deadline.get_or_insert(waiting.deadline_ms);
            if waiting.deadline_ms > first + self.deadline_spread_ms() {
                // Fresher than the rest: it goes in the next call, with its own allowance.
                self.queue.push_front(waiting);
                break;
            }
            earliest_deadline = earliest_deadline.min(waiting.deadline_ms);
            members.push(waiting.member);
        }
        if !members.is_empty() {
            // The clamp guards against the wall clock stepping back since the request came.
            let timeout_ms = (earliest_deadline - now_ms).min(self.timeout_ms);
            next.batch = Some(Batch { members, timeout_ms });
        }
        next
    }

    /// Whether a call may start now.
    pub fn may_call(&self) -> bool {
        self.calls.len() < self.max_in_flight
    }

    /// Whether requests are waiting.
    pub fn has_waiting(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Every request waiting or in flight, removed: the dispatcher is going away.
    pub fn take_all(&mut self) -> Vec<T> {
        let mut all: Vec<T> = self.queue.drain(..).map(|waiting| waiting.member).collect();
        for (_, call) in self.calls.drain(..) {
            all.extend(call.members);
        }
        all
    }

    /// Records a call the host accepted, under its token.
    pub fn sent(&mut self, token: u32, call: Call<T>) {
        self.calls.push((token, call));
    }

    /// The call with this token, which has been answered (or has failed).
    pub fn answered(&mut self, token: u32) -> Option<Call<T>> {
        let position = self.calls.iter().position(|(t, _)| *t == token)?;
        Some(self.calls.swap_remove(position).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn call(members: Vec<u32>) -> Call<u32> {
        Call {
            members,
            sent_at_us: 0,
            adjustments: 0,
        }
    }

    #[test]
    fn wakes_once_until_woken() {
        let mut batcher = Batcher::new(2, 100);
        assert!(batcher.push(1, 100));
        assert!(!batcher.push(2, 100), "a wake-up is already pending");
        batcher.woken();
        let next = batcher.next(0, |_| true);
        let Batch {
            members,
            timeout_ms: timeout,
        } = next.batch.unwrap();
        assert_eq!(members, vec![1, 2], "both go in one call");
        assert_eq!(timeout, 100);
        assert!(!batcher.has_waiting());
    }

    #[test]
    fn past_the_bound_requests_wait_for_a_call_to_end() {
        let mut batcher = Batcher::new(1, 100);
        assert!(batcher.push(1, 100));
        batcher.woken();
        let Batch { members, .. } = batcher.next(0, |_| true).batch.unwrap();
        batcher.sent(7, call(members));
        assert!(!batcher.push(2, 105), "the only call is in flight");
        assert!(!batcher.push(3, 110));
        assert!(batcher.next(10, |_| true).batch.is_none());
        assert_eq!(batcher.answered(7).unwrap().members, vec![1]);
        assert!(batcher.answered(7).is_none(), "answered once");
        let Batch {
            members,
            timeout_ms: timeout,
        } = batcher.next(20, |_| true).batch.unwrap();
        assert_eq!(members, vec![2, 3]);
        assert_eq!(timeout, 85, "what is left of the earliest deadline");
    }

    #[test]
    fn a_call_carries_only_requests_with_close_deadlines() {
        let mut batcher = Batcher::new(2, 100);
        batcher.push(1, 110);
        batcher.push(2, 122);
        batcher.push(3, 190);
        batcher.push(4, 195);
        let Batch {
            members: old,
            timeout_ms: timeout,
        } = batcher.next(100, |_| true).batch.unwrap();
        assert_eq!((old, timeout), (vec![1, 2], 10), "within 100/8 of the first");
        batcher.sent(1, call(vec![]));
        let Batch {
            members: fresh,
            timeout_ms: timeout,
        } = batcher.next(100, |_| true).batch.unwrap();
        assert_eq!(
            (fresh, timeout),
            (vec![3, 4], 90),
            "the fresh keep their own allowance"
        );
    }

    #[test]
    fn a_call_never_outlasts_the_allowance() {
        let mut batcher = Batcher::new(1, 100);
        batcher.push(1, 1_000);
        let Batch {
            timeout_ms: timeout, ..
        } = batcher.next(0, |_| true).batch.unwrap();
        assert_eq!(timeout, 100, "the clock stepped back since it was queued");
    }

    #[test]
    fn expired_and_dead_requests_are_not_sent() {
        let mut batcher = Batcher::new(1, 100);
        batcher.push(1, 50);
        batcher.push(2, 200);
        batcher.push(3, 200);
        batcher.push(4, 120);
        let next = batcher.next(100, |member| *member != 3);
        assert_eq!(next.expired, vec![1]);
        assert_eq!(
            next.batch,
            Some(Batch {
                members: vec![2, 4],
                timeout_ms: 20
            })
        );
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_requests() {
        let mut batcher = Batcher::new(2, 100);
        for member in 0..(MAX_BATCH as u32 + 3) {
            batcher.push(member, 100);
        }
        let Batch { members: first, .. } = batcher.next(0, |_| true).batch.unwrap();
        assert_eq!(first.len(), MAX_BATCH);
        batcher.sent(1, call(first));
        let Batch { members: rest, .. } = batcher.next(0, |_| true).batch.unwrap();
        assert_eq!(rest.len(), 3);
        batcher.sent(2, call(rest));
        batcher.push(99, 100);
        assert!(batcher.next(0, |_| true).batch.is_none(), "two calls in flight");
        let mut all = batcher.take_all();
        all.sort();
        assert_eq!(all.len(), MAX_BATCH + 4, "queued and in flight alike");
        assert!(!batcher.has_waiting() && batcher.answered(1).is_none());
    }
}
