//! What a decision is made of: each rule's part ([`Judged`]: its check and the result),
//! read by the refusal and by the rate-limit headers, and the headers a response gets.

use crate::config::Rule;
use crate::wire::{Check, CheckResult};

/// Headers to add to a response, as (lower-case name, value).
pub type Headers = Vec<(String, String)>;

/// One rule's part in this request's decision: the rule, the check made for it (whose
/// limit and period reflect the client's tier) and its result.
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    pub rule: &'a Rule,
    pub check: &'a Check,
    pub result: CheckResult,
}

/// A check and its results for the pure layers' tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::config::Rule;
    use crate::wire::{Check, CheckResult};

    /// The check a rule makes at its own rate, cost 1.
    pub(crate) fn check_for(rule: &Rule) -> Check {
        Check {
            key: format!("{}:{{k}}", rule.name),
            algorithm: rule.algorithm,
            limit: rule.rate.limit(),
            period_ms: rule.rate.period_ms(),
            cost: 1,
            shadow: rule.shadow,
            lease: 0,
            calendar: rule.calendar,
            regions: Default::default(),
        }
    }

    pub(crate) fn result(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_ms: u64,
        retry_after_ms: u64,
    ) -> CheckResult {
        CheckResult {
            allowed,
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            granted: u64::from(allowed),
            lease_window_ms: 0,
            stamp: 0,
        }
    }
}
