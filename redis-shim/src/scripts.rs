//! The Lua scripts the shim runs, and the parsing of their replies.
//!
//! Each script lives in its own `.lua` file under `scripts/`, headed by its contract,
//! KEYS, ARGV and reply. `redis::Script` sends it with EVALSHA and loads it when Redis
//! answers NOSCRIPT (after a restart or `SCRIPT FLUSH`).

use ratelimit_wasm::wire::{Check, CheckResult};
use redis::Script;

/// The token bucket over every check of one request, all or nothing.
pub fn token_bucket() -> Script {
    Script::new(include_str!("../scripts/token_bucket.lua"))
}

/// Adds one check's key and arguments to an invocation, in the order the scripts expect.
pub fn add_check(invocation: &mut redis::ScriptInvocation<'_>, key: String, check: &Check) {
    invocation
        .key(key)
        .arg(check.limit)
        .arg(check.period_ms * 1000)
        .arg(check.cost);
}

/// The script's reply could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedReply(pub String);

/// Turns the script's `{allowed, remaining, reset_ms, retry_after_ms, granted}` rows into
/// results.
pub fn parse_reply(rows: Vec<Vec<i64>>, checks: &[Check]) -> Result<Vec<CheckResult>, MalformedReply> {
    if rows.len() != checks.len() {
        return Err(MalformedReply(format!(
            "{} rows for {} checks",
            rows.len(),
            checks.len()
        )));
    }
    rows.into_iter()
        .zip(checks)
        .map(|(row, check)| {
            let [allowed, remaining, reset_ms, retry_after_ms, granted] = row[..] else {
                return Err(MalformedReply(format!("row of {} values, expected 5", row.len())));
            };
            let non_negative = |value: i64| {
                u64::try_from(value).map_err(|_| MalformedReply(format!("negative value {value}")))
            };
            Ok(CheckResult {
                allowed: allowed == 1,
                limit: check.limit,
                remaining: non_negative(remaining)?.min(check.limit),
                reset_ms: non_negative(reset_ms)?,
                retry_after_ms: non_negative(retry_after_ms)?,
                granted: non_negative(granted)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_wasm::wire::Algorithm;

    fn check(limit: u64) -> Check {
        Check {
            key: "k".into(),
            algorithm: Algorithm::TokenBucket,
            limit,
            period_ms: 1000,
            cost: 1,
            shadow: false,
            lease: 0,
        }
    }

    #[test]
    fn parses_rows_in_order() {
        let results = parse_reply(
            vec![vec![1, 4, 200, 0, 1], vec![0, 0, 900, 150, 0]],
            &[check(5), check(2)],
        )
        .unwrap();
        assert_eq!(
            results,
            vec![
                CheckResult {
                    allowed: true,
                    limit: 5,
                    remaining: 4,
                    reset_ms: 200,
                    retry_after_ms: 0,
                    granted: 1
                },
                CheckResult {
                    allowed: false,
                    limit: 2,
                    remaining: 0,
                    reset_ms: 900,
                    retry_after_ms: 150,
                    granted: 0
                },
            ]
        );
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(parse_reply(vec![], &[check(5)]).is_err());
        assert!(parse_reply(vec![vec![1, 2, 3]], &[check(5)]).is_err());
        assert!(parse_reply(vec![vec![1, -2, 3, 0, 0]], &[check(5)]).is_err());
    }
}
