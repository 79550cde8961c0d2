//! The Lua the shim runs in Redis, the arguments its functions take and the parsing of
//! their replies.
//!
//! One file per algorithm under `scripts/`, each headed by its contract and state per
//! key, `calendar.lua` (windows aligned to the calendar, for fixed windows), plus four
//! drivers: `check.lua` (every check of a request, all or nothing, by `request.lua`),
//! `check_batch.lua` (several requests, each on its own, whose keys one call reaches),
//! `check_node.lua` (the same for the requests bound for one cluster master, in any of
//! its slots) and `refund.lua` (gives back a charge when a later cluster slot refused).
//!
//! They run as one Redis function library (Redis 7.0 or later): the prelude and every
//! algorithm once, then each driver registered as a function, so one FCALL runs any mix
//! of algorithms atomically. A library is defined once when Redis loads it; a script
//! sent with EVALSHA ran all of its definitions again on every call, which was more than
//! half of Redis's time for a one-check request. The library's name carries a hash of its
//! text, so shims of two versions sharing a Redis each call their own; the shim loads it
//! again when Redis answers that a function is missing (a restart without persistence,
//! `FUNCTION FLUSH`, a new cluster node).
//!
//! What Redis spends around the commands is kept near a minimal script doing the same
//! commands (`bench/RESULTS.md`, `bench/redis_work.py`): a check's parameters travel as
//! one value, which the library parses once and keeps, and replies are flat arrays of
//! integers.

use ratelimit_wire::{Check, CheckResult};
use redis::{Cmd, ToRedisArgs};

/// Everything the drivers share: the prelude, the calendar, every algorithm and
/// `check_request`.
const SHARED_SOURCE: &str = concat!(
    include_str!("../../scripts/common.lua"),
    include_str!("../../scripts/calendar.lua"),
    include_str!("../../scripts/token_bucket.lua"),
    include_str!("../../scripts/fixed_window.lua"),
    include_str!("../../scripts/sliding_window_log.lua"),
    include_str!("../../scripts/sliding_window_counter.lua"),
    include_str!("../../scripts/concurrency.lua"),
    include_str!("../../scripts/request.lua"),
    include_str!("../../scripts/replicated.lua"),
);

/// The drivers, each registered as the function `<library>_<name>` with its flags.
const DRIVERS: [(&str, &str, &str); 6] = [
    ("check", include_str!("../../scripts/check.lua"), ""),
    ("check_batch", include_str!("../../scripts/check_batch.lua"), ""),
    (
        "check_node",
        include_str!("../../scripts/check_node.lua"),
        "'allow-cross-slot-keys'",
    ),
    ("refund", include_str!("../../scripts/refund.lua"), ""),
    (
        "check_regions",
        include_str!("../../scripts/check_regions.lua"),
        "",
    ),
    ("apply", include_str!("../../scripts/apply.lua"), ""),
];

/// The shim's function library: its source and its functions' names.
pub struct Library {
    /// What `FUNCTION LOAD` takes.
    pub source: String,
    check: String,
    check_batch: String,
    check_node: String,
    refund: String,
    /// Regions (`crate::store::regions`): a request with replicated checks, and a peer's
    /// entries applied.
    pub(crate) check_regions: String,
    pub(crate) apply: String,
}

impl Library {
    pub fn new() -> Library {
        const NAME: &str = "__LIBRARY__";
        let mut template = format!("#!lua name={NAME}\nlocal KEYS, ARGV\n{SHARED_SOURCE}");
        for (driver, code, flags) in DRIVERS {
            // The drivers read the call's keys and arguments as EVAL's globals.
            template.push_str(&format!(
                "\nredis.register_function{{function_name='{NAME}_{driver}', flags={{{flags}}}, callback=function(keys, args)\n  KEYS, ARGV = keys, args\n{code}\nend}}\n"
            ));
        }
        // Twelve hex digits of the SHA-1 of the whole text (redis::Script computes it).
        let hash = redis::Script::new(&template).get_hash().to_string();
        let name = format!("ratelimit_{}", &hash[..12]);
        Library {
            source: template.replace(NAME, &name),
            check: format!("{name}_check"),
            check_batch: format!("{name}_check_batch"),
            check_node: format!("{name}_check_node"),
            refund: format!("{name}_refund"),
            check_regions: format!("{name}_check_regions"),
            apply: format!("{name}_apply"),
        }
    }

    /// `FUNCTION LOAD REPLACE`: loading it twice (two shims of one version) is harmless.
    pub fn load_command(&self) -> Cmd {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.source);
        load
    }
}

impl Default for Library {
    fn default() -> Self {
        Library::new()
    }
}

/// A call of one of the library's functions, its keys and arguments gathered apart as
/// FCALL takes them.
pub struct FunctionCall<'a> {
    function: &'a str,
    keys: Vec<&'a str>,
    args: Vec<Vec<u8>>,
}

impl<'a> FunctionCall<'a> {
    pub(crate) fn new(function: &'a str) -> FunctionCall<'a> {
        FunctionCall {
            function,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub(crate) fn key(&mut self, key: &'a str) -> &mut Self {
        self.keys.push(key);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// The same call with no declared keys: their number, then the keys, lead the
    /// arguments.
    fn keys_as_arguments(mut self) -> Self {
        let mut args = self.keys.len().to_redis_args();
        args.extend(self.keys.drain(..).map(|key| key.as_bytes().to_vec()));
        args.append(&mut self.args);
        self.args = args;
        self
    }

    /// The FCALL command.
    pub fn command(&self) -> Cmd {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(self.function).arg(self.keys.len());
        for key in &self.keys {
            fcall.arg(*key);
        }
        for arg in &self.args {
            fcall.arg(arg.as_slice());
        }
        fcall
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

pub(crate) fn mode_arg(mode: Mode) -> &'static str {
    match mode {
        Mode::Charge => "charge",
        Mode::Peek => "peek",
    }
}

/// A check's parameters as request.lua takes them, one ARGV value: `<algorithm> <limit>
/// <period_ms> <cost> <lease> <shadow> <calendar>`. The checks of one rule share the
/// value, which Redis parses once and keeps.
pub(crate) fn params_arg(check: &Check) -> String {
    format!(
        "{} {} {} {} {} {} {}",
        check.algorithm.as_str(),
        check.limit,
        check.period_ms,
        check.cost,
        check.lease,
        u8::from(check.shadow),
        calendar_arg(check)
    )
}

/// A check.lua call over `checks`, whose Redis keys are `keys` (same order).
pub fn check_call<'a>(
    library: &'a Library,
    mode: Mode,
    keys: &[&'a str],
    checks: &[&Check],
) -> FunctionCall<'a> {
    let mut call = FunctionCall::new(&library.check);
    call.arg(mode_arg(mode));
    for (key, check) in keys.iter().zip(checks) {
        call.key(key).arg(params_arg(check));
    }
    call
}

/// One request of a batch: its checks and their Redis keys (same order).
pub struct RequestChecks<'a> {
    pub keys: &'a [String],
    pub checks: &'a [Check],
}

/// A check_batch.lua call charging each of `requests` on its own.
pub fn check_batch_call<'a>(library: &'a Library, requests: &[RequestChecks<'a>]) -> FunctionCall<'a> {
    batch_call(&library.check_batch, requests)
}

/// A check_node.lua call charging each of `requests` on its own: check_batch.lua's call
/// with the keys among the arguments, so they may lie in several slots of one node.
pub fn check_node_call<'a>(library: &'a Library, requests: &[RequestChecks<'a>]) -> FunctionCall<'a> {
    batch_call(&library.check_node, requests).keys_as_arguments()
}

/// `function` called over `requests` as check_batch.lua takes them.
fn batch_call<'a>(function: &'a str, requests: &[RequestChecks<'a>]) -> FunctionCall<'a> {
    let mut call = FunctionCall::new(function);
    call.arg(mode_arg(Mode::Charge));
    for request in requests {
        call.arg(request.checks.len());
        for (key, check) in request.keys.iter().zip(request.checks) {
            call.key(key).arg(params_arg(check));
        }
    }
    call
}

/// One request's part of check_batch.lua's reply: its rows, or the error that stopped it.
pub type RequestRows = Result<Vec<Row>, String>;

/// Reads check_batch.lua's flat reply: for each request, seven values for each of its
/// `expected[i]` checks, or one error message.
pub fn parse_batch_reply(
    reply: Vec<redis::Value>,
    expected: &[usize],
) -> Result<Vec<RequestRows>, MalformedReply> {
    let mut values = reply.into_iter();
    let mut requests = Vec::with_capacity(expected.len());
    for &checks in expected {
        match values.next() {
            None => {
                return Err(MalformedReply(format!(
                    "no answer for request {}",
                    requests.len()
                )))
            }
            Some(redis::Value::BulkString(message)) => {
                requests.push(Err(String::from_utf8_lossy(&message).into_owned()))
            }
            Some(first) => {
                let row: Vec<i64> = std::iter::once(first)
                    .chain(values.by_ref().take(ROW_LEN * checks - 1))
                    .map(|value| redis::from_redis_value(value).map_err(|e| MalformedReply(e.to_string())))
                    .collect::<Result<_, _>>()?;
                requests.push(Ok(parse_rows(row, checks)?));
            }
        }
    }
    match values.len() {
        0 => Ok(requests),
        extra => Err(MalformedReply(format!("{extra} values past the last request"))),
    }
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

/// A refund.lua call adjusting each of `charges`.
pub fn refund_call<'a>(library: &'a Library, charges: &[Charge<'a>]) -> FunctionCall<'a> {
    let mut call = FunctionCall::new(&library.refund);
    for charge in charges {
        call.key(charge.key)
            .arg(charge.check.algorithm.as_str())
            .arg(charge.check.limit)
            .arg(charge.check.period_ms)
            .arg(charge.amount)
            .arg(charge.stamp)
            .arg(calendar_arg(charge.check));
    }
    call
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

/// The values of one check in a reply.
const ROW_LEN: usize = 7;

/// Turns a script's flat reply, `admits, remaining, reset_ms, retry_after_ms, granted,
/// stamp, lease_ms` per check, into [`Row`]s, one per check expected.
pub fn parse_rows(values: Vec<i64>, expected: usize) -> Result<Vec<Row>, MalformedReply> {
    if values.len() != ROW_LEN * expected {
        return Err(MalformedReply(format!(
            "{} values for {expected} checks, expected {}",
            values.len(),
            ROW_LEN * expected
        )));
    }
    values
        .chunks_exact(ROW_LEN)
        .map(|row| {
            let &[admits, remaining, reset_ms, retry_after_ms, granted, stamp, lease_ms] = row else {
                unreachable!("chunks of ROW_LEN")
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
            regions: Default::default(),
        }
    }

    #[test]
    fn parses_rows_in_order() {
        let rows = parse_rows(vec![1, 4, 200, 0, 1, 17, 900, 0, 9, 900, 150, 0, 0, 0], 2).unwrap();
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
    fn the_scripts_cap_debt_where_the_wire_says() {
        let common = include_str!("../../scripts/common.lua");
        let line = format!("local MAX_DEBT_LIMITS = {}\n", ratelimit_wire::MAX_DEBT_LIMITS);
        assert!(common.contains(&line), "common.lua lacks {line:?}");
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(parse_rows(vec![], 1).is_err());
        assert!(parse_rows(vec![1, 2, 3, 0, 0, 0], 1).is_err());
        assert!(parse_rows(vec![1, -2, 3, 0, 0, 0, 0], 1).is_err());
        assert!(parse_rows(vec![1, 2, 3, 0, 0, 0, 0, 1], 1).is_err());
    }

    #[test]
    fn parses_a_batch_reply_request_by_request() {
        use redis::Value;
        let row = |admits: i64| [admits, 4, 200, 0, admits, 17, 0].map(Value::Int);
        let reply: Vec<Value> = row(1)
            .into_iter()
            .chain(row(0))
            .chain([Value::BulkString(b"unknown algorithm x".to_vec())])
            .chain(row(1))
            .collect();
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
        assert!(
            parse_batch_reply(reply.clone(), &[2, 1, 2]).is_err(),
            "seven values per check"
        );
        assert!(
            parse_batch_reply(reply, &[1, 1, 1]).is_err(),
            "an error message is not a row"
        );
    }

    /// Requests of these keys and checks, pairwise.
    fn requests<'a>(keys: &[&'a [String]], checks: &[&'a [Check]]) -> Vec<RequestChecks<'a>> {
        keys.iter()
            .zip(checks)
            .map(|(&keys, &checks)| RequestChecks { keys, checks })
            .collect()
    }

    fn args_of(call: &FunctionCall) -> Vec<String> {
        call.command()
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn a_batch_sends_per_request_its_count_then_each_checks_parameters() {
        let library = Library::new();
        let shadow = Check {
            shadow: true,
            ..check(5)
        };
        let calendar = Check {
            algorithm: Algorithm::FixedWindow,
            calendar: Some(ratelimit_wire::CalendarWindow {
                unit: ratelimit_wire::CalendarUnit::Month,
                offset_minutes: -210,
            }),
            ..check(7)
        };
        let (one, two) = ([check(5)], [calendar, shadow]);
        let (keys_one, keys_two) = (["a".to_string()], ["b".to_string(), "c".to_string()]);
        let call = check_batch_call(&library, &requests(&[&keys_one, &keys_two], &[&one, &two]));
        let expected = [
            "FCALL",
            &library.check_batch,
            "3",
            "a",
            "b",
            "c",
            "charge",
            "1",
            "token_bucket 5 1000 1 0 0 ",
            "2",
            "fixed_window 7 1000 1 0 0 month:-210",
            "token_bucket 5 1000 1 0 1 ",
        ];
        assert_eq!(args_of(&call), expected);
    }

    #[test]
    fn a_node_call_sends_every_key_as_an_argument_then_the_batch() {
        let library = Library::new();
        let (one, two) = ([check(5)], [check(6), check(7)]);
        let (keys_one, keys_two) = (["a".to_string()], ["b".to_string(), "c".to_string()]);
        let requests = requests(&[&keys_one, &keys_two], &[&one, &two]);
        let expected = [
            "FCALL",
            &library.check_node,
            "0",
            "3",
            "a",
            "b",
            "c",
            "charge",
            "1",
            "token_bucket 5 1000 1 0 0 ",
            "2",
            "token_bucket 6 1000 1 0 0 ",
            "token_bucket 7 1000 1 0 0 ",
        ];
        assert_eq!(args_of(&check_node_call(&library, &requests)), expected);
    }

    #[test]
    fn the_library_holds_every_algorithm_and_registers_every_driver() {
        let library = Library::new();
        for algorithm in Algorithm::ALL {
            let registration = format!("algorithms.{} = {{}}", algorithm.as_str());
            assert!(library.source.contains(&registration), "{registration}");
        }
        let name = library.check.strip_suffix("_check").unwrap();
        assert!(library.source.starts_with(&format!("#!lua name={name}\n")));
        for function in [
            &library.check,
            &library.check_batch,
            &library.check_node,
            &library.refund,
        ] {
            assert!(
                library
                    .source
                    .contains(&format!("redis.register_function{{function_name='{function}'")),
                "{function}"
            );
        }
        assert!(library.source.contains(&format!(
            "function_name='{}', flags={{'allow-cross-slot-keys'}}",
            library.check_node
        )));
        // Keys first, then arguments, whatever order they were added in.
        let check = check(5);
        let args = args_of(&check_call(&library, Mode::Peek, &["k1"], &[&check]));
        assert_eq!(
            args,
            [
                "FCALL",
                &library.check,
                "1",
                "k1",
                "peek",
                "token_bucket 5 1000 1 0 0 "
            ]
        );
    }
}
