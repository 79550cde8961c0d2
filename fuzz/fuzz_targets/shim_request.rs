//! The shim's request parser: what `POST /v1/check` and `/v1/check-batch` read and
//! validate before any key is touched. Arbitrary bytes are refused or valid, never a
//! panic; a valid request is within the bounds the scripts rely on. The same for the
//! tolerant reading of a newer filter's batch (`tolerant::parse_batch`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_wire::tolerant::parse_batch;
use ratelimit_wire::{BatchCheckRequest, CheckRequest, MAX_CHECKS, MAX_DEBT_LIMITS, MAX_KEY_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<CheckRequest>(data) {
        if request.validate().is_ok() {
            assert!(!request.checks.is_empty() && request.checks.len() <= MAX_CHECKS);
            for check in &request.checks {
                assert!(check.key.len() <= MAX_KEY_LEN);
                assert!(check.cost >= 1 && check.cost <= check.limit);
            }
        }
    }
    if let Ok(batch) = serde_json::from_slice::<BatchCheckRequest>(data) {
        if batch.validate().is_ok() {
            for back in &batch.returns {
                assert!(back.amount >= 1 && back.amount <= back.limit);
            }
            // A settlement gives back at most its charge and charges at most its debt bound.
            for settled in &batch.settlements {
                let difference = settled.difference();
                assert!(difference >= -(settled.charged as i64));
                assert!(difference <= (settled.limit * MAX_DEBT_LIMITS) as i64);
            }
            for request in &batch.requests {
                let _ = request.validate();
            }
        }
    }
    if let Ok(read) = parse_batch(data) {
        // One list of set-aside checks per request read.
        assert_eq!(read.unsupported.len(), read.batch.requests.len());
        if read.batch.validate().is_ok() {
            for request in &read.batch.requests {
                let _ = request.validate();
            }
        }
    }
});
