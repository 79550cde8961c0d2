//! A batched call to the shim as the filter sees it: the body sent for the waiting
//! requests, the answer read back into one result per request, and everything that can
//! go wrong as a [`ShimFailure`]. Pure: the host layer sends the bytes and hands back the
//! call's status and body.

use crate::wire::{
    BatchAnswer, BatchCheckRequest, BatchCheckResponse, Check, CheckRequest, CheckResult, Settlement,
    TokenReturn, UnsupportedCheck,
};
use std::fmt;

/// Why the shim gave no usable answer for a request; each rule's failure mode decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimFailure {
    /// No answer within the timeout: Envoy answered the call with its own 504, or the
    /// request waited in the worker's queue past its deadline.
    Timeout,
    /// The call could not be made, or ended without a response (no healthy endpoint, a
    /// refused or reset connection).
    Unreachable(String),
    /// The shim, or Envoy on its behalf, answered with an error status.
    Status(String),
    /// An answer that cannot be read, or that does not match what was asked.
    BadAnswer(String),
    /// The shim could not decide this request (its Redis failed, it is overloaded...).
    Undecided(String),
    /// The plugin is going away (reconfigured or removed) with the call.
    ShuttingDown,
}

impl ShimFailure {
    /// Timeouts are counted apart from the other errors: they call for a longer timeout
    /// or a faster shim, not for a fix.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ShimFailure::Timeout)
    }
}

impl fmt::Display for ShimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShimFailure::Timeout => f.write_str("no answer within the timeout"),
            ShimFailure::Unreachable(reason) => write!(f, "unreachable: {reason}"),
            ShimFailure::Status(status) => write!(f, "status {status}"),
            ShimFailure::BadAnswer(reason) => write!(f, "bad answer: {reason}"),
            ShimFailure::Undecided(reason) => write!(f, "shim: {reason}"),
            ShimFailure::ShuttingDown => f.write_str("the plugin is shutting down"),
        }
    }
}

/// The body of one batched call: each request's checks, in order, leased tokens given
/// back and earlier requests settled at their real cost.
pub fn batch_body(
    requests: Vec<Vec<Check>>,
    returns: Vec<TokenReturn>,
    settlements: Vec<Settlement>,
) -> Result<Vec<u8>, ShimFailure> {
    let batch = BatchCheckRequest {
        requests: requests
            .into_iter()
            .map(|checks| CheckRequest { checks })
            .collect(),
        returns,
        settlements,
    };
    serde_json::to_vec(&batch).map_err(|e| ShimFailure::Unreachable(format!("cannot encode the checks: {e}")))
}

/// One request's results from a batch answer, or why it has none.
pub type RequestAnswer = Result<Answered, ShimFailure>;

/// A request the shim answered: one result per check asked, and the checks among them
/// it did not decide (an older shim that does not know one of their fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    pub results: Vec<CheckResult>,
    pub unsupported: Vec<UnsupportedCheck>,
}

impl Answered {
    /// Every check decided.
    pub fn decided(results: Vec<CheckResult>) -> Answered {
        Answered {
            results,
            unsupported: Vec::new(),
        }
    }
}

/// A batch answer as read: each request's, and the returns and settlements the shim did
/// not apply (`settlements[I]: FIELD`, fields it does not know).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRead {
    pub each: Vec<RequestAnswer>,
    pub not_applied: Vec<String>,
}

/// Reads the answer to a batch of `expected` requests from the call's `:status` (`None`
/// when the call got no response) and body.
pub fn read_batch_answer(
    status: Option<&str>,
    body: &[u8],
    expected: usize,
) -> Result<BatchRead, ShimFailure> {
    let status = status.ok_or_else(|| ShimFailure::Unreachable("no response".into()))?;
    match status {
        "200" => {}
        // Envoy answers a call that outlives its timeout with its own 504; the shim
        // itself never sends 504.
        "504" => return Err(ShimFailure::Timeout),
        // Envoy's answer for a refused or reset connection, or no healthy endpoint.
        "503" => return Err(ShimFailure::Unreachable("status 503".into())),
        other => return Err(ShimFailure::Status(other.into())),
    }
    let answer: BatchCheckResponse =
        serde_json::from_slice(body).map_err(|e| ShimFailure::BadAnswer(format!("unreadable: {e}")))?;
    if answer.responses.len() != expected {
        return Err(ShimFailure::BadAnswer(format!(
            "{} answers for {expected} requests",
            answer.responses.len()
        )));
    }
    let each = answer
        .responses
        .into_iter()
        .map(|answer| match answer {
            BatchAnswer::Decided(response) => Ok(Answered {
                results: response.results,
                unsupported: response.unsupported,
            }),
            BatchAnswer::Failed(reason) => Err(ShimFailure::Undecided(reason)),
        })
        .collect();
    Ok(BatchRead {
        each,
        not_applied: answer.unsupported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::CheckResponse;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn body(answers: Vec<BatchAnswer>) -> Vec<u8> {
        serde_json::to_vec(&BatchCheckResponse {
            responses: answers,
            unsupported: vec![],
        })
        .unwrap()
    }

    #[test]
    fn each_request_gets_its_own_answer_or_failure() {
        let decided = CheckResponse {
            allowed: true,
            results: vec![CheckResult {
                allowed: true,
                limit: 5,
                ..CheckResult::default()
            }],
            unsupported: vec![],
        };
        let answers = read_batch_answer(
            Some("200"),
            &body(vec![
                BatchAnswer::Decided(decided.clone()),
                BatchAnswer::Failed("redis: timed out".into()),
            ]),
            2,
        )
        .unwrap()
        .each;
        assert_eq!(
            answers,
            [
                Ok(Answered::decided(decided.results)),
                Err(ShimFailure::Undecided("redis: timed out".into()))
            ]
        );
    }

    #[test]
    fn what_an_older_shim_did_not_honour_is_read_per_check_and_per_adjustment() {
        // As a 0.2 shim answers a newer filter: check 1 set aside, a settlement skipped.
        let body = br#"{"responses":[{"decided":{"allowed":true,
            "results":[{"allowed":true,"limit":5,"remaining":4,"reset_ms":1,"retry_after_ms":0,"granted":1},
                       {"allowed":false,"limit":0,"remaining":0,"reset_ms":0,"retry_after_ms":0,"granted":0}],
            "unsupported":[{"position":1,"field":"priority"}]}}],
            "unsupported":["settlements[0]: epoch"]}"#;
        let read = read_batch_answer(Some("200"), body, 1).unwrap();
        let answered = read.each[0].clone().unwrap();
        assert_eq!(answered.results.len(), 2);
        assert_eq!(
            answered.unsupported,
            [UnsupportedCheck {
                position: 1,
                field: "priority".into()
            }]
        );
        assert_eq!(read.not_applied, ["settlements[0]: epoch"]);
        // A 0.1 shim's answer has neither list.
        let old = br#"{"responses":[{"decided":{"allowed":true,"results":[]}}]}"#;
        let read = read_batch_answer(Some("200"), old, 1).unwrap();
        assert_eq!(read.each, [Ok(Answered::decided(vec![]))]);
        assert!(read.not_applied.is_empty());
    }

    #[test]
    fn envoys_504_is_a_timeout_and_other_failures_are_errors() {
        assert_eq!(read_batch_answer(Some("504"), b"", 1), Err(ShimFailure::Timeout));
        assert!(ShimFailure::Timeout.is_timeout());
        for failure in [
            read_batch_answer(None, b"", 1),
            read_batch_answer(Some("503"), b"upstream connect error", 1),
            read_batch_answer(Some("401"), b"", 1),
            read_batch_answer(Some("200"), b"garbage", 1),
            read_batch_answer(Some("200"), &body(vec![]), 1),
        ] {
            let failure = failure.unwrap_err();
            assert!(!failure.is_timeout(), "{failure}");
        }
    }
}
