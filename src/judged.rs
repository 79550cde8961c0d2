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
