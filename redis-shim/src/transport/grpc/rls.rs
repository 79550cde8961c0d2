//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC: the caller's
//! token (gRPC metadata `x-ratelimit-token`, as the HTTP endpoints take it), an in-flight
//! permit from the shim's bound, then the request planned ([`crate::decide::rls::plan`]) and its
//! checks decided by the shim's own path: all of them in one atomic script where their
//! keys share a slot, slot by slot with refunds on a cluster otherwise
//! ([`crate::decide::decision`]), counted and logged as `POST /v1/check` counts them.

use super::presented_token;
use crate::decide::answer::respond;
use crate::decide::clock::now_ms;
use crate::decide::decision;
use crate::decide::rls::plan::{answer, plan, Plan, Planned};
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
        let plan = plan(&self.config.current(), &request).map_err(|message| {
            rls.call(CallOutcome::Invalid);
            Status::invalid_argument(message)
        })?;
        let results = self.decide(&plan).await.inspect_err(|status| {
            let outcome = match status.code() {
                tonic::Code::InvalidArgument => CallOutcome::Invalid,
                _ => CallOutcome::RedisError,
            };
            rls.call(outcome);
        })?;
        let response = answer(&plan, &results, now_ms());
        for (planned, status) in plan.descriptors.iter().zip(&response.statuses) {
            let over = match planned {
                Planned::Counted { check, .. } => !results.get(*check).is_some_and(|r| r.allowed),
                Planned::Exceeds { .. } => true,
                _ => false,
            };
            debug_assert!(over || status.code == Code::Ok as i32);
            rls.descriptor(descriptor_outcome(planned, over));
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
fn descriptor_outcome(planned: &Planned, over: bool) -> DescriptorOutcome {
    match planned {
        Planned::NoLimit => DescriptorOutcome::NoLimit,
        Planned::Unlimited => DescriptorOutcome::Unlimited,
        Planned::Replaced => DescriptorOutcome::Replaced,
        Planned::Counted { limit, .. } | Planned::Exceeds { limit } => match (over, limit.shadow_mode) {
            (false, _) => DescriptorOutcome::Ok,
            (true, false) => DescriptorOutcome::OverLimit,
            (true, true) => DescriptorOutcome::ShadowOverLimit,
        },
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
