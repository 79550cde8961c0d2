//! Every counter's [`Pool`] of the quota streams open on this shim, and the pushes: when a
//! report re-balances a pool, the other members' new assignments go out on their own
//! streams at once, not at their next report. A push that finds its stream's queue full
//! (or closed) is dropped: the member gets its share at its next report, and counts as
//! sent (its assignment's expiry is counted from now), the strict side.

use crate::decide::rlqs::assignment;
use crate::decide::rlqs::bucket::BucketKey;
use crate::decide::rlqs::pool::{Pool, ASSIGNMENT_TTL_MS, RELEASE_MARGIN_MS};
use crate::decide::rlqs::share::{Rule, Share};
use crate::envoy_api::messages::quota::RateLimitQuotaResponse;
use crate::metrics::rlqs::RlqsMetrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use tokio::sync::mpsc;
use tonic::Status;

/// Where a stream's answers go.
pub type Answers = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// A member's stream: its bucket id for this counter, and where to push.
struct Member {
    bucket: BucketKey,
    answers: Answers,
}

#[derive(Default)]
struct Counter {
    pool: Option<Pool>,
    members: HashMap<u64, Member>,
}

/// The pools, by counter key.
#[derive(Default)]
pub struct Pools {
    next_stream: AtomicU64,
    counters: Mutex<HashMap<String, Counter>>,
}

const TTL_S: u64 = ASSIGNMENT_TTL_MS / 1000;

impl Pools {
    /// A new stream's id: its place in every pool it joins.
    pub fn stream_id(&self) -> u64 {
        self.next_stream.fetch_add(1, Relaxed)
    }

    /// `stream` reported `bucket` (on `counter`, under `rule`) at `now_ms`: its share, the
    /// other members' new ones pushed when the pool re-balanced.
    #[allow(clippy::too_many_arguments)]
    pub fn report(
        &self,
        counter: &str,
        rule: Rule,
        stream: u64,
        bucket: &BucketKey,
        answers: &Answers,
        demand: Option<f64>,
        now_ms: u64,
        metrics: &RlqsMetrics,
    ) -> Share {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let entry = counters.entry(counter.to_string()).or_default();
        entry.members.insert(
            stream,
            Member {
                bucket: bucket.clone(),
                answers: answers.clone(),
            },
        );
        let pool = entry.pool.get_or_insert_with(|| Pool::new(rule));
        let (share, others) = pool.report(stream, demand, rule, now_ms);
        push(entry, others, metrics);
        share
    }

    /// `stream`'s Envoy was told to forget `counter`'s bucket: the others get its share.
    pub fn leave(&self, counter: &str, stream: u64, now_ms: u64, metrics: &RlqsMetrics) {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = counters.get_mut(counter) else {
            return;
        };
        entry.members.remove(&stream);
        let send = entry
            .pool
            .as_mut()
            .map(|p| p.leave(stream, now_ms))
            .unwrap_or_default();
        push(entry, send, metrics);
        drop_if_empty(&mut counters, counter);
    }

    /// After a stream ended: drops its members once their assignments can no longer be
    /// spent, and pushes their shares to the others.
    pub fn prune(&self, counters_of_stream: &[String], now_ms: u64, metrics: &RlqsMetrics) {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        for counter in counters_of_stream {
            let Some(entry) = counters.get_mut(counter) else {
                continue;
            };
            let send = entry.pool.as_mut().map(|p| p.prune(now_ms)).unwrap_or_default();
            push(entry, send, metrics);
            drop_if_empty(&mut counters, counter);
        }
    }

    /// `stream` ended: it stays a member of its pools (its Envoy may still spend its
    /// assignments), but nothing is pushed to it, and its answers' queue can close.
    pub fn disconnect(&self, stream: u64, counters_of_stream: &[String]) {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        for counter in counters_of_stream {
            if let Some(entry) = counters.get_mut(counter) {
                entry.members.remove(&stream);
            }
        }
    }

    /// How long after a stream's last assignment its members can be pruned.
    pub fn prune_after_ms() -> u64 {
        ASSIGNMENT_TTL_MS + RELEASE_MARGIN_MS
    }
}

fn push(entry: &mut Counter, send: Vec<(u64, Share)>, metrics: &RlqsMetrics) {
    if !send.is_empty() {
        metrics.rebalanced();
    }
    for (stream, share) in send {
        let Some(member) = entry.members.get(&stream) else {
            continue;
        };
        let answer = RateLimitQuotaResponse {
            bucket_action: vec![assignment::token_bucket(&member.bucket, &share, TTL_S)],
        };
        if member.answers.try_send(Ok(answer)).is_ok() {
            metrics.pushed();
        }
    }
    // Members the pool dropped have no stream to push to any more.
    if let Some(pool) = &entry.pool {
        entry.members.retain(|id, _| pool.has(*id));
    }
}

fn drop_if_empty(counters: &mut HashMap<String, Counter>, counter: &str) {
    if counters
        .get(counter)
        .is_some_and(|c| c.pool.as_ref().is_none_or(Pool::is_empty))
    {
        counters.remove(counter);
    }
}
