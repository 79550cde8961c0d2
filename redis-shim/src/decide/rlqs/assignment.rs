//! The assignments the quota service sends, as Envoy's `rate_limit_quota` filter applies
//! them: a token bucket of this Envoy's [`Share`] of the rule's rate, which Envoy refills
//! and spends itself between reports, or a blanket rule. Envoy keeps its bucket when an
//! assignment repeats its `max_tokens`, `tokens_per_fill` and interval nanos; otherwise the
//! new bucket starts as full as the old one was, in proportion (full where there was none).

use crate::envoy_api::messages::protobuf::{Duration, UInt32Value};
use crate::envoy_api::messages::quota::{
    AbandonAction, Action, BlanketRule, BucketAction, BucketId, QuotaAssignmentAction, RateLimitStrategy,
    Strategy, TokenBucket,
};

use super::bucket::BucketKey;
use super::share::Share;

/// `share` as a token bucket, for `ttl_s` seconds.
pub fn token_bucket(bucket: &BucketKey, share: &Share, ttl_s: u64) -> BucketAction {
    let token_bucket = TokenBucket {
        max_tokens: share.max_tokens,
        tokens_per_fill: Some(UInt32Value {
            value: share.tokens_per_fill,
        }),
        fill_interval: Some(Duration {
            seconds: i64::try_from(share.fill_interval_s).unwrap_or(i64::MAX),
            nanos: share.interval_nanos(),
        }),
    };
    assign(bucket, Strategy::TokenBucket(token_bucket), ttl_s)
}

/// Every request allowed (no limit, `unlimited`, `shadow_mode`) for `ttl_s` seconds.
pub fn allow_all(bucket: &BucketKey, ttl_s: u64) -> BucketAction {
    assign(bucket, Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl_s)
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
    use crate::decide::rlqs::share::Rule;

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
    fn a_share_goes_out_as_a_whole_second_token_bucket() {
        let bucket = vec![("name".to_string(), "free".to_string())];
        let share = Rule {
            limit: 5,
            period_s: 1,
        }
        .share(30);
        let action = token_bucket(&bucket, &share, 12);
        assert_eq!(action.bucket_id.as_ref().unwrap().bucket["name"], "free");
        let (Strategy::TokenBucket(sent), ttl) = strategy(&action) else {
            panic!()
        };
        assert_eq!(ttl, 12);
        assert_eq!((sent.max_tokens, sent.tokens_per_fill.unwrap().value), (3, 30));
        let interval = sent.fill_interval.unwrap();
        assert_eq!((interval.seconds, interval.nanos), (12, 12));
        assert_eq!(strategy(&allow_all(&bucket, 5)), (Strategy::BlanketRule(0), 5));
        assert!(matches!(
            abandon(&bucket).bucket_action,
            Some(Action::AbandonAction(_))
        ));
    }
}
