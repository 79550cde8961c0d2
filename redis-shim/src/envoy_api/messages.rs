//! The messages of Envoy's rate-limit service (`envoy.service.ratelimit.v3`) and quota
//! service (`envoy.service.rate_limit_quota.v3`) that the shim reads and writes, declared
//! with their protobuf field numbers. Only the fields the shim uses are declared: protobuf
//! skips the others when decoding, and the shim never sets them. The field numbers are
//! checked against the `envoy-types` crate (Envoy's API generated from its protos) by the
//! tests in [`super::conformance`], so this is a subset of Envoy's API, not a copy of it:
//! the whole generated API took a third of the shim's build.

/// `google.protobuf`: the well-known types the services use.
pub mod protobuf {
    #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
    pub struct Duration {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }

    #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
    pub struct UInt32Value {
        #[prost(uint32, tag = "1")]
        pub value: u32,
    }

    #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
    pub struct UInt64Value {
        #[prost(uint64, tag = "1")]
        pub value: u64,
    }

    /// `google.protobuf.Struct`: a JSON object, as a response's dynamic metadata.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Struct {
        #[prost(btree_map = "string, message", tag = "1")]
        pub fields: std::collections::BTreeMap<String, Value>,
    }

    /// `google.protobuf.Value`: one JSON value.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Value {
        #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
        pub kind: Option<Kind>,
    }

    /// The `kind` oneof of a [`Value`]; `NullValue` has the one value 0.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Kind {
        #[prost(int32, tag = "1")]
        NullValue(i32),
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
        #[prost(message, tag = "5")]
        StructValue(Struct),
        #[prost(message, tag = "6")]
        ListValue(ListValue),
    }

    /// `google.protobuf.ListValue`: a JSON array.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct ListValue {
        #[prost(message, repeated, tag = "1")]
        pub values: Vec<Value>,
    }

    impl Value {
        pub fn of(kind: Kind) -> Value {
            Value { kind: Some(kind) }
        }
    }
}

/// `envoy.service.ratelimit.v3` with the descriptor of
/// `envoy.extensions.common.ratelimit.v3`.
pub mod ratelimit {
    use super::protobuf::{Duration, Struct, UInt64Value};

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RateLimitRequest {
        #[prost(string, tag = "1")]
        pub domain: String,
        #[prost(message, repeated, tag = "2")]
        pub descriptors: Vec<RateLimitDescriptor>,
        #[prost(uint32, tag = "3")]
        pub hits_addend: u32,
    }

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RateLimitDescriptor {
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<Entry>,
        #[prost(message, optional, tag = "2")]
        pub limit: Option<RateLimitOverride>,
        #[prost(message, optional, tag = "3")]
        pub hits_addend: Option<UInt64Value>,
        #[prost(bool, tag = "4")]
        pub is_negative_hits: bool,
    }

    /// `RateLimitDescriptor.Entry`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct Entry {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `RateLimitDescriptor.RateLimitOverride`: its unit is an `envoy.type.v3.RateLimitUnit`,
    /// numbered as [`Unit`] but without `WEEK`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct RateLimitOverride {
        #[prost(uint32, tag = "1")]
        pub requests_per_unit: u32,
        #[prost(int32, tag = "2")]
        pub unit: i32,
    }

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RateLimitResponse {
        #[prost(enumeration = "Code", tag = "1")]
        pub overall_code: i32,
        #[prost(message, repeated, tag = "2")]
        pub statuses: Vec<DescriptorStatus>,
        /// Set with `--rls-response-metadata` (upstream's RESPONSE_DYNAMIC_METADATA): Envoy
        /// stores it as the filter's dynamic metadata (`envoy.filters.http.ratelimit`).
        #[prost(message, optional, tag = "6")]
        pub dynamic_metadata: Option<Struct>,
    }

    /// `RateLimitResponse.Code`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum Code {
        Unknown = 0,
        Ok = 1,
        OverLimit = 2,
    }

    /// `RateLimitResponse.DescriptorStatus`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct DescriptorStatus {
        #[prost(enumeration = "Code", tag = "1")]
        pub code: i32,
        #[prost(message, optional, tag = "2")]
        pub current_limit: Option<RateLimit>,
        #[prost(uint32, tag = "3")]
        pub limit_remaining: u32,
        #[prost(message, optional, tag = "4")]
        pub duration_until_reset: Option<Duration>,
    }

    /// `RateLimitResponse.RateLimit`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RateLimit {
        #[prost(string, tag = "3")]
        pub name: String,
        #[prost(uint32, tag = "1")]
        pub requests_per_unit: u32,
        #[prost(enumeration = "Unit", tag = "2")]
        pub unit: i32,
    }

    /// `RateLimitResponse.RateLimit.Unit`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum Unit {
        Unknown = 0,
        Second = 1,
        Minute = 2,
        Hour = 3,
        Day = 4,
        Month = 5,
        Year = 6,
        Week = 7,
    }
}

/// `envoy.service.rate_limit_quota.v3` with the strategies of `envoy.type.v3`.
pub mod quota {
    use super::protobuf::{Duration, UInt32Value};
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RateLimitQuotaUsageReports {
        #[prost(string, tag = "1")]
        pub domain: String,
        #[prost(message, repeated, tag = "2")]
        pub bucket_quota_usages: Vec<BucketQuotaUsage>,
    }

    /// `RateLimitQuotaUsageReports.BucketQuotaUsage`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct BucketQuotaUsage {
        #[prost(message, optional, tag = "1")]
        pub bucket_id: Option<BucketId>,
        /// Since the bucket's last report (0 in the report of a new bucket).
        #[prost(message, optional, tag = "2")]
        pub time_elapsed: Option<Duration>,
        #[prost(uint64, tag = "3")]
        pub num_requests_allowed: u64,
        #[prost(uint64, tag = "4")]
        pub num_requests_denied: u64,
    }

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct BucketId {
        #[prost(map = "string, string", tag = "1")]
        pub bucket: HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct RateLimitQuotaResponse {
        #[prost(message, repeated, tag = "1")]
        pub bucket_action: Vec<BucketAction>,
    }

    /// `RateLimitQuotaResponse.BucketAction`.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct BucketAction {
        #[prost(message, optional, tag = "1")]
        pub bucket_id: Option<BucketId>,
        #[prost(oneof = "Action", tags = "2, 3")]
        pub bucket_action: Option<Action>,
    }

    /// The `bucket_action` oneof of a `BucketAction`.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Action {
        #[prost(message, tag = "2")]
        QuotaAssignmentAction(QuotaAssignmentAction),
        #[prost(message, tag = "3")]
        AbandonAction(AbandonAction),
    }

    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct QuotaAssignmentAction {
        #[prost(message, optional, tag = "2")]
        pub assignment_time_to_live: Option<Duration>,
        #[prost(message, optional, tag = "3")]
        pub rate_limit_strategy: Option<RateLimitStrategy>,
    }

    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct AbandonAction {}

    /// `envoy.type.v3.RateLimitStrategy`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct RateLimitStrategy {
        #[prost(oneof = "Strategy", tags = "1, 3")]
        pub strategy: Option<Strategy>,
    }

    /// The `strategy` oneof of a `RateLimitStrategy` (the shim never sends its
    /// `requests_per_time_unit`, field 2).
    #[derive(Clone, Copy, PartialEq, ::prost::Oneof)]
    pub enum Strategy {
        #[prost(enumeration = "BlanketRule", tag = "1")]
        BlanketRule(i32),
        #[prost(message, tag = "3")]
        TokenBucket(TokenBucket),
    }

    /// `envoy.type.v3.RateLimitStrategy.BlanketRule`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ::prost::Enumeration)]
    #[repr(i32)]
    pub enum BlanketRule {
        AllowAll = 0,
        DenyAll = 1,
    }

    /// `envoy.type.v3.TokenBucket`.
    #[derive(Clone, Copy, PartialEq, ::prost::Message)]
    pub struct TokenBucket {
        #[prost(uint32, tag = "1")]
        pub max_tokens: u32,
        #[prost(message, optional, tag = "2")]
        pub tokens_per_fill: Option<UInt32Value>,
        #[prost(message, optional, tag = "3")]
        pub fill_interval: Option<Duration>,
    }
}
