//! `POST /v1/check-batch`: several requests' checks (see [`BatchCheckRequest`]), each
//! its own atomic decision, so one call carries what a worker of the filter queued. Each
//! request is decided, answered and counted in the metrics as if it had come alone to
//! `POST /v1/check` ([`crate::check`]), in as few scripts as their keys allow.

use crate::adjustments::adjust_counters;
use crate::admission::OVERLOADED;
use crate::check::{answer_outcome, invalid_request, respond};
use crate::decision::{self, DecideError, Decision};
use crate::endpoint::{error, Admitted, Refusal, Reply, Shim};
use crate::metrics::RequestOutcome;
use crate::redis_store::SharedScript;
use crate::scripts::RequestChecks;
use crate::store::StoreError;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use futures_util::future::join_all;
use ratelimit_wire::{BatchAnswer, BatchCheckRequest, BatchCheckResponse, CheckRequest, CheckResponse};

pub async fn check_batch(mut request: Admitted) -> Reply {
    let batch = match serde_json::from_slice::<BatchCheckRequest>(&request.body)
        .map_err(|e| format!("invalid batch: {e}"))
        .and_then(|batch| batch.validate().map(|()| batch).map_err(|e| e.to_string()))
    {
        Ok(batch) => batch,
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
    let mut outcomes = Vec::with_capacity(batch.requests.len());
    let mut responses: Vec<BatchAnswer> = decided
        .into_iter()
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
    Reply::counted(Json(BatchCheckResponse { responses }).into_response(), outcomes)
}

/// A batch's requests, each validated, decided all or nothing on its own, counted and
/// logged as `POST /v1/check` does it alone, in as few scripts as their keys allow: on
/// a standalone Redis one for the whole batch; on a cluster one per slot for the requests
/// whose keys all lie in it, and slot by slot for each request whose keys span slots.
/// One script for ten requests costs Redis less than half the CPU per check of ten
/// scripts (`bench/RESULTS.md`); a script may also carry concurrent calls' requests
/// bound for the same target ([`crate::coalesce`]).
async fn decide_batch(shim: &Shim, requests: &[CheckRequest]) -> Vec<Result<CheckResponse, Refusal>> {
    let _in_flight: Vec<_> = requests.iter().map(|_| shim.metrics.in_flight()).collect();
    let keys: Vec<Vec<String>> = requests
        .iter()
        .map(|request| {
            shim.config
                .redis_keys(request.checks.iter().map(|check| check.key.as_str()))
        })
        .collect();
    let validity: Vec<Result<(), Refusal>> = requests
        .iter()
        .map(|request| request.validate().map_err(invalid_request))
        .collect();
    // The valid requests by the script that can decide them together, and those that
    // need scripts of their own.
    let mut scripts: Vec<(SharedScript, Vec<usize>)> = Vec::new();
    let mut spanning_slots: Vec<usize> = Vec::new();
    for (index, keys) in keys.iter().enumerate() {
        if validity[index].is_err() {
            continue;
        }
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
                Ok(rows) => rows
                    .into_iter()
                    .zip(&requests)
                    .map(|(rows, request)| decision::decided_in_batch(rows, request.checks))
                    .collect(),
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
    let (together, alone) = futures_util::future::join(together, alone).await;
    let mut decisions: Vec<Option<Result<Decision, DecideError>>> = requests.iter().map(|_| None).collect();
    let decided_members = scripts
        .iter()
        .zip(together)
        .flat_map(|((_, members), decided)| members.iter().copied().zip(decided));
    for (index, decision) in decided_members.chain(spanning_slots.iter().copied().zip(alone)) {
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
            respond(&shim.metrics, request, keys, decision)
        })
        .collect()
}
