//! One batched call to the shim, from the dispatcher's side: what it sends (headers and
//! body, for its requests and the adjustments it carries), and what each request it
//! carried gets back (the shim's answer, or the call's failure). Encoding and reading
//! the wire format is `crate::shim_call`'s; the host only makes the call.

use super::adjustments::Carried;
use super::queued::QueuedRequest;
use crate::batch::Batch;
use crate::config::ShimSettings;
use crate::shim_call::{batch_body, RequestAnswer, ShimFailure};
use crate::wire::{CHECK_BATCH_PATH, TOKEN_HEADER, VERSION, VERSION_HEADER};
use std::fmt::Display;

/// A call ready to be made.
pub struct OutgoingCall<H> {
    /// The requests it carries, in the order of their answers.
    pub requests: Vec<QueuedRequest<H>>,
    pub timeout_ms: u64,
    /// Its body, or why none could be encoded (the call then fails like a refused one).
    pub body: Result<Vec<u8>, ShimFailure>,
    /// How many returns and settlements it carries: lost if it fails.
    pub adjustments: usize,
}

impl<H> OutgoingCall<H> {
    /// The call for `batch`, carrying `carried`; the requests' checks move into the body.
    pub fn new(batch: Batch<QueuedRequest<H>>, carried: Carried) -> OutgoingCall<H> {
        let Batch {
            members: mut requests,
            timeout_ms,
        } = batch;
        let adjustments = carried.count();
        let body = batch_body(
            requests
                .iter_mut()
                .map(|request| std::mem::take(&mut request.checks))
                .collect(),
            carried.returns,
            carried.settlements,
        );
        OutgoingCall {
            requests,
            timeout_ms,
            body,
            adjustments,
        }
    }
}

/// The headers of every call to the shim's batch endpoint.
pub fn call_headers(shim: &ShimSettings) -> Vec<(&str, &str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", CHECK_BATCH_PATH),
        (":authority", shim.authority.as_str()),
        ("content-type", "application/json"),
        // What this filter may send and read (wire/src/version.rs); a shim of 0.1
        // ignores it.
        (VERSION_HEADER, VERSION),
    ];
    if let Some(token) = &shim.token {
        headers.push((TOKEN_HEADER, token.as_str()));
    }
    headers
}

/// What each request of a call gets, in the call's order.
#[derive(Debug, PartialEq, Eq)]
pub struct CallAnswers {
    pub each: Vec<RequestAnswer>,
    /// The call failed whole: the returns and settlements it carried are lost.
    pub adjustments_lost: bool,
}

/// Each of `requests` requests' answer from the call's outcome: its own when the shim
/// answered, else the call's failure for every one.
pub fn answers_per_request(outcome: Result<Vec<RequestAnswer>, ShimFailure>, requests: usize) -> CallAnswers {
    match outcome {
        Ok(each) => CallAnswers {
            each,
            adjustments_lost: false,
        },
        Err(failure) => CallAnswers {
            each: vec![Err(failure); requests],
            adjustments_lost: true,
        },
    }
}

/// Why Envoy refused to start a call to `cluster`: `unknown_cluster` when the host said
/// the cluster is not defined, a configuration mistake worth naming as such.
pub fn refusal_reason(cluster: &str, unknown_cluster: bool, error: &dyn Display) -> String {
    if unknown_cluster {
        format!("no cluster named {cluster:?} in this Envoy (shim_cluster)")
    } else {
        format!("cannot call cluster {cluster:?}: {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim_call::Answered;
    use crate::wire::{Algorithm, BatchCheckRequest, Check, CheckResult, TokenReturn};
    use std::time::Duration;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn shim(token: Option<&str>) -> ShimSettings {
        ShimSettings {
            cluster: "ratelimit_shim".into(),
            authority: "shim.local".into(),
            token: token.map(String::from),
            timeout: Duration::from_millis(250),
            calls_in_flight: 2,
        }
    }

    fn check(key: &str) -> Check {
        Check {
            key: key.into(),
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            period_ms: 60_000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
            regions: Default::default(),
        }
    }

    fn queued(request: u32, keys: &[&str]) -> QueuedRequest<u32> {
        QueuedRequest {
            request,
            checks: keys.iter().map(|key| check(key)).collect(),
            claims: Vec::new(),
            slots: Vec::new(),
            queued_at_us: 0,
        }
    }

    #[test]
    fn the_body_carries_each_requests_checks_in_order_and_the_adjustments() {
        let back = TokenReturn {
            key: "leased".into(),
            algorithm: Algorithm::TokenBucket,
            limit: 100,
            period_ms: 1_000,
            amount: 3,
            stamp: 0,
            calendar: None,
        };
        let batch = Batch {
            members: vec![queued(1, &["a", "b"]), queued(2, &["c"])],
            timeout_ms: 80,
        };
        let carried = Carried {
            returns: vec![back.clone()],
            settlements: Vec::new(),
        };
        let call = OutgoingCall::new(batch, carried);
        assert_eq!((call.timeout_ms, call.adjustments), (80, 1));
        let ids: Vec<u32> = call.requests.iter().map(|r| r.request).collect();
        assert_eq!(ids, vec![1, 2]);
        assert!(
            call.requests.iter().all(|r| r.checks.is_empty()),
            "moved into the body"
        );
        let sent: BatchCheckRequest = serde_json::from_slice(&call.body.unwrap()).unwrap();
        let keys: Vec<Vec<&str>> = sent
            .requests
            .iter()
            .map(|request| request.checks.iter().map(|c| c.key.as_str()).collect())
            .collect();
        assert_eq!(keys, vec![vec!["a", "b"], vec!["c"]]);
        assert_eq!(sent.returns, vec![back]);
    }

    #[test]
    fn a_call_of_adjustments_alone_has_no_requests() {
        let batch = Batch {
            members: Vec::<QueuedRequest<u32>>::new(),
            timeout_ms: 250,
        };
        let call = OutgoingCall::new(batch, Carried::default());
        let sent: BatchCheckRequest = serde_json::from_slice(&call.body.unwrap()).unwrap();
        assert!(sent.requests.is_empty() && call.requests.is_empty());
    }

    #[test]
    fn the_token_header_is_sent_only_when_configured() {
        assert_eq!(
            call_headers(&shim(None)),
            vec![
                (":method", "POST"),
                (":path", CHECK_BATCH_PATH),
                (":authority", "shim.local"),
                ("content-type", "application/json"),
                (VERSION_HEADER, VERSION),
            ]
        );
        let shim = shim(Some("s3cret"));
        let with_token = call_headers(&shim);
        assert_eq!(with_token.last(), Some(&(TOKEN_HEADER, "s3cret")));
        assert_eq!(with_token.len(), 6);
    }

    #[test]
    fn an_answered_call_gives_each_request_its_own_answer() {
        let outcome = Ok(vec![
            Ok(Answered::decided(vec![CheckResult::default()])),
            Err(ShimFailure::Undecided("redis down".into())),
        ]);
        let answers = answers_per_request(outcome, 2);
        assert!(!answers.adjustments_lost);
        assert_eq!(
            answers.each,
            vec![
                Ok(Answered::decided(vec![CheckResult::default()])),
                Err(ShimFailure::Undecided("redis down".into())),
            ]
        );
    }

    #[test]
    fn a_failed_call_fails_every_request_and_loses_its_adjustments() {
        let answers = answers_per_request(Err(ShimFailure::Timeout), 3);
        assert!(answers.adjustments_lost);
        assert_eq!(answers.each, vec![Err(ShimFailure::Timeout); 3]);
        let alone = answers_per_request(Err(ShimFailure::Timeout), 0);
        assert!(
            alone.adjustments_lost && alone.each.is_empty(),
            "a call of adjustments alone"
        );
    }

    #[test]
    fn an_undefined_cluster_is_named_as_a_configuration_mistake() {
        assert_eq!(
            refusal_reason("shim", true, &"BadArgument"),
            "no cluster named \"shim\" in this Envoy (shim_cluster)"
        );
        assert_eq!(
            refusal_reason("shim", false, &"InternalFailure"),
            "cannot call cluster \"shim\": InternalFailure"
        );
    }
}
