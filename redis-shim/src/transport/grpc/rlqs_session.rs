//! One `StreamRateLimitQuotas` stream: its domain, the buckets its Envoy reported, and
//! what each report comes to: every bucket answered at once (a limited one with its share
//! from the counter's pool, [`Pools`], the other members re-balanced by push), then what
//! the report says was admitted charged to the buckets' counters in Redis, so that callers
//! of the rate-limit service or the Wasm filter sharing a counter see it.

use crate::decide::adjustments::adjust_counters;
use crate::decide::clock::now_ms;
use crate::decide::rlqs::assignment;
use crate::decide::rlqs::bucket::{bucket_key, bucket_limit, BucketKey, BucketLimit};
use crate::decide::rlqs::pool::ASSIGNMENT_TTL_MS;
use crate::envoy_api::messages::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::transport::grpc::reload::LiveConfig;
use crate::transport::grpc::rlqs_pools::{Answers, Pools};
use crate::transport::shim::Shim;
use ratelimit_wire::{Check, Settlement};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::Status;

/// At most this many buckets per stream: each is kept for the stream's life.
pub const MAX_BUCKETS: usize = 10_000;
/// A bucket that reports no demand this long is abandoned (Envoy forgets it).
pub const ABANDON_IDLE_MS: u64 = 60_000;

const TTL_S: u64 = ASSIGNMENT_TTL_MS / 1000;

struct Tracked {
    /// The counter whose pool the bucket is in, when it is limited.
    counter: Option<String>,
    /// Server time (ms) of the last report with demand, or of the first report.
    last_demand_ms: u64,
}

/// A stream's state.
pub struct Session {
    shim: Arc<Shim>,
    config: Arc<LiveConfig>,
    pools: Arc<Pools>,
    stream: u64,
    answers: Answers,
    domain: Option<String>,
    buckets: HashMap<BucketKey, Tracked>,
}

/// Admissions a report brought, to charge to their counters.
pub type Charges = Vec<Settlement>;

impl Session {
    pub fn new(shim: Arc<Shim>, config: Arc<LiveConfig>, pools: Arc<Pools>, answers: Answers) -> Session {
        Session {
            shim,
            config,
            stream: pools.stream_id(),
            pools,
            answers,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// The assignments answering `reports`, and the admissions to charge; an error ends
    /// the stream (the client's fault).
    pub fn handle(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<(RateLimitQuotaResponse, Charges), Status> {
        let metrics = &self.shim.metrics.rlqs;
        metrics.report();
        match (&self.domain, reports.domain.as_str()) {
            (None, "") => return Err(Status::invalid_argument("domain: the first report must name it")),
            (None, domain) => self.domain = Some(domain.to_string()),
            (Some(ours), theirs) if !theirs.is_empty() && ours != theirs => {
                return Err(Status::invalid_argument(format!(
                    "domain: {theirs} on a stream opened for {ours} (open a new stream)"
                )))
            }
            _ => {}
        }
        let domain = self.domain.clone().unwrap_or_default();
        let now = now_ms();
        let mut actions = Vec::new();
        let mut charges = Vec::new();
        for usage in reports.bucket_quota_usages {
            let id = usage
                .bucket_id
                .ok_or_else(|| Status::invalid_argument("bucket_quota_usages: a bucket_id is required"))?;
            let key = bucket_key(&id.bucket).map_err(Status::invalid_argument)?;
            if !self.buckets.contains_key(&key) {
                if self.buckets.len() >= MAX_BUCKETS {
                    metrics.bucket_refused();
                    continue;
                }
                self.buckets.insert(
                    key.clone(),
                    Tracked {
                        counter: None,
                        last_demand_ms: now,
                    },
                );
            }
            let Some(tracked) = self.buckets.get_mut(&key) else {
                continue;
            };
            // The config's limit now (it may have been reloaded): a bucket whose counter
            // changed leaves the old pool, its Envoy's bucket replaced by this answer.
            let limit = bucket_limit(&self.config.current(), &domain, &key);
            let counter_now = match &limit {
                BucketLimit::Limited { counter, .. } => Some(counter.key.as_str()),
                _ => None,
            };
            if let Some(old) = tracked.counter.take_if(|old| Some(old.as_str()) != counter_now) {
                self.pools.leave(&old, self.stream, now, metrics);
            }
            let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
            metrics.reported(allowed, denied);
            let asked = allowed.saturating_add(denied);
            match &limit {
                BucketLimit::NoLimit | BucketLimit::Unlimited => {
                    metrics.assigned("allow_all");
                    actions.push(assignment::allow_all(&key, TTL_S));
                }
                BucketLimit::Shadow { counter, .. } => {
                    if allowed > 0 {
                        charges.push(charge(counter, allowed));
                    }
                    metrics.assigned("allow_all");
                    actions.push(assignment::allow_all(&key, TTL_S));
                }
                BucketLimit::Limited { counter, rule, .. } => {
                    if allowed > 0 {
                        charges.push(charge(counter, allowed));
                    }
                    if asked > 0 {
                        tracked.last_demand_ms = now;
                    } else if now.saturating_sub(tracked.last_demand_ms) >= ABANDON_IDLE_MS {
                        if tracked.counter.take().is_some() {
                            self.pools.leave(&counter.key, self.stream, now, metrics);
                        }
                        metrics.assigned("abandon");
                        actions.push(assignment::abandon(&key));
                        self.buckets.remove(&key);
                        continue;
                    }
                    // A report over less than a second is a bucket's first (Envoy reports a
                    // new bucket at once): its demand is not known yet.
                    let elapsed_s = usage.time_elapsed.map_or(0, |d| d.seconds);
                    let demand = (elapsed_s >= 1).then(|| asked as f64 / elapsed_s as f64);
                    tracked.counter = Some(counter.key.clone());
                    let share = self.pools.report(
                        &counter.key,
                        *rule,
                        self.stream,
                        &key,
                        &self.answers,
                        demand,
                        now,
                        metrics,
                    );
                    metrics.assigned("token_bucket");
                    actions.push(assignment::token_bucket(&key, &share, TTL_S));
                }
            }
        }
        Ok((
            RateLimitQuotaResponse {
                bucket_action: actions,
            },
            charges,
        ))
    }

    /// Charges what a report said was admitted; logged and counted when Redis failed.
    pub async fn charge(&self, charges: &Charges) {
        if charges.is_empty() {
            return;
        }
        let keys = self
            .shim
            .config
            .redis_keys(charges.iter().map(|charge| charge.key.as_str()));
        if let Err(error) = adjust_counters(&self.shim.store, &keys, &[], charges).await {
            self.shim.metrics.redis_error(error.kind());
            self.shim.metrics.rlqs.adjustment_lost();
            tracing::warn!(%error, "RLQS: charging reported admissions failed");
        }
    }

    /// The stream has ended: nothing is pushed to it any more (its answers end once the
    /// session is dropped too). Returns what [`Session::release`] needs.
    pub fn end(self) -> Ended {
        let counters: Vec<String> = self
            .buckets
            .values()
            .filter_map(|tracked| tracked.counter.clone())
            .collect();
        self.pools.disconnect(self.stream, &counters);
        Ended {
            shim: self.shim,
            pools: self.pools,
            counters,
        }
    }
}

/// An ended stream's places in its pools.
pub struct Ended {
    shim: Arc<Shim>,
    pools: Arc<Pools>,
    counters: Vec<String>,
}

impl Ended {
    /// Once its Envoy can no longer spend what it was assigned, its shares go to the
    /// other members of its pools.
    pub async fn release(self) {
        if self.counters.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(Pools::prune_after_ms())).await;
        self.pools
            .prune(&self.counters, now_ms(), &self.shim.metrics.rlqs);
    }
}

/// `tokens` reported admitted, charged now (into debt if need be).
fn charge(counter: &Check, tokens: u64) -> Settlement {
    Settlement {
        key: counter.key.clone(),
        algorithm: counter.algorithm,
        limit: counter.limit,
        period_ms: counter.period_ms,
        charged: 0,
        actual: tokens,
        stamp: 0,
        calendar: None,
    }
}
