//! The assignments the quota service sends, as Envoy's `rate_limit_quota` filter applies
//! them. A grant is a token bucket of `tokens` that does not refill: one token per
//! [`NO_REFILL_S`] (ten years), since a bucket must name a fill. Envoy (1.40) keeps its
//! bucket when an assignment repeats the configuration it has; when the configuration
//! changes, the new bucket starts as full as the old one was (in proportion), and full only
//! where there was no bucket. So a new grant goes out as two actions applied in order, a
//! blanket rule that drops the old bucket and the grant's own: it starts with its tokens.

use crate::envoy_api::messages::protobuf::{Duration, UInt32Value};
use crate::envoy_api::messages::quota::{
    AbandonAction, Action, BlanketRule, BucketAction, BucketId, QuotaAssignmentAction, RateLimitStrategy,
    Strategy, TokenBucket,
};

use super::bucket::BucketKey;

/// The fill interval of a grant's token bucket: about ten years.
pub const NO_REFILL_S: i64 = 315_360_000;

/// A new grant: a token bucket holding `tokens`, which does not refill, for `ttl_s`
/// seconds, whatever bucket the Envoy had before.
pub fn new_grant(bucket: &BucketKey, tokens: u64, ttl_s: u64) -> [BucketAction; 2] {
    [deny_all(bucket, ttl_s), same_grant(bucket, tokens, ttl_s)]
}

/// The grant the Envoy holds, again, for `ttl_s` seconds from now: it keeps its bucket.
pub fn same_grant(bucket: &BucketKey, tokens: u64, ttl_s: u64) -> BucketAction {
    let token_bucket = TokenBucket {
        max_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
        tokens_per_fill: Some(UInt32Value { value: 1 }),
        fill_interval: Some(Duration {
            seconds: NO_REFILL_S,
            nanos: 0,
        }),
    };
    assign(bucket, Strategy::TokenBucket(token_bucket), ttl_s)
}

/// Every request allowed (no limit, `unlimited`, `shadow_mode`) for `ttl_s` seconds.
pub fn allow_all(bucket: &BucketKey, ttl_s: u64) -> BucketAction {
    assign(bucket, Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl_s)
}

/// Every request refused (the counter is spent) for `ttl_s` seconds.
pub fn deny_all(bucket: &BucketKey, ttl_s: u64) -> BucketAction {
    assign(bucket, Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl_s)
}

/// Envoy forgets the bucket (and reports it no more) until a request matches it again.
pub fn abandon(bucket: &BucketKey) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(bucket)),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn assign(bucket: &BucketKey, strategy: Strategy, ttl_s: u64) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(bucket)),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(Duration {
                seconds: i64::try_from(ttl_s).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

fn bucket_id(bucket: &BucketKey) -> BucketId {
    BucketId {
        bucket: bucket.iter().cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(action: &BucketAction) -> (Strategy, i64) {
        match action.bucket_action.as_ref().unwrap() {
            Action::QuotaAssignmentAction(assignment) => (
                assignment.rate_limit_strategy.unwrap().strategy.unwrap(),
                assignment.assignment_time_to_live.unwrap().seconds,
            ),
            Action::AbandonAction(_) => panic!("abandoned"),
        }
    }

    #[test]
    fn a_new_grant_drops_the_old_bucket_first_and_a_repeated_one_keeps_it() {
        let bucket = vec![("name".to_string(), "free".to_string())];
        let [reset, first] = new_grant(&bucket, 5, 5);
        assert_eq!(strategy(&reset), (Strategy::BlanketRule(1), 5));
        assert_eq!(first.bucket_id.as_ref().unwrap().bucket["name"], "free");
        let (Strategy::TokenBucket(one), ttl) = strategy(&first) else {
            panic!()
        };
        assert_eq!(
            (one.max_tokens, one.tokens_per_fill.unwrap().value, ttl),
            (5, 1, 5)
        );
        assert_eq!(one.fill_interval.unwrap().seconds, NO_REFILL_S);
        let (Strategy::TokenBucket(again), ttl) = strategy(&same_grant(&bucket, 5, 3)) else {
            panic!()
        };
        assert_eq!((one, 3), (again, ttl));
        assert_eq!(strategy(&deny_all(&bucket, 2)), (Strategy::BlanketRule(1), 2));
        assert_eq!(strategy(&allow_all(&bucket, 5)), (Strategy::BlanketRule(0), 5));
        assert!(matches!(
            abandon(&bucket).bucket_action,
            Some(Action::AbandonAction(_))
        ));
    }
}
