//! One `StreamRateLimitQuotas` stream: its domain, the buckets its Envoy reported and
//! their accounts ([`Ledger`]), and what each report comes to in Redis: admissions no
//! grant covered charged as debt (first, so the grants see them), new grants charged
//! with the shim's lease check (all buckets of a report at once), and the assignments
//! answered. When the stream ends, [`Session::release`] gives back what its grants hold
//! once the Envoy can no longer spend it.

use crate::decide::adjustments::adjust_counters;
use crate::decide::answer::respond;
use crate::decide::clock::now_ms;
use crate::decide::decision;
use crate::decide::rlqs::assignment;
use crate::decide::rlqs::bucket::{bucket_key, bucket_limit, BucketKey, BucketLimit};
use crate::decide::rlqs::ledger::{Ledger, Next, ASSIGNMENT_TTL_MS, ENVOY_REPORT_INTERVAL_MS};
use crate::envoy_api::messages::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::transport::grpc::reload::LiveConfig;
use crate::transport::log_once::OncePerKey;
use crate::transport::shim::Shim;
use futures_util::future::join_all;
use ratelimit_wire::{Check, CheckRequest, CheckResult, Settlement, TokenReturn};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// At most this many buckets per stream: each is kept for the stream's life.
pub const MAX_BUCKETS: usize = 10_000;

const TTL_S: u64 = ASSIGNMENT_TTL_MS / 1000;

struct Tracked {
    limit: BucketLimit,
    ledger: Ledger,
}

/// A stream's state.
pub struct Session {
    shim: Arc<Shim>,
    config: Arc<LiveConfig>,
    domain: Option<String>,
    buckets: HashMap<BucketKey, Tracked>,
}

impl Session {
    pub fn new(shim: Arc<Shim>, config: Arc<LiveConfig>) -> Session {
        Session {
            shim,
            config,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// The assignments answering `reports`; an error ends the stream (the client's fault).
    pub async fn handle(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
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
        let mut debts: Vec<Settlement> = Vec::new();
        let mut wanted: Vec<(BucketKey, Check)> = Vec::new();
        let mut abandoned = Vec::new();
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
                let limit = bucket_limit(&self.config.current(), &domain, &key);
                warn_once_if_too_short(&limit);
                self.buckets.insert(
                    key.clone(),
                    Tracked {
                        limit,
                        ledger: Ledger::new(now),
                    },
                );
            }
            let Some(tracked) = self.buckets.get_mut(&key) else {
                continue;
            };
            let allowed = usage.num_requests_allowed;
            metrics.spent(allowed);
            match &tracked.limit {
                BucketLimit::NoLimit | BucketLimit::Unlimited => {
                    actions.push(assignment::allow_all(&key, TTL_S))
                }
                BucketLimit::Shadow { counter, .. } => {
                    if allowed > 0 {
                        debts.push(debt(counter, allowed));
                    }
                    actions.push(assignment::allow_all(&key, TTL_S));
                }
                BucketLimit::Limited {
                    counter, max_grant, ..
                } => {
                    let outcome = tracked
                        .ledger
                        .report(allowed, usage.num_requests_denied, *max_grant, now);
                    if outcome.debt > 0 {
                        metrics.debt(outcome.debt);
                        debts.push(debt(counter, outcome.debt));
                    }
                    match outcome.next {
                        Next::Extend { ttl_s } => {
                            tracked.ledger.extended(ttl_s, now);
                            if let Some(grant) = &tracked.ledger.grant {
                                actions.push(assignment::same_grant(&key, grant.tokens, ttl_s));
                            }
                        }
                        Next::Grant { size } => wanted.push((
                            key,
                            Check {
                                lease: size,
                                ..counter.clone()
                            },
                        )),
                        Next::Abandon => {
                            actions.push(assignment::abandon(&key));
                            abandoned.push(key);
                        }
                        Next::Wait => {}
                    }
                }
            }
        }
        if !debts.is_empty() {
            self.adjust(&[], &debts).await;
        }
        let granted = join_all(wanted.iter().map(|(_, check)| self.charge(check))).await;
        let mut give_back = Vec::new();
        for ((key, check), result) in wanted.into_iter().zip(granted) {
            let Some(result) = result else { continue };
            let Some(tracked) = self.buckets.get_mut(&key) else {
                continue;
            };
            if !result.allowed {
                // Until a report after the next brings a grant: a shorter refusal would
                // hand the bucket to Envoy's fallback (ALLOW_ALL by default) in between.
                actions.push(assignment::deny_all(&key, TTL_S));
                metrics.denied_all();
                continue;
            }
            match tracked
                .ledger
                .granted(result.granted, result.stamp, result.lease_window_ms, now)
            {
                0 => give_back.push(token_return(&check, result.granted, result.stamp)),
                ttl_s => {
                    metrics.granted(result.granted);
                    actions.extend(assignment::new_grant(&key, result.granted, ttl_s));
                }
            }
        }
        if !give_back.is_empty() {
            self.adjust(&give_back, &[]).await;
        }
        for key in abandoned {
            self.buckets.remove(&key);
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// After the stream has ended: waits until no Envoy can spend what the grants hold,
    /// then gives it back.
    pub async fn release(self) {
        let mut last_ms = 0;
        let mut returns = Vec::new();
        for tracked in self.buckets.values() {
            if let (BucketLimit::Limited { counter, .. }, Some((tokens, stamp, from_ms))) =
                (&tracked.limit, tracked.ledger.release())
            {
                returns.push(token_return(counter, tokens, stamp));
                last_ms = last_ms.max(from_ms);
            }
        }
        if returns.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(last_ms.saturating_sub(now_ms()))).await;
        let tokens: u64 = returns.iter().map(|back| back.amount).sum();
        if self.adjust(&returns, &[]).await {
            self.shim.metrics.rlqs.released(tokens);
        }
    }

    /// A grant of `check.lease` tokens (at least one), as the filter's lease is charged;
    /// None when Redis failed (counted and logged).
    async fn charge(&self, check: &Check) -> Option<CheckResult> {
        let request = CheckRequest {
            checks: vec![check.clone()],
        };
        let keys = self.shim.config.redis_keys([check.key.as_str()]);
        let decision = decision::decide(&self.shim.store, &keys, &request.checks).await;
        match respond(&self.shim.metrics, &request, &keys, decision) {
            Ok(response) => response.results.into_iter().next(),
            Err(message) => {
                tracing::warn!(error = %message, "RLQS: a grant failed; the bucket keeps its assignment until it expires");
                None
            }
        }
    }

    /// Gives back `returns` and charges `debts`; false (logged) when Redis failed.
    async fn adjust(&self, returns: &[TokenReturn], debts: &[Settlement]) -> bool {
        let keys = self.shim.config.redis_keys(
            returns
                .iter()
                .map(|back| back.key.as_str())
                .chain(debts.iter().map(|debt| debt.key.as_str())),
        );
        match adjust_counters(&self.shim.store, &keys, returns, debts).await {
            Ok(()) => true,
            Err(error) => {
                self.shim.metrics.redis_error(error.kind());
                self.shim.metrics.rlqs.adjustment_lost();
                tracing::warn!(%error, "RLQS: charging reported admissions or giving back grants failed");
                false
            }
        }
    }
}

/// A limit whose period is shorter than a few of Envoy's reports cannot be served through
/// grants: an Envoy gets at most one grant per report. Said once per limit, loudly.
fn warn_once_if_too_short(limit: &BucketLimit) {
    // Keys are limits of the configuration: the bound is only a backstop.
    static WARNED: OncePerKey = OncePerKey::new(4096);
    let BucketLimit::Limited { counter, path, .. } = limit else {
        return;
    };
    if counter.period_ms >= 12 * ENVOY_REPORT_INTERVAL_MS {
        return;
    }
    if WARNED.first(path) {
        tracing::warn!(
            limit = %path,
            "RLQS: Envoy reports every {} s, and gets at most one grant per report: a limit of a shorter period than a minute is served far below its rate (use the Wasm filter or the rate-limit service for it)",
            ENVOY_REPORT_INTERVAL_MS / 1000
        );
    }
}

/// `tokens` admitted beyond any grant, charged now (into debt if need be).
fn debt(counter: &Check, tokens: u64) -> Settlement {
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

fn token_return(counter: &Check, amount: u64, stamp: i64) -> TokenReturn {
    TokenReturn {
        key: counter.key.clone(),
        algorithm: counter.algorithm,
        limit: counter.limit,
        period_ms: counter.period_ms,
        amount,
        stamp,
        calendar: None,
    }
}
