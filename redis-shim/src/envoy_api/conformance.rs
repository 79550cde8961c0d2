//! The shim's subset of Envoy's API against Envoy's own, as generated from its protos by the
//! `envoy-types` crate: what Envoy sends decodes field by field into the shim's messages,
//! what the shim sends decodes field by field into Envoy's, and every enum value agrees.

use super::messages::{protobuf, quota, ratelimit};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as envoy_descriptor;
use envoy_types::pb::envoy::r#type::v3 as envoy_type;
use envoy_types::pb::envoy::service::rate_limit_quota::v3 as envoy_quota;
use envoy_types::pb::envoy::service::ratelimit::v3 as envoy_ratelimit;
use envoy_types::pb::google::protobuf as envoy_protobuf;
use prost::Message;

fn reencode<From: Message, To: Message + Default>(message: &From) -> To {
    To::decode(message.encode_to_vec().as_slice()).expect("decodes")
}

#[test]
fn a_rate_limit_request_from_envoy_decodes_field_by_field() {
    use envoy_descriptor::rate_limit_descriptor::{Entry, RateLimitOverride};
    let sent = envoy_ratelimit::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![envoy_descriptor::RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "api_key".into(),
                    value: "k1".into(),
                },
                Entry {
                    key: "path".into(),
                    value: "/search".into(),
                },
            ],
            limit: Some(RateLimitOverride {
                requests_per_unit: 7,
                unit: envoy_type::RateLimitUnit::Hour as i32,
            }),
            hits_addend: Some(envoy_protobuf::UInt64Value { value: 5 }),
            is_negative_hits: true,
        }],
        hits_addend: 3,
    };
    let read: ratelimit::RateLimitRequest = reencode(&sent);
    assert_eq!((read.domain.as_str(), read.hits_addend), ("edge", 3));
    let descriptor = &read.descriptors[0];
    let entries: Vec<(&str, &str)> = descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(entries, [("api_key", "k1"), ("path", "/search")]);
    let limit = descriptor.limit.expect("the override");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (7, ratelimit::Unit::Hour as i32)
    );
    assert_eq!(descriptor.hits_addend, Some(protobuf::UInt64Value { value: 5 }));
    assert!(descriptor.is_negative_hits);
}

#[test]
fn a_rate_limit_response_reads_in_envoy_as_the_shim_wrote_it() {
    let sent = ratelimit::RateLimitResponse {
        overall_code: ratelimit::Code::OverLimit as i32,
        statuses: vec![
            ratelimit::DescriptorStatus {
                code: ratelimit::Code::OverLimit as i32,
                current_limit: Some(ratelimit::RateLimit {
                    name: "per-key".into(),
                    requests_per_unit: 10,
                    unit: ratelimit::Unit::Week as i32,
                }),
                limit_remaining: 4,
                duration_until_reset: Some(protobuf::Duration {
                    seconds: 2,
                    nanos: 500,
                }),
            },
            ratelimit::DescriptorStatus {
                code: ratelimit::Code::Ok as i32,
                ..Default::default()
            },
        ],
        dynamic_metadata: Some(metadata()),
    };
    let read: envoy_ratelimit::RateLimitResponse = reencode(&sent);
    let fields = read.dynamic_metadata.expect("the metadata").fields;
    use envoy_protobuf::value::Kind as EnvoyKind;
    assert_eq!(fields["domain"].kind, Some(EnvoyKind::StringValue("edge".into())));
    let Some(EnvoyKind::ListValue(list)) = &fields["descriptors"].kind else {
        panic!("{fields:?}")
    };
    assert_eq!(list.values[0].kind, Some(EnvoyKind::NumberValue(1.5)));
    assert_eq!(list.values[1].kind, Some(EnvoyKind::BoolValue(true)));
    assert_eq!(list.values[2].kind, Some(EnvoyKind::NullValue(0)));
    let Some(EnvoyKind::StructValue(nested)) = &fields["metadata"].kind else {
        panic!("{fields:?}")
    };
    assert_eq!(
        nested.fields["name"].kind,
        Some(EnvoyKind::StringValue("svc".into()))
    );
    use envoy_ratelimit::rate_limit_response::{rate_limit::Unit, Code};
    assert_eq!(read.overall_code, Code::OverLimit as i32);
    let status = &read.statuses[0];
    assert_eq!((status.code, status.limit_remaining), (Code::OverLimit as i32, 4));
    let limit = status.current_limit.as_ref().expect("the limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("per-key", 10, Unit::Week as i32)
    );
    let reset = status.duration_until_reset.expect("the reset");
    assert_eq!((reset.seconds, reset.nanos), (2, 500));
    assert_eq!(read.statuses[1].code, Code::Ok as i32);
    assert!(read.statuses[1].current_limit.is_none());
}

/// A Struct holding every kind of value.
fn metadata() -> protobuf::Struct {
    use protobuf::{Kind, ListValue, Struct, Value};
    let text = |s: &str| Value::of(Kind::StringValue(s.into()));
    let nested = Struct {
        fields: [("name".to_string(), text("svc"))].into(),
    };
    let list = ListValue {
        values: vec![
            Value::of(Kind::NumberValue(1.5)),
            Value::of(Kind::BoolValue(true)),
            Value::of(Kind::NullValue(0)),
        ],
    };
    Struct {
        fields: [
            ("domain".to_string(), text("edge")),
            ("descriptors".to_string(), Value::of(Kind::ListValue(list))),
            ("metadata".to_string(), Value::of(Kind::StructValue(nested))),
        ]
        .into(),
    }
}

#[test]
fn every_enum_value_is_envoys() {
    use envoy_ratelimit::rate_limit_response::{rate_limit::Unit, Code};
    use envoy_type::rate_limit_strategy::BlanketRule;
    let codes = [
        (ratelimit::Code::Unknown, Code::Unknown),
        (ratelimit::Code::Ok, Code::Ok),
        (ratelimit::Code::OverLimit, Code::OverLimit),
    ];
    for (ours, envoys) in codes {
        assert_eq!(ours as i32, envoys as i32, "{ours:?}");
    }
    let units = [
        (ratelimit::Unit::Unknown, Unit::Unknown),
        (ratelimit::Unit::Second, Unit::Second),
        (ratelimit::Unit::Minute, Unit::Minute),
        (ratelimit::Unit::Hour, Unit::Hour),
        (ratelimit::Unit::Day, Unit::Day),
        (ratelimit::Unit::Month, Unit::Month),
        (ratelimit::Unit::Year, Unit::Year),
        (ratelimit::Unit::Week, Unit::Week),
    ];
    for (ours, envoys) in units {
        assert_eq!(ours as i32, envoys as i32, "{ours:?}");
        // An override's unit (envoy.type.v3.RateLimitUnit) is numbered alike, without WEEK.
        if let Ok(override_unit) = envoy_type::RateLimitUnit::try_from(ours as i32) {
            assert_eq!(format!("{override_unit:?}"), format!("{ours:?}"));
        }
    }
    for (ours, envoys) in [
        (quota::BlanketRule::AllowAll, BlanketRule::AllowAll),
        (quota::BlanketRule::DenyAll, BlanketRule::DenyAll),
    ] {
        assert_eq!(ours as i32, envoys as i32, "{ours:?}");
    }
}

#[test]
fn a_usage_report_from_envoy_decodes_field_by_field() {
    use envoy_quota::rate_limit_quota_usage_reports::BucketQuotaUsage;
    let sent = envoy_quota::RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(envoy_quota::BucketId {
                bucket: [("name".to_string(), "per-key".to_string())].into(),
            }),
            time_elapsed: Some(envoy_protobuf::Duration { seconds: 5, nanos: 0 }),
            num_requests_allowed: 11,
            num_requests_denied: 2,
        }],
    };
    let read: quota::RateLimitQuotaUsageReports = reencode(&sent);
    assert_eq!(read.domain, "edge");
    let usage = &read.bucket_quota_usages[0];
    let bucket = &usage.bucket_id.as_ref().expect("the bucket").bucket;
    assert_eq!(bucket.get("name").map(String::as_str), Some("per-key"));
    assert_eq!((usage.num_requests_allowed, usage.num_requests_denied), (11, 2));
    assert_eq!(usage.time_elapsed.map(|d| d.seconds), Some(5));
}

#[test]
fn a_quota_response_reads_in_envoy_as_the_shim_wrote_it() {
    let bucket_id = quota::BucketId {
        bucket: [("name".to_string(), "per-key".to_string())].into(),
    };
    let assignment = |strategy| {
        Some(quota::Action::QuotaAssignmentAction(
            quota::QuotaAssignmentAction {
                assignment_time_to_live: Some(protobuf::Duration {
                    seconds: 12,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(quota::RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        ))
    };
    let token_bucket = quota::TokenBucket {
        max_tokens: 9,
        tokens_per_fill: Some(protobuf::UInt32Value { value: 1 }),
        fill_interval: Some(protobuf::Duration {
            seconds: 315_360_000,
            nanos: 0,
        }),
    };
    let sent = quota::RateLimitQuotaResponse {
        bucket_action: vec![
            quota::BucketAction {
                bucket_id: Some(bucket_id.clone()),
                bucket_action: assignment(quota::Strategy::BlanketRule(quota::BlanketRule::DenyAll as i32)),
            },
            quota::BucketAction {
                bucket_id: Some(bucket_id.clone()),
                bucket_action: assignment(quota::Strategy::TokenBucket(token_bucket)),
            },
            quota::BucketAction {
                bucket_id: Some(bucket_id),
                bucket_action: Some(quota::Action::AbandonAction(quota::AbandonAction {})),
            },
        ],
    };
    let read: envoy_quota::RateLimitQuotaResponse = reencode(&sent);
    use envoy_quota::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use envoy_type::rate_limit_strategy::{BlanketRule, Strategy};
    let strategy = |i: usize| {
        let action = &read.bucket_action[i];
        let id = action.bucket_id.as_ref().expect("the bucket id");
        assert_eq!(id.bucket.get("name").map(String::as_str), Some("per-key"));
        match &action.bucket_action {
            Some(Action::QuotaAssignmentAction(assignment)) => {
                let ttl = assignment.assignment_time_to_live.expect("the ttl");
                assert_eq!((ttl.seconds, ttl.nanos), (12, 0));
                assignment.rate_limit_strategy.and_then(|s| s.strategy)
            }
            other => panic!("not an assignment: {other:?}"),
        }
    };
    assert_eq!(
        strategy(0),
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
    );
    match strategy(1) {
        Some(Strategy::TokenBucket(bucket)) => {
            assert_eq!(bucket.max_tokens, 9);
            assert_eq!(bucket.tokens_per_fill.map(|t| t.value), Some(1));
            let fill = bucket.fill_interval.expect("the fill interval");
            assert_eq!((fill.seconds, fill.nanos), (315_360_000, 0));
        }
        other => panic!("not a token bucket: {other:?}"),
    }
    assert!(matches!(
        read.bucket_action[2].bucket_action,
        Some(Action::AbandonAction(_))
    ));
}
