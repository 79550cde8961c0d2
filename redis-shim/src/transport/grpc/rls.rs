//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC: the caller's
//! token (gRPC metadata `x-ratelimit-token`, as the HTTP endpoints take it), an in-flight
//! permit from the shim's bound, then the request planned ([`crate::decide::rls::plan`]) and its
//! checks decided by the shim's own path: all of them in one atomic script where their
//! keys share a slot, slot by slot with refunds on a cluster otherwise
//! ([`crate::decide::decision`]), counted and logged as `POST /v1/check` counts them.
//! With `--rls-upstream-counting`, each check is decided on its own instead, and one that
//! refuses is filled ([`RlsService::decide_apart`]).

use super::presented_token;
use crate::decide::answer::respond;
use crate::decide::clock::now_ms;
use crate::decide::decision;
use crate::decide::rls::plan::{plan, Plan, Planned};
use crate::decide::rls::response::answer;
use crate::decide::rls::settings::Settings;
use crate::envoy_api::messages::ratelimit::{Code, RateLimitRequest, RateLimitResponse};
use crate::metrics::rls::{CallOutcome, DescriptorOutcome};
use crate::store::scripts::Mode;
use crate::store::{check_group, Store, StoreError};
use crate::transport::admission::OVERLOADED;
use crate::transport::grpc::reload::LiveConfig;
use crate::transport::shim::Shim;
use ratelimit_wire::{Check, CheckRequest, CheckResult, TOKEN_HEADER};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The service: the shim's store, bounds and metrics, and the configuration (each call
/// decided by the one current when it arrives).
pub struct RlsService {
    pub shim: Arc<Shim>,
    pub config: Arc<LiveConfig>,
    pub settings: Settings,
}

impl RlsService {
    pub async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let rls = &self.shim.metrics.rls;
        if !self.shim.accepts_token(presented_token(request.metadata())) {
            rls.call(CallOutcome::Unauthorized);
            return Err(Status::unauthenticated(format!(
                "missing or wrong {TOKEN_HEADER}"
            )));
        }
        let Some(_permit) = self.shim.admission.try_admit() else {
            rls.call(CallOutcome::Overloaded);
            return Err(Status::resource_exhausted(OVERLOADED));
        };
        let _in_flight = self.shim.metrics.in_flight();
        let request = request.into_inner();
        let plan = plan(&self.config.current(), &request, &self.settings).map_err(|message| {
            rls.call(CallOutcome::Invalid);
            Status::invalid_argument(message)
        })?;
        let decided = if self.settings.upstream_counting {
            self.decide_apart(&plan).await
        } else {
            self.decide(&plan).await
        };
        let results = decided.inspect_err(|status| {
            let outcome = match status.code() {
                tonic::Code::InvalidArgument => CallOutcome::Invalid,
                _ => CallOutcome::RedisError,
            };
            rls.call(outcome);
        })?;
        let response = answer(&request, &plan, &results, now_ms(), &self.settings);
        for (planned, status) in plan.descriptors.iter().zip(&response.statuses) {
            let over = match planned {
                Planned::Counted { check, .. } => !results.get(*check).is_some_and(|r| r.allowed),
                Planned::Exceeds { .. } => true,
                _ => false,
            };
            debug_assert!(over || status.code == Code::Ok as i32);
            rls.descriptor(descriptor_outcome(planned, over, &self.settings));
        }
        rls.call(if response.overall_code == Code::OverLimit as i32 {
            CallOutcome::OverLimit
        } else {
            CallOutcome::Ok
        });
        Ok(Response::new(response))
    }
}

impl RlsService {
    /// The results of the plan's checks, one per check: decided (charged all or none), or
    /// only peeked at when a descriptor is over its limit before Redis is asked.
    async fn decide(&self, plan: &Plan) -> Result<Vec<CheckResult>, Status> {
        if plan.checks.is_empty() {
            return Ok(Vec::new());
        }
        let request = CheckRequest {
            checks: plan.checks.clone(),
        };
        request
            .validate()
            .map_err(|invalid| Status::invalid_argument(invalid.to_string()))?;
        let shim = &self.shim;
        let keys = shim
            .config
            .redis_keys(request.checks.iter().map(|check| check.key.as_str()));
        if plan.refused_beforehand() {
            return peek(&shim.store, &keys, &request.checks).await.map_err(|error| {
                shim.metrics.redis_error(error.kind());
                Status::unavailable(format!("redis: {error}"))
            });
        }
        let decision = decision::decide(&shim.store, &keys, &request.checks).await;
        match respond(&shim.metrics, &request, &keys, decision) {
            Ok(response) => Ok(response.results),
            Err(message) => Err(Status::unavailable(message)),
        }
    }
}

/// What an answered descriptor came to; `over` says whether its limit refused it.
fn descriptor_outcome(planned: &Planned, over: bool, settings: &Settings) -> DescriptorOutcome {
    match planned {
        Planned::NoLimit => DescriptorOutcome::NoLimit,
        Planned::Unlimited => DescriptorOutcome::Unlimited,
        Planned::Replaced => DescriptorOutcome::Replaced,
        Planned::Counted { limit, .. } | Planned::Exceeds { limit, .. } if over => {
            if limit.shadow_mode || settings.shadow_mode {
                DescriptorOutcome::ShadowOverLimit
            } else if limit.quota_mode {
                DescriptorOutcome::QuotaOverLimit
            } else {
                DescriptorOutcome::OverLimit
            }
        }
        Planned::Counted { .. } | Planned::Exceeds { .. } => DescriptorOutcome::Ok,
    }
}

impl RlsService {
    /// The results of the plan's checks as envoyproxy/ratelimit counts
    /// (`--rls-upstream-counting`): each check decided alone, so it is charged whatever
    /// the others answer; then each counter that refused (and each whose hits exceed its
    /// whole limit) is filled with what it has left, as upstream's counter, incremented
    /// past its limit, refuses the rest of its window.
    async fn decide_apart(&self, plan: &Plan) -> Result<Vec<CheckResult>, Status> {
        let mut results = Vec::with_capacity(plan.checks.len());
        for check in &plan.checks {
            results.extend(self.decide_one(check.clone()).await?);
        }
        let mut full: Vec<Check> = plan
            .checks
            .iter()
            .zip(&results)
            .filter(|(_, result)| !result.allowed)
            .map(|(check, _)| check.clone())
            .collect();
        full.extend(plan.descriptors.iter().filter_map(|planned| match planned {
            Planned::Exceeds { counter, .. } if counter.limit > 0 => Some(counter.clone()),
            _ => None,
        }));
        for counter in full {
            self.fill(counter).await?;
        }
        Ok(results)
    }

    /// One check decided as a request of its own.
    async fn decide_one(&self, check: Check) -> Result<Vec<CheckResult>, Status> {
        let request = CheckRequest { checks: vec![check] };
        request
            .validate()
            .map_err(|invalid| Status::invalid_argument(invalid.to_string()))?;
        let shim = &self.shim;
        let keys = shim
            .config
            .redis_keys(request.checks.iter().map(|check| check.key.as_str()));
        let decision = decision::decide(&shim.store, &keys, &request.checks).await;
        respond(&shim.metrics, &request, &keys, decision)
            .map(|response| response.results)
            .map_err(Status::unavailable)
    }

    /// Charges what `counter` has left: a race lost to another request leaves it full
    /// all the same.
    async fn fill(&self, counter: Check) -> Result<(), Status> {
        let shim = &self.shim;
        let keys = shim.config.redis_keys([counter.key.as_str()]);
        let left = peek(&shim.store, &keys, std::slice::from_ref(&counter))
            .await
            .map_err(|error| {
                shim.metrics.redis_error(error.kind());
                Status::unavailable(format!("redis: {error}"))
            })?;
        let remaining = left.first().map_or(0, |result| result.remaining);
        if remaining == 0 {
            return Ok(());
        }
        let fill = Check {
            cost: remaining.min(counter.limit),
            shadow: false,
            ..counter
        };
        self.decide_one(fill).await.map(drop)
    }
}

/// The state of every check's counter, charging nothing.
async fn peek<S: Store>(
    store: &S,
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<CheckResult>, StoreError> {
    let mut results = vec![CheckResult::default(); checks.len()];
    for group in store.group_by_slot(keys) {
        let rows = check_group(store, Mode::Peek, &group, keys, checks).await?;
        for (&i, row) in group.iter().zip(rows) {
            results[i] = row.result(&checks[i]);
        }
    }
    Ok(results)
}
