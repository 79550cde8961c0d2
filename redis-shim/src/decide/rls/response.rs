//! The answer to a planned `ShouldRateLimit` request ([`super::plan`]) from its checks'
//! results: per descriptor `OK`/`OVER_LIMIT`, `current_limit`, `limit_remaining` and
//! `duration_until_reset`; overall `OVER_LIMIT` as envoyproxy/ratelimit decides it
//! ([`refuses`]: an enforcing descriptor over its limit, or every quota-mode one), `OK`
//! in the service's shadow mode; and, with `--rls-response-metadata`, the dynamic
//! metadata ([`super::metadata`]).

use super::metadata::response_metadata;
use super::plan::{Applied, Plan, Planned};
use super::settings::Settings;
use crate::envoy_api::messages::protobuf::Duration as PbDuration;
use crate::envoy_api::messages::ratelimit::{Code, DescriptorStatus, RateLimitRequest, RateLimitResponse};
use ratelimit_wire::{Algorithm, CheckResult};

/// The answer to `request`, planned as `plan`, from `results` (one per check, in order)
/// at `now_ms` (Unix milliseconds, for the window end of descriptors Redis did not count).
pub fn answer(
    request: &RateLimitRequest,
    plan: &Plan,
    results: &[CheckResult],
    now_ms: u64,
    settings: &Settings,
) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = plan
        .descriptors
        .iter()
        .map(|planned| match planned {
            Planned::NoLimit | Planned::Replaced => status(Code::Ok, None, 0, None),
            Planned::Unlimited => status(Code::Ok, None, u32::MAX, None),
            Planned::Exceeds { limit, .. } => {
                let code = if limit.shadow_mode {
                    Code::Ok
                } else {
                    Code::OverLimit
                };
                let reset = window_end_ms(limit, now_ms);
                status(code, Some(limit), 0, Some(reset))
            }
            Planned::Counted { limit, check } => {
                let result = results.get(*check).copied().unwrap_or_default();
                let code = if result.allowed || limit.shadow_mode {
                    Code::Ok
                } else {
                    Code::OverLimit
                };
                let remaining = if result.allowed {
                    u32::try_from(result.remaining).unwrap_or(u32::MAX)
                } else {
                    0
                };
                // A fixed window resets when it ends, however little it holds (what
                // envoyproxy/ratelimit answers); Redis reports 0 for an empty one.
                let reset = match (result.reset_ms, limit.rate.algorithm) {
                    (0, Algorithm::FixedWindow) => window_end_ms(limit, now_ms),
                    (reset, _) => reset,
                };
                status(code, Some(limit), remaining, Some(reset))
            }
        })
        .collect();
    let refused = refuses(plan, &statuses, settings);
    let dynamic_metadata = settings.response_metadata.then(|| {
        let passed = plan.descriptors.iter().zip(&statuses).map(|(planned, status)| {
            let limit = match planned {
                Planned::Counted { limit, .. } | Planned::Exceeds { limit, .. } => Some(limit),
                _ => None,
            };
            limit
                .filter(|_| status.code == Code::Ok as i32)
                .and_then(|limit| limit.metadata.as_deref())
        });
        response_metadata(request, passed)
    });
    RateLimitResponse {
        // The service's shadow mode answers OK whatever the descriptors say.
        overall_code: if refused && !settings.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        dynamic_metadata,
    }
}

/// Whether the descriptors' `statuses` refuse the request, as envoyproxy/ratelimit
/// decides: any descriptor over its limit that is not in quota mode, or every
/// quota-mode descriptor over its limit (with the service's quota mode, every
/// descriptor is one, those without a limit included; an unlimited one never is).
pub fn refuses(plan: &Plan, statuses: &[DescriptorStatus], settings: &Settings) -> bool {
    let (mut quota, mut quota_over) = (0, 0);
    for (planned, status) in plan.descriptors.iter().zip(statuses) {
        let over = status.code == Code::OverLimit as i32;
        let quota_mode = match planned {
            Planned::Unlimited => continue,
            Planned::Counted { limit, .. } | Planned::Exceeds { limit, .. } => limit.quota_mode,
            Planned::NoLimit | Planned::Replaced => settings.quota_mode,
        };
        match (quota_mode, over) {
            (false, true) => return true,
            (false, false) => {}
            (true, over) => {
                quota += 1;
                quota_over += usize::from(over);
            }
        }
    }
    quota > 0 && quota == quota_over
}

/// Milliseconds until the epoch-aligned window holding `now_ms` ends (a token bucket:
/// its whole period).
fn window_end_ms(limit: &Applied, now_ms: u64) -> u64 {
    let period = limit.period_ms();
    match limit.rate.algorithm {
        Algorithm::FixedWindow => period - now_ms % period,
        _ => period,
    }
}

fn status(code: Code, limit: Option<&Applied>, remaining: u32, reset_ms: Option<u64>) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(Applied::current_limit),
        limit_remaining: remaining,
        duration_until_reset: reset_ms.map(|ms| PbDuration {
            seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
            nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::rls::config::RlsConfig;
    use crate::decide::rls::plan::plan;
    use crate::envoy_api::messages::protobuf::Kind;
    use crate::envoy_api::messages::ratelimit::{Entry, RateLimitDescriptor};

    const QUOTAS: &str = r#"
domain: edge
descriptors:
  - key: service
    value: one
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata: { quota: { name: one } }
  - key: service
    value: two
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
    metadata: { quota: { name: two } }
  - key: api_key
    rate_limit: { unit: minute, requests_per_unit: 5 }
"#;

    fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: entries
                .iter()
                .map(|(key, value)| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.to_string(),
                        value: value.to_string(),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    fn result(allowed: bool) -> CheckResult {
        CheckResult {
            allowed,
            remaining: u64::from(allowed),
            ..Default::default()
        }
    }

    /// The answer to `entries`, each counted descriptor allowed as `allowed` says.
    fn answered(entries: &[(&str, &str)], allowed: &[bool], settings: &Settings) -> RateLimitResponse {
        let config = RlsConfig::from_yaml(QUOTAS);
        let request = request(entries);
        let plan = plan(&config, &request, settings).unwrap();
        let results: Vec<CheckResult> = allowed.iter().map(|&a| result(a)).collect();
        assert_eq!(plan.checks.len(), results.len());
        answer(&request, &plan, &results, 0, settings)
    }

    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;

    #[test]
    fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
        let none = Settings::default();
        let both = [("service", "one"), ("service", "two")];
        let one_over = answered(&both, &[false, true], &none);
        assert_eq!(one_over.overall_code, OK);
        assert_eq!(one_over.statuses[0].code, OVER, "its own status stays over");
        assert_eq!(answered(&both, &[false, false], &none).overall_code, OVER);
        let with_key = [("service", "one"), ("api_key", "k")];
        assert_eq!(answered(&with_key, &[false, true], &none).overall_code, OVER);
        assert_eq!(
            answered(&with_key, &[true, false], &none).overall_code,
            OVER,
            "an enforcing descriptor over refuses"
        );
        let config = RlsConfig::from_yaml(QUOTAS);
        let planned = plan(&config, &request(&with_key), &none).unwrap();
        assert!(planned.checks[0].shadow && !planned.checks[1].shadow);
    }

    #[test]
    fn the_services_quota_mode_counts_every_descriptor_and_its_shadow_mode_refuses_none() {
        let quota = Settings {
            quota_mode: true,
            ..Default::default()
        };
        let with_key = [("service", "one"), ("api_key", "k")];
        assert_eq!(answered(&with_key, &[true, false], &quota).overall_code, OK);
        assert_eq!(answered(&with_key, &[false, false], &quota).overall_code, OVER);
        let unmatched = [("api_key", "k"), ("nothing", "x")];
        assert_eq!(
            answered(&unmatched, &[false], &quota).overall_code,
            OK,
            "a descriptor without a limit is a quota descriptor that passed"
        );
        let shadow = Settings {
            shadow_mode: true,
            ..Default::default()
        };
        let refused = answered(&[("api_key", "k")], &[false], &shadow);
        assert_eq!((refused.overall_code, refused.statuses[0].code), (OK, OVER));
        let config = RlsConfig::from_yaml(QUOTAS);
        let planned = plan(&config, &request(&[("api_key", "k")]), &shadow).unwrap();
        assert!(planned.checks[0].shadow, "charged only where it admits");
    }

    #[test]
    fn dynamic_metadata_holds_what_passed_only_when_asked() {
        let both = [("service", "one"), ("service", "two")];
        assert_eq!(
            answered(&both, &[true, true], &Settings::default()).dynamic_metadata,
            None
        );
        let asked = Settings {
            response_metadata: true,
            ..Default::default()
        };
        let metadata = answered(&both, &[false, true], &asked).dynamic_metadata.unwrap();
        let Some(Kind::StructValue(passed)) = &metadata.fields["metadata"].kind else {
            panic!("{metadata:?}")
        };
        let Some(Kind::StructValue(quota)) = &passed.fields["quota"].kind else {
            panic!()
        };
        assert_eq!(quota.fields["name"].kind, Some(Kind::StringValue("two".into())));
        let none = answered(&both, &[false, false], &asked).dynamic_metadata.unwrap();
        assert!(!none.fields.contains_key("metadata"));
        assert!(none.fields.contains_key("descriptors"));
    }
}
