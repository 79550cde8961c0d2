//! `POST /v1/check-batch`: several requests' checks (see [`BatchCheckRequest`]), each
//! its own atomic decision, so one call carries what a worker of the filter queued. Each
//! request is decided, answered and counted in the metrics as if it had come alone to
//! `POST /v1/check` ([`crate::transport::http::check`]), in as few scripts as their keys allow.

use super::check::{answer_outcome, decide_alone, redis_failed, validate};
use crate::decide::adjustments::adjust_counters;
use crate::decide::answer::respond;
use crate::decide::decision::{self, DecideError, Decision};
use crate::decide::regions::{crosses_regions, note_without_peers};
use crate::metrics::RequestOutcome;
use crate::store::cluster_nodes::moved_away;
use crate::store::scripts::RequestChecks;
use crate::store::{SharedScript, Store, StoreError};
use crate::transport::admission::OVERLOADED;
use crate::transport::http::endpoint::{error, Admitted, Refusal, Reply};
use crate::transport::log_once::OncePerKey;
use crate::transport::shim::Shim;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use futures_util::future::join_all;
use ratelimit_wire::tolerant::{self, TolerantBatch};
use ratelimit_wire::{
    BatchAnswer, BatchCheckRequest, BatchCheckResponse, CheckRequest, CheckResponse, CheckResult,
    UnsupportedCheck, WireVersion, VERSION_HEADER,
};

pub async fn check_batch(mut request: Admitted) -> Reply {
    let parsed = read_batch(&request.body, request.stated_version.as_ref()).and_then(|parsed| {
        parsed
            .batch
            .validate()
            .map(|()| parsed)
            .map_err(|e| e.to_string())
    });
    let TolerantBatch {
        batch,
        unsupported,
        skipped,
    } = match parsed {
        Ok(parsed) => parsed,
        Err(message) => {
            return Reply::counted(
                error(StatusCode::BAD_REQUEST, message),
                vec![RequestOutcome::Invalid],
            )
        }
    };
    // A handle of its own, so the request's permit can be extended while it is in use.
    let shim = request.shim.clone();
    // Tokens given back and costs settled first, so the requests of this batch see them.
    if !batch.returns.is_empty() || !batch.settlements.is_empty() {
        let keys = shim.config.redis_keys(
            batch
                .returns
                .iter()
                .map(|back| back.key.as_str())
                .chain(batch.settlements.iter().map(|settled| settled.key.as_str())),
        );
        if let Err(error) = adjust_counters(&shim.store, &keys, &batch.returns, &batch.settlements).await {
            tracing::warn!(%error, keys = ?keys, "returning unspent tokens or settling real costs failed");
        }
    }
    // The requests that find no permit are refused one by one, as if each had come
    // alone, so a bound below the batch size still decides what it can.
    let admitted_count = request.admit_more(batch.requests.len()).min(batch.requests.len());
    let (admitted, refused) = batch.requests.split_at(admitted_count);
    let decided = decide_batch(&shim, admitted).await;
    for field in unsupported
        .iter()
        .flatten()
        .map(|check| check.field.as_str())
        .chain(skipped.iter().map(String::as_str))
    {
        log_unsupported_once(field);
    }
    let mut outcomes = Vec::with_capacity(batch.requests.len());
    let mut responses: Vec<BatchAnswer> = decided
        .into_iter()
        .zip(admitted.iter().zip(unsupported))
        .map(|(decision, (request, unsupported))| with_unsupported(decision, request, unsupported))
        .map(|decision| match decision {
            Ok(answer) => {
                outcomes.push(answer_outcome(&answer));
                BatchAnswer::Decided(answer)
            }
            Err(refusal) => {
                outcomes.push(refusal.outcome);
                BatchAnswer::Failed(refusal.message)
            }
        })
        .collect();
    for _ in refused {
        outcomes.push(RequestOutcome::Overloaded);
        responses.push(BatchAnswer::Failed(OVERLOADED.into()));
    }
    let answer = BatchCheckResponse {
        responses,
        unsupported: skipped,
    };
    Reply::counted(Json(answer).into_response(), outcomes)
}

/// The batch as the caller's stated version reads: without a version (a 0.1 filter, or
/// any other client) every unknown field refuses the batch, as 0.1 did; from a filter
/// within one minor version, checks, returns and settlements with fields this release
/// does not know are set aside ([`tolerant`]); outside that, the batch is refused.
fn read_batch(body: &[u8], stated: Option<&HeaderValue>) -> Result<TolerantBatch, String> {
    let Some(stated) = stated else {
        let batch: BatchCheckRequest =
            serde_json::from_slice(body).map_err(|e| format!("invalid batch: {e}"))?;
        let unsupported = vec![Vec::new(); batch.requests.len()];
        return Ok(TolerantBatch {
            batch,
            unsupported,
            skipped: Vec::new(),
        });
    };
    let ours = WireVersion::ours();
    let filter = stated
        .to_str()
        .ok()
        .and_then(WireVersion::parse)
        .ok_or_else(|| format!("{VERSION_HEADER}: not a version (MAJOR.MINOR.PATCH)"))?;
    if !ours.serves(filter) {
        return Err(format!(
            "{VERSION_HEADER}: a filter of {filter} is not served by this shim of {ours} (it serves one minor version either side)"
        ));
    }
    tolerant::parse_batch(body).map_err(|e| e.to_string())
}

/// A request's answer with the checks set aside put back in their places, as
/// placeholders named in `unsupported`. A request whose every check was set aside was
/// refused as empty; it is answered with placeholders alone, nothing charged.
fn with_unsupported(
    decision: Result<CheckResponse, Refusal>,
    request: &CheckRequest,
    unsupported: Vec<UnsupportedCheck>,
) -> Result<CheckResponse, Refusal> {
    if unsupported.is_empty() {
        return decision;
    }
    let mut answer = match decision {
        Ok(answer) => answer,
        Err(_) if request.checks.is_empty() => CheckResponse {
            allowed: true,
            results: Vec::new(),
            unsupported: Vec::new(),
        },
        Err(refusal) => return Err(refusal),
    };
    for check in &unsupported {
        let at = check.position.min(answer.results.len());
        answer.results.insert(at, CheckResult::default());
    }
    answer.unsupported = unsupported;
    Ok(answer)
}

/// Most distinct unsupported fields logged; a caller sending endless new names cannot
/// grow the shim's memory or its log.
const LOGGED_FIELDS: usize = 64;

/// Logs each unsupported field the first time a filter sends it.
fn log_unsupported_once(field: &str) {
    static LOGGED: OncePerKey = OncePerKey::new(LOGGED_FIELDS);
    if LOGGED.first(field) {
        tracing::warn!(
            field,
            "a filter sent a field this shim does not know: not honoured, answered as not supported (upgrade the shim)"
        );
    }
}

/// A batch's requests, each validated, decided all or nothing on its own, counted and
/// logged as `POST /v1/check` does it alone, in as few scripts as their keys allow: on
/// a standalone Redis one for the whole batch; on a cluster one per master for the
/// requests whose keys all lie on it, and slot by slot for each request whose keys span
/// masters.
/// One script for ten requests costs Redis less than half the CPU per check of ten
/// scripts (`bench/RESULTS.md`); a script may also carry concurrent calls' requests
/// bound for the same target (`store::coalesce`).
async fn decide_batch(shim: &Shim, requests: &[CheckRequest]) -> Vec<Result<CheckResponse, Refusal>> {
    let _in_flight: Vec<_> = requests.iter().map(|_| shim.metrics.in_flight()).collect();
    let keys: Vec<Vec<String>> = requests
        .iter()
        .map(|request| {
            shim.config
                .redis_keys(request.checks.iter().map(|check| check.key.as_str()))
        })
        .collect();
    let validity: Vec<Result<(), Refusal>> = requests.iter().map(|request| validate(shim, request)).collect();
    // The valid requests by the script that can decide them together, and those that
    // need scripts of their own.
    let mut scripts: Vec<(SharedScript, Vec<usize>)> = Vec::new();
    let mut spanning_slots: Vec<usize> = Vec::new();
    let mut across_regions: Vec<usize> = Vec::new();
    for (index, keys) in keys.iter().enumerate() {
        if validity[index].is_err() {
            continue;
        }
        if shim.regions.is_some() && crosses_regions(&requests[index].checks) {
            across_regions.push(index);
            continue;
        }
        note_without_peers(&requests[index].checks);
        match shim.store.shared_script(keys) {
            Some(script) => match scripts.iter_mut().find(|(shared, _)| *shared == script) {
                Some((_, members)) => members.push(index),
                None => scripts.push((script, vec![index])),
            },
            None => spanning_slots.push(index),
        }
    }
    let together = join_all(scripts.iter().map(|&(script, ref members)| {
        let requests: Vec<RequestChecks> = members
            .iter()
            .map(|&i| RequestChecks {
                keys: &keys[i],
                checks: &requests[i].checks,
            })
            .collect();
        async move {
            match shim.store.check_requests(script, &requests).await {
                Ok(rows) => {
                    let mut decided = Vec::with_capacity(rows.len());
                    for (rows, request) in rows.into_iter().zip(&requests) {
                        decided.push(match rows {
                            // A key's slot left the master: nothing was written, and the
                            // request is decided again, slot by slot.
                            Err(error) if moved_away(&error) => {
                                decision::decide(&shim.store, request.keys, request.checks).await
                            }
                            rows => decision::decided_in_batch(rows, request.checks),
                        });
                    }
                    decided
                }
                Err(error) => requests
                    .iter()
                    .map(|_| Err(DecideError::nothing_charged(error.duplicate())))
                    .collect::<Vec<_>>(),
            }
        }
    }));
    let alone = join_all(
        spanning_slots
            .iter()
            .map(|&i| decision::decide(&shim.store, &keys[i], &requests[i].checks)),
    );
    let regional = join_all(
        across_regions
            .iter()
            .map(|&i| decide_alone(shim, &keys[i], &requests[i].checks)),
    );
    let (together, alone, regional) = futures_util::future::join3(together, alone, regional).await;
    let mut decisions: Vec<Option<Result<Decision, DecideError>>> = requests.iter().map(|_| None).collect();
    let decided_members = scripts
        .iter()
        .zip(together)
        .flat_map(|((_, members), decided)| members.iter().copied().zip(decided));
    let decided_alone = spanning_slots.iter().copied().zip(alone);
    let decided_across = across_regions.iter().copied().zip(regional);
    for (index, decision) in decided_members.chain(decided_alone).chain(decided_across) {
        decisions[index] = Some(decision);
    }
    requests
        .iter()
        .zip(&keys)
        .zip(validity)
        .zip(decisions)
        .map(|(((request, keys), validity), decision)| {
            validity?;
            let decision = decision.unwrap_or_else(|| {
                Err(DecideError::nothing_charged(StoreError::Malformed(
                    "no answer for a request".into(),
                )))
            });
            respond(&shim.metrics, request, keys, decision).map_err(redis_failed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RequestOutcome;

    const NEWER_CHECK: &[u8] = br#"{"requests":[{"checks":[
        {"key":"a","limit":5,"period_ms":1000},
        {"key":"b","limit":5,"period_ms":1000,"priority":2}]}]}"#;

    fn version(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap()
    }

    #[test]
    fn only_a_filter_stating_a_served_version_is_read_tolerantly() {
        let unstated = read_batch(NEWER_CHECK, None).unwrap_err();
        assert!(unstated.contains("unknown field `priority`"), "{unstated}");
        let newer = read_batch(NEWER_CHECK, Some(&version("0.3.0"))).unwrap();
        assert_eq!(newer.batch.requests[0].checks.len(), 1);
        assert_eq!(newer.unsupported[0][0].field, "priority");
        for (stated, named) in [
            ("0.4.0", "not served"),
            ("1.2.0", "not served"),
            ("latest", "not a version"),
        ] {
            let err = read_batch(NEWER_CHECK, Some(&version(stated))).unwrap_err();
            assert!(err.contains(named) && err.contains(VERSION_HEADER), "{err}");
        }
    }

    #[test]
    fn checks_set_aside_come_back_as_placeholders_in_their_places() {
        let decided = CheckResult {
            allowed: true,
            limit: 5,
            remaining: 4,
            granted: 1,
            ..CheckResult::default()
        };
        let request = CheckRequest { checks: vec![] };
        let set_aside = |position| UnsupportedCheck {
            position,
            field: "priority".into(),
        };
        let answer = CheckResponse {
            allowed: true,
            results: vec![decided, decided],
            unsupported: vec![],
        };
        let merged = with_unsupported(Ok(answer), &request, vec![set_aside(0), set_aside(2)])
            .ok()
            .unwrap();
        assert_eq!(
            merged.results,
            [CheckResult::default(), decided, CheckResult::default(), decided]
        );
        assert!(merged.allowed);
        assert_eq!(merged.unsupported.len(), 2);
        // Every check set aside: nothing decided, nothing charged, still an answer.
        let empty = Err(Refusal::new(
            RequestOutcome::Invalid,
            StatusCode::BAD_REQUEST,
            "checks: empty",
        ));
        let alone = with_unsupported(empty, &request, vec![set_aside(0)])
            .ok()
            .unwrap();
        assert_eq!(alone.results, [CheckResult::default()]);
        // A request that failed for its own reasons still fails.
        let request = CheckRequest {
            checks: vec![ratelimit_wire::Check {
                key: "a".into(),
                algorithm: Default::default(),
                limit: 5,
                period_ms: 1_000,
                cost: 1,
                shadow: false,
                lease: 0,
                calendar: None,
                regions: Default::default(),
            }],
        };
        let failed = Err(Refusal::new(
            RequestOutcome::RedisError,
            StatusCode::SERVICE_UNAVAILABLE,
            "redis: down",
        ));
        assert!(with_unsupported(failed, &request, vec![set_aside(1)]).is_err());
    }
}
