//! The Lua scripts the shim runs, the arguments they take and the parsing of their
//! replies.
//!
//! One file per algorithm under `scripts/`, each headed by its contract and state per
//! key, `calendar.lua` (windows aligned to the calendar, for fixed windows), plus three
//! drivers: `check.lua` (every check of a request, all or nothing, by `request.lua`),
//! `check_batch.lua` (several requests, each on its own, whose keys one script reaches) and
//! `refund.lua` (gives back a charge when a later cluster slot refused). A script is the
//! prelude, every algorithm and one driver concatenated, so one EVALSHA runs any mix of
//! algorithms atomically. `redis::Script` loads it again when Redis answers NOSCRIPT
//! (after a restart or `SCRIPT FLUSH`).

use ratelimit_wire::{Check, CheckResult};
use redis::{Script, ScriptInvocation};

macro_rules! with_algorithms {
    ($($driver:literal),+) => {
        concat!(
            include_str!("../scripts/common.lua"),
            include_str!("../scripts/calendar.lua"),
            include_str!("../scripts/token_bucket.lua"),
            include_str!("../scripts/fixed_window.lua"),
            include_str!("../scripts/sliding_window_log.lua"),
            include_str!("../scripts/sliding_window_counter.lua"),
            include_str!("../scripts/concurrency.lua"),
            $(include_str!($driver),)+
        )
    };
}

/// The source of the check script: one request's checks.
pub const CHECK_SOURCE: &str = with_algorithms!("../scripts/request.lua", "../scripts/check.lua");
/// The source of the batch check script: several requests' checks, each on its own.
pub const CHECK_BATCH_SOURCE: &str = with_algorithms!("../scripts/request.lua", "../scripts/check_batch.lua");
/// The source of the refund script.
pub const REFUND_SOURCE: &str = with_algorithms!("../scripts/refund.lua");

/// The scripts, hashed once.
pub struct Scripts {
    pub check: Script,
    pub check_batch: Script,
    pub refund: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            check: Script::new(CHECK_SOURCE),
            check_batch: Script::new(CHECK_BATCH_SOURCE),
            refund: Script::new(REFUND_SOURCE),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

/// Whether check.lua may charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Charge every check when every enforcing one admits.
    Charge,
    /// Report the state, charge nothing.
    Peek,
}

/// The check's calendar as calendar.lua reads it; empty for none.
fn calendar_arg(check: &Check) -> String {
    check
        .calendar
        .map(|calendar| calendar.script_arg())
        .unwrap_or_default()
}

fn mode_arg(mode: Mode) -> &'static str {
    match mode {
        Mode::Charge => "charge",
        Mode::Peek => "peek",
    }
}

/// Adds one request's checks, whose Redis keys are `keys` (same order), to `invocation`.
fn add_checks<'k>(
    invocation: &mut ScriptInvocation<'_>,
    keys: impl Iterator<Item = &'k str>,
    checks: &[&Check],
) {
    for (key, check) in keys.zip(checks) {
        invocation
            .key(key)
            .arg(check.algorithm.as_str())
            .arg(check.limit)
            .arg(check.period_ms)
            .arg(check.cost)
            .arg(check.lease)
            .arg(u8::from(check.shadow))
            .arg(calendar_arg(check));
    }
}

/// A check.lua invocation over `checks`, whose Redis keys are `keys` (same order).
pub fn check_invocation<'a>(
    scripts: &'a Scripts,
    mode: Mode,
    keys: &[&str],
    checks: &[&Check],
) -> ScriptInvocation<'a> {
    let mut invocation = scripts.check.prepare_invoke();
    invocation.arg(mode_arg(mode));
    add_checks(&mut invocation, keys.iter().copied(), checks);
    invocation
}

/// One request of a batch: its checks and their Redis keys (same order).
pub struct RequestChecks<'a> {
    pub keys: &'a [String],
    pub checks: &'a [Check],
}

/// A check_batch.lua invocation charging each of `requests` on its own.
pub fn check_batch_invocation<'a>(
    scripts: &'a Scripts,
    requests: &[RequestChecks<'_>],
) -> ScriptInvocation<'a> {
    let mut invocation = scripts.check_batch.prepare_invoke();
    invocation.arg(mode_arg(Mode::Charge));
    for request in requests {
        invocation.arg(request.checks.len());
        let checks: Vec<&Check> = request.checks.iter().collect();
        add_checks(&mut invocation, request.keys.iter().map(String::as_str), &checks);
    }
    invocation
}

/// One request's part of check_batch.lua's reply: its rows, or the error that stopped it.
pub type RequestRows = Result<Vec<Row>, String>;

/// Reads check_batch.lua's reply: for each request, rows for `expected[i]` checks, or an
/// error message.
pub fn parse_batch_reply(
    reply: Vec<redis::Value>,
    expected: &[usize],
) -> Result<Vec<RequestRows>, MalformedReply> {
    if reply.len() != expected.len() {
        return Err(MalformedReply(format!(
            "{} answers for {} requests",
            reply.len(),
            expected.len()
        )));
    }
    reply
        .into_iter()
        .zip(expected)
        .map(|(value, &checks)| match value {
            redis::Value::BulkString(message) => Ok(Err(String::from_utf8_lossy(&message).into_owned())),
            value => {
                let rows: Vec<Vec<i64>> =
                    redis::from_redis_value(value).map_err(|e| MalformedReply(e.to_string()))?;
                parse_rows(rows, checks).map(Ok)
            }
        })
        .collect()
}

/// A charge check.lua made, to be given back (or, settled at a higher real cost,
/// increased) by refund.lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge<'a> {
    pub key: &'a str,
    pub check: &'a Check,
    /// The tokens to give back (the `granted` of check.lua's reply, or part of it);
    /// negative: the tokens to charge now beyond it.
    pub amount: i64,
    /// Where they went: the `stamp` of check.lua's reply.
    pub stamp: i64,
}

/// A refund.lua invocation adjusting each of `charges`.
pub fn refund_invocation<'a>(scripts: &'a Scripts, charges: &[Charge<'_>]) -> ScriptInvocation<'a> {
    let mut invocation = scripts.refund.prepare_invoke();
    for charge in charges {
        invocation
            .key(charge.key)
            .arg(charge.check.algorithm.as_str())
            .arg(charge.check.limit)
            .arg(charge.check.period_ms)
            .arg(charge.amount)
            .arg(charge.stamp)
            .arg(calendar_arg(charge.check));
    }
    invocation
}

/// One check's line of a script reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// This check alone would admit the request.
    pub admits: bool,
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: u64,
    pub granted: u64,
    /// Where the charge went, for a refund (a window start, an instant); 0 for none.
    pub stamp: i64,
    /// How long granted tokens may be spent (0: no bound from the algorithm).
    pub lease_window_ms: u64,
}

impl Row {
    /// The wire result for `check`.
    pub fn result(&self, check: &Check) -> CheckResult {
        CheckResult {
            allowed: self.admits,
            limit: check.limit,
            remaining: self.remaining.min(check.limit),
            reset_ms: self.reset_ms,
            retry_after_ms: self.retry_after_ms,
            granted: self.granted,
            lease_window_ms: self.lease_window_ms,
            stamp: if self.granted > 0 { self.stamp } else { 0 },
        }
    }
}

/// The script's reply could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedReply(pub String);

/// Turns a script's `{admits, remaining, reset_ms, retry_after_ms, granted, stamp,
/// lease_ms}` rows into [`Row`]s, one per check expected.
pub fn parse_rows(rows: Vec<Vec<i64>>, expected: usize) -> Result<Vec<Row>, MalformedReply> {
    if rows.len() != expected {
        return Err(MalformedReply(format!(
            "{} rows for {expected} checks",
            rows.len()
        )));
    }
    rows.into_iter()
        .map(|row| {
            let [admits, remaining, reset_ms, retry_after_ms, granted, stamp, lease_ms] = row[..] else {
                return Err(MalformedReply(format!("row of {} values, expected 7", row.len())));
            };
            let non_negative = |value: i64| {
                u64::try_from(value).map_err(|_| MalformedReply(format!("negative value {value}")))
            };
            Ok(Row {
                admits: admits == 1,
                remaining: non_negative(remaining)?,
                reset_ms: non_negative(reset_ms)?,
                retry_after_ms: non_negative(retry_after_ms)?,
                granted: non_negative(granted)?,
                stamp,
                lease_window_ms: non_negative(lease_ms)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_wire::Algorithm;

    fn check(limit: u64) -> Check {
        Check {
            key: "k".into(),
            algorithm: Algorithm::TokenBucket,
            limit,
            period_ms: 1000,
            cost: 1,
            shadow: false,
            lease: 0,
            calendar: None,
        }
    }

    #[test]
    fn parses_rows_in_order() {
        let rows = parse_rows(
            vec![vec![1, 4, 200, 0, 1, 17, 900], vec![0, 9, 900, 150, 0, 0, 0]],
            2,
        )
        .unwrap();
        assert_eq!(
            rows,
            vec![
                Row {
                    admits: true,
                    remaining: 4,
                    reset_ms: 200,
                    retry_after_ms: 0,
                    granted: 1,
                    stamp: 17,
                    lease_window_ms: 900,
                },
                Row {
                    admits: false,
                    remaining: 9,
                    reset_ms: 900,
                    retry_after_ms: 150,
                    granted: 0,
                    stamp: 0,
                    lease_window_ms: 0,
                },
            ]
        );
        // `remaining` never exceeds the limit on the wire, whatever a script says.
        assert_eq!(rows[1].result(&check(2)).remaining, 2);
        assert!(rows[0].result(&check(5)).allowed);
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(parse_rows(vec![], 1).is_err());
        assert!(parse_rows(vec![vec![1, 2, 3, 0, 0, 0]], 1).is_err());
        assert!(parse_rows(vec![vec![1, -2, 3, 0, 0, 0, 0]], 1).is_err());
    }

    #[test]
    fn parses_a_batch_reply_request_by_request() {
        use redis::Value;
        let row = |admits: i64| Value::Array([admits, 4, 200, 0, admits, 17, 0].map(Value::Int).to_vec());
        let reply = vec![
            Value::Array(vec![row(1), row(0)]),
            Value::BulkString(b"unknown algorithm x".to_vec()),
            Value::Array(vec![row(1)]),
        ];
        let requests = parse_batch_reply(reply.clone(), &[2, 1, 1]).unwrap();
        assert_eq!(requests.len(), 3);
        let first = requests[0].as_ref().unwrap();
        assert!(first[0].admits && !first[1].admits);
        assert_eq!(requests[1], Err("unknown algorithm x".to_string()));
        assert_eq!(requests[2].as_ref().unwrap()[0].granted, 1);
        assert!(
            parse_batch_reply(reply.clone(), &[2, 1]).is_err(),
            "one answer per request"
        );
        assert!(parse_batch_reply(reply, &[1, 1, 1]).is_err(), "one row per check");
    }

    #[test]
    fn every_algorithm_is_in_every_script() {
        for algorithm in Algorithm::ALL {
            let registration = format!("algorithms.{} = {{}}", algorithm.as_str());
            assert!(CHECK_SOURCE.contains(&registration), "{registration}");
            assert!(CHECK_BATCH_SOURCE.contains(&registration), "{registration}");
            assert!(REFUND_SOURCE.contains(&registration), "{registration}");
        }
    }
}
