//! The filter-to-shim wire format: one definition, serialised by the filter
//! (`ratelimit-wasm`) and parsed and validated by `redis-shim`. A crate of its own, on
//! serde alone, so that neither side needs the other's code.
//!
//! A request carries every rule that applies to one HTTP request; the shim decides them
//! together, atomically: either every enforcing check is charged or none is.
//!
//! Semantics every algorithm's script follows:
//! - The request is allowed when every check with `shadow: false` admits it. Only then is
//!   anything charged: each enforcing check, and each shadow check that itself admits.
//!   A shadow check never changes the decision; its counter moves so that what it would
//!   have refused can be logged.
//! - A check with `lease: N` (N >= cost) asks for up to N tokens: when allowed it is
//!   charged and granted `min(N, available / 2)` (at least `cost`), reported in
//!   `granted`, with `lease_window_ms` bounding when they may be spent.
//! - A settlement (`settlements` of a batch) adjusts the counter an admitted request was
//!   charged to by its real cost, known only from the response: `actual - charged` more
//!   (the counter may go into debt, at most [`MAX_DEBT_LIMITS`] limits deep) or
//!   `charged - actual` back.
//! - `remaining` counts whole requests of cost 1 still admissible now (after the charge);
//!   `reset_ms` is the time until the counter is back to its full limit; `retry_after_ms`
//!   the time until this check would admit the request (0 when it admits).
//! - A `concurrency` check counts requests in flight, not a rate: its `period_ms` is the
//!   rule's `max_duration` (how long a slot stays taken when its release is lost), its
//!   cost is 1, and the `stamp` of its result names the slot taken, which the filter gives
//!   back as a [`TokenReturn`] (amount 1) when the request's stream ends.
//! - A check with a `calendar` is a fixed window aligned to the calendar (see
//!   [`calendar`]); its `period_ms` is the unit's longest window.

// The filter links this crate: a panic there kills the VM for every request on its
// worker, so none outside tests, as in the filter's own crates.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod algorithm;
mod batch;
pub mod calendar;
mod rate;
mod regions;
pub mod tolerant;
pub mod version;

pub use algorithm::{Algorithm, Refill, Traits, MAX_CONCURRENCY_LIMIT, MAX_LOG_LIMIT};
pub use batch::{BatchAnswer, BatchCheckRequest, BatchCheckResponse, Settlement, TokenReturn};
pub use calendar::{CalendarUnit, CalendarWindow};
pub use rate::{Limit, OutOfBounds, Period, Rate, MAX_LIMIT, MAX_PERIOD_MS};
pub use regions::{replicated_algorithms, Regions};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
pub use version::{WireVersion, VERSION, VERSION_HEADER};

/// Path of the shim's check endpoint.
pub const CHECK_PATH: &str = "/v1/check";
/// Path of the endpoint deciding several requests' checks in one call (what the filter
/// uses: a worker batches the requests that arrive while its calls are in flight).
pub const CHECK_BATCH_PATH: &str = "/v1/check-batch";
/// Most requests one batch may carry.
pub const MAX_BATCH: usize = 32;
/// Header carrying the shared token, when the shim requires one.
pub const TOKEN_HEADER: &str = "x-ratelimit-token";
/// Most checks one request may carry (one per matching rule).
pub const MAX_CHECKS: usize = 16;
/// Longest counter key accepted, before the shim's namespace prefix.
pub const MAX_KEY_LEN: usize = 200;
/// Deepest debt of a counter, in limits: a settlement charges at most this much beyond
/// its estimate, and the shim's script stops a key's debt here however many settlements
/// arrive (a token bucket's client waits at most this many periods more), which keeps
/// every time in the scripts exact.
pub const MAX_DEBT_LIMITS: u64 = 100;

/// `POST /v1/check` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    pub checks: Vec<Check>,
}

/// One rule's check for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Counter key, already encoded and hashed by the filter (see `keys`).
    pub key: String,
    #[serde(default)]
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period_ms: u64,
    #[serde(default = "default_cost")]
    pub cost: u64,
    /// Counts but never refuses.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow: bool,
    /// Tokens to take at once for a local lease (0: no lease, take `cost`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease: u64,
    /// A fixed window aligned to the calendar instead of to multiples of `period_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<CalendarWindow>,
    /// How the count relates across regions (docs/REGIONS.md); independent by default.
    #[serde(default, skip_serializing_if = "Regions::is_independent")]
    pub regions: Regions,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

pub(crate) fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

fn default_cost() -> u64 {
    1
}

/// `POST /v1/check` answer: the overall decision and one result per check, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResponse {
    /// Over the checks decided: those in `unsupported` take no part.
    pub allowed: bool,
    pub results: Vec<CheckResult>,
    /// The checks this shim could not honour (fields it does not know, from a newer
    /// filter): not decided, nothing charged; their entries in `results` are
    /// placeholders (not allowed, nothing granted). Only ever sent to a filter that
    /// stated its version ([`VERSION_HEADER`]); a 0.1 filter never sends such a check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<UnsupportedCheck>,
}

/// A check the shim did not decide: its position in the request and the fields it does
/// not know (comma-separated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsupportedCheck {
    pub position: usize,
    pub field: String,
}

/// The state of one rule's counter after the check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Whether this rule alone would admit the request.
    pub allowed: bool,
    pub limit: u64,
    /// Whole requests (of cost 1) still admissible now.
    pub remaining: u64,
    /// Milliseconds until the counter is back to its full limit.
    pub reset_ms: u64,
    /// Milliseconds until this rule would admit the request; 0 when allowed.
    pub retry_after_ms: u64,
    /// Tokens charged to this counter by this request: `cost`, a lease, or 0.
    #[serde(default)]
    pub granted: u64,
    /// How long the tokens granted beyond `cost` may be spent before they would cross
    /// into a window they were not charged to; 0: no bound but the rule's lease ttl.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease_window_ms: u64,
    /// Where this request's charge went (a window, an instant, a concurrency slot's id),
    /// to give back what a lease leaves unspent or the slot a request held; 0 when
    /// nothing was charged. (Read under its former name too, `lease_stamp`, which only
    /// leases carried.)
    #[serde(default, alias = "lease_stamp", skip_serializing_if = "is_zero_i64")]
    pub stamp: i64,
}

/// Why a check request is refused before it reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRequest(pub String);

impl fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidRequest {}

/// The bounds of a counter a check or a return names (`at` is its place, for the
/// message): its key, a limit and period its algorithm can hold, and a calendar only on a
/// fixed window, with an offset in use and the unit's longest window as its period.
pub(crate) fn check_counter(
    at: &str,
    key: &str,
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    calendar: Option<CalendarWindow>,
) -> Result<(), InvalidRequest> {
    let fail = |msg: String| Err(InvalidRequest(msg));
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return fail(format!("{at}.key: length must be 1..={MAX_KEY_LEN}"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return fail(format!("{at}.key: must be printable ASCII"));
    }
    if let Err(bounds) = Limit::for_algorithm(limit, algorithm) {
        return fail(format!("{at}.limit: {bounds}"));
    }
    if let Err(bounds) = Period::try_from(period_ms) {
        return fail(format!("{at}.period_ms: {bounds}"));
    }
    if let Some(window) = calendar {
        if !algorithm.traits().follows_calendar {
            return fail(format!("{at}.calendar: only a fixed_window has a calendar"));
        }
        if !window.offset_in_bounds() {
            return fail(format!(
                "{at}.calendar.offset_minutes: must be between {} and {}",
                calendar::MIN_OFFSET_MINUTES,
                calendar::MAX_OFFSET_MINUTES
            ));
        }
        if period_ms != window.unit.longest_ms() {
            return fail(format!(
                "{at}.period_ms: a {} calendar's period is {} ms",
                window.unit.as_str(),
                window.unit.longest_ms()
            ));
        }
    }
    Ok(())
}

impl CheckRequest {
    /// Checks every bound the shim relies on, so an out-of-range request touches no key.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        let fail = |msg: String| Err(InvalidRequest(msg));
        if self.checks.is_empty() {
            return fail("checks: must contain at least one check".into());
        }
        if self.checks.len() > MAX_CHECKS {
            return fail(format!("checks: at most {MAX_CHECKS} checks per request"));
        }
        let mut seen = HashSet::new();
        for (i, check) in self.checks.iter().enumerate() {
            check_counter(
                &format!("checks[{i}]"),
                &check.key,
                check.algorithm,
                check.limit,
                check.period_ms,
                check.calendar,
            )?;
            if !seen.insert(check.key.as_str()) {
                return fail(format!("checks[{i}].key: duplicate key in one request"));
            }
            if check.cost == 0 || check.cost > check.limit {
                return fail(format!("checks[{i}].cost: must be 1..=limit"));
            }
            if check.lease != 0 && (check.lease < check.cost || check.lease > check.limit) {
                return fail(format!("checks[{i}].lease: must be 0 or cost..=limit"));
            }
            if let Some(refused) = check.regions.refuses(check.algorithm, check.lease != 0) {
                return fail(format!("checks[{i}].regions: {refused}"));
            }
            if check.algorithm.traits().counts_in_flight && (check.cost != 1 || check.lease != 0) {
                return fail(format!(
                    "checks[{i}]: a concurrency check takes one slot (cost 1, no lease)"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn check(key: &str) -> Check {
        Check {
            key: key.into(),
            algorithm: Algorithm::TokenBucket,
            limit: 5,
            period_ms: 60_000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
            regions: Default::default(),
        }
    }

    #[test]
    fn round_trips_through_json_with_defaults() {
        let parsed: CheckRequest =
            serde_json::from_str(r#"{"checks":[{"key":"r:k","limit":5,"period_ms":60000}]}"#).unwrap();
        assert_eq!(parsed.checks[0], check("r:k"));
        let again: CheckRequest = serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
        assert_eq!(again, parsed);
    }

    #[test]
    fn batch_answers_are_tagged() {
        let answer = BatchCheckResponse {
            responses: vec![
                BatchAnswer::Decided(CheckResponse {
                    allowed: true,
                    results: vec![],
                    unsupported: vec![],
                }),
                BatchAnswer::Failed("redis: down".into()),
            ],
            unsupported: vec![],
        };
        let json = serde_json::to_string(&answer).unwrap();
        assert_eq!(
            json,
            r#"{"responses":[{"decided":{"allowed":true,"results":[]}},{"failed":"redis: down"}]}"#
        );
        assert_eq!(serde_json::from_str::<BatchCheckResponse>(&json).unwrap(), answer);
        let empty = BatchCheckRequest {
            requests: vec![],
            returns: vec![],
            settlements: vec![],
        };
        assert!(empty.validate().unwrap_err().0.contains("requests"));
        let full = BatchCheckRequest {
            requests: vec![
                CheckRequest {
                    checks: vec![check("a")]
                };
                MAX_BATCH + 1
            ],
            returns: vec![],
            settlements: vec![],
        };
        assert!(full.validate().is_err());
        let token_return = |amount| TokenReturn {
            key: "r:{k}".into(),
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            period_ms: 1_000,
            amount,
            stamp: 1_000,
            calendar: None,
        };
        let returns_only = BatchCheckRequest {
            requests: vec![],
            returns: vec![token_return(3)],
            settlements: vec![],
        };
        assert_eq!(returns_only.validate(), Ok(()));
        let too_much = BatchCheckRequest {
            requests: vec![],
            returns: vec![token_return(11)],
            settlements: vec![],
        };
        assert!(too_much.validate().unwrap_err().0.contains("returns[0].amount"));
    }

    #[test]
    fn a_settlement_charges_the_difference_within_the_debt_bound() {
        let settled = |charged, actual| Settlement {
            key: "r:{k}".into(),
            algorithm: Algorithm::TokenBucket,
            limit: 10,
            period_ms: 60_000,
            charged,
            actual,
            stamp: 0,
            calendar: None,
        };
        assert_eq!(settled(3, 8).difference(), 5);
        assert_eq!(settled(3, 1).difference(), -2);
        assert_eq!(settled(3, 0).difference(), -3);
        assert_eq!(settled(3, 3).difference(), 0);
        assert_eq!(settled(1, MAX_LIMIT).difference(), 10 * MAX_DEBT_LIMITS as i64);
        let batch = |settlement| BatchCheckRequest {
            requests: vec![],
            returns: vec![],
            settlements: vec![settlement],
        };
        assert_eq!(batch(settled(3, 8)).validate(), Ok(()));
        let cases = [
            (settled(0, 8), "settlements[0].charged"),
            (settled(11, 8), "settlements[0].charged"),
            (settled(3, MAX_LIMIT + 1), "settlements[0].actual"),
            (
                Settlement {
                    algorithm: Algorithm::SlidingWindowLog,
                    ..settled(3, 8)
                },
                "settlements[0].algorithm",
            ),
            (
                Settlement {
                    limit: 0,
                    ..settled(3, 8)
                },
                "settlements[0].limit",
            ),
        ];
        for (settlement, field) in cases {
            let err = batch(settlement).validate().unwrap_err();
            assert!(err.0.contains(field), "{err} should name {field}");
        }
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = serde_json::from_str::<CheckRequest>(
            r#"{"checks":[{"key":"k","limit":5,"period_ms":1,"bogus":1}]}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn validation_names_the_offending_field() {
        let cases: Vec<(CheckRequest, &str)> = vec![
            (CheckRequest { checks: vec![] }, "checks:"),
            (
                CheckRequest {
                    checks: vec![Check {
                        limit: 0,
                        ..check("a")
                    }],
                },
                "checks[0].limit",
            ),
            (
                CheckRequest {
                    checks: vec![
                        check("a"),
                        Check {
                            period_ms: 0,
                            ..check("b")
                        },
                    ],
                },
                "checks[1].period_ms",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        cost: 6,
                        ..check("a")
                    }],
                },
                "checks[0].cost",
            ),
            (
                CheckRequest {
                    checks: vec![check(&"x".repeat(MAX_KEY_LEN + 1))],
                },
                "checks[0].key",
            ),
            (
                CheckRequest {
                    checks: vec![check("a b")],
                },
                "checks[0].key",
            ),
            (
                CheckRequest {
                    checks: vec![check("a"), check("a")],
                },
                "duplicate",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        lease: 9,
                        ..check("a")
                    }],
                },
                "checks[0].lease",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        algorithm: Algorithm::SlidingWindowLog,
                        limit: MAX_LOG_LIMIT + 1,
                        ..check("a")
                    }],
                },
                "checks[0].limit",
            ),
            (
                CheckRequest {
                    checks: vec![check("a"); MAX_CHECKS + 1],
                },
                "at most",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        algorithm: Algorithm::Concurrency,
                        cost: 2,
                        ..check("a")
                    }],
                },
                "concurrency check takes one slot",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        calendar: Some(month(0)),
                        ..check("a")
                    }],
                },
                "checks[0].calendar: only a fixed_window",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        algorithm: Algorithm::Concurrency,
                        lease: 3,
                        ..check("a")
                    }],
                },
                "concurrency check takes one slot",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        algorithm: Algorithm::FixedWindow,
                        calendar: Some(month(0)),
                        ..check("a")
                    }],
                },
                "checks[0].period_ms",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        algorithm: Algorithm::Concurrency,
                        limit: MAX_CONCURRENCY_LIMIT + 1,
                        ..check("a")
                    }],
                },
                "checks[0].limit",
            ),
            (
                CheckRequest {
                    checks: vec![Check {
                        calendar: Some(month(15 * 60)),
                        ..calendar_check("a")
                    }],
                },
                "checks[0].calendar.offset_minutes",
            ),
        ];
        for (request, expected) in cases {
            let err = request.validate().unwrap_err();
            assert!(err.0.contains(expected), "{err} should mention {expected}");
        }
        assert!(CheckRequest {
            checks: vec![check("a"), check("b"), calendar_check("c")]
        }
        .validate()
        .is_ok());
    }

    fn month(offset_minutes: i32) -> CalendarWindow {
        CalendarWindow {
            unit: CalendarUnit::Month,
            offset_minutes,
        }
    }

    fn calendar_check(key: &str) -> Check {
        Check {
            algorithm: Algorithm::FixedWindow,
            period_ms: CalendarUnit::Month.longest_ms(),
            calendar: Some(month(-210)),
            ..check(key)
        }
    }

    #[test]
    fn a_calendar_travels_as_its_unit_and_offset() {
        let json = serde_json::to_string(&calendar_check("k")).unwrap();
        assert!(
            json.contains(r#""calendar":{"unit":"month","offset_minutes":-210}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Check>(&json).unwrap(), calendar_check("k"));
        // Without one, nothing is sent: older shims keep understanding the checks.
        assert!(!serde_json::to_string(&check("k")).unwrap().contains("calendar"));
        let unknown_unit = r#"{"key":"k","limit":5,"period_ms":1,"calendar":{"unit":"year"}}"#;
        assert!(serde_json::from_str::<Check>(unknown_unit).is_err());
    }
}
