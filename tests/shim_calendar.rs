//! The shim's Lua calendar arithmetic (redis-shim/scripts/calendar.lua) against the wire
//! crate's Rust reference, evaluated in a real Redis: at every boundary of windows around
//! month ends of each length, leap days, year ends and Monday week starts, at offsets with
//! minutes and at both extremes, and at thousands of random instants from 1970 to 2400.
//! The Rust function is itself checked against a hand-written table of boundaries in
//! wire/src/calendar.rs. Then the shim's answers for a calendar check (window end, lease,
//! tokens given back) and its refusal of a malformed calendar.

mod support;

use ratelimit_wire::calendar::days_from_civil;
use ratelimit_wire::{CalendarUnit, CalendarWindow};
use serde_json::{json, Value};
use support::*;

/// A test-only driver after the shim's prelude and calendar file: ARGV holds pairs of
/// (calendar as the shim writes it, instant in ms); the reply is each window's start and
/// end, flattened.
const DRIVER: &str = r#"
local reply = {}
for i = 1, #ARGV, 2 do
  local cal = assert(parse_calendar(ARGV[i]))
  local start, finish = calendar_window(cal, tonumber(ARGV[i + 1]))
  reply[#reply + 1] = start
  reply[#reply + 1] = finish
end
return reply
"#;

const MS_PER_DAY: i64 = 86_400_000;

fn script() -> String {
    [
        include_str!("../redis-shim/scripts/common.lua"),
        include_str!("../redis-shim/scripts/calendar.lua"),
        DRIVER,
    ]
    .concat()
}

/// The Lua windows of `cases`, evaluated in Redis in batches that keep each command
/// line short.
fn lua_windows(redis: &Redis, cases: &[(CalendarWindow, i64)]) -> Vec<(i64, i64)> {
    let script = script();
    let mut windows = Vec::with_capacity(cases.len());
    for batch in cases.chunks(400) {
        let mut args: Vec<String> = vec!["EVAL".into(), script.clone(), "0".into()];
        for (calendar, instant) in batch {
            args.push(calendar.script_arg());
            args.push(instant.to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = redis.cli(&args);
        let numbers: Vec<i64> = output
            .lines()
            .map(|line| {
                line.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("not a number: {line:?} in\n{output}"))
            })
            .collect();
        assert_eq!(numbers.len(), 2 * batch.len(), "{output}");
        windows.extend(numbers.chunks(2).map(|pair| (pair[0], pair[1])));
    }
    windows
}

fn assert_lua_matches_rust(redis: &Redis, cases: &[(CalendarWindow, i64)]) {
    let lua = lua_windows(redis, cases);
    for ((calendar, instant), lua) in cases.iter().zip(lua) {
        assert_eq!(
            lua,
            calendar.window_at(*instant),
            "{} at {instant} ms: Lua and Rust disagree",
            calendar.script_arg()
        );
    }
}

fn calendars() -> Vec<CalendarWindow> {
    let offsets = [0, 330, -210, 14 * 60, -12 * 60, 345, -60];
    [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month]
        .into_iter()
        .flat_map(|unit| offsets.map(|offset_minutes| CalendarWindow { unit, offset_minutes }))
        .collect()
}

#[test]
fn lua_windows_match_rust_at_every_boundary() {
    let redis = Redis::start();
    // Around month ends of 31, 30, 28 and 29 days, 2100 (no leap year), 2000 (one), a
    // year end, a Monday after a month end, and the epoch.
    let dates = [
        (2026, 1, 31),
        (2026, 4, 30),
        (2026, 2, 28),
        (2024, 2, 29),
        (2100, 2, 28),
        (2000, 2, 29),
        (2026, 12, 31),
        (2025, 3, 2),
        (1970, 1, 1),
        (2399, 12, 31),
    ];
    let mut cases = Vec::new();
    for calendar in calendars() {
        for (year, month, day) in dates {
            let noon = days_from_civil(year, month, day) * MS_PER_DAY + MS_PER_DAY / 2;
            let (start, end) = calendar.window_at(noon);
            for instant in [noon, start, start - 1, end, end - 1, end + 1] {
                cases.push((calendar, instant));
            }
        }
    }
    assert_lua_matches_rust(&redis, &cases);
}

#[test]
fn lua_windows_match_rust_at_random_instants_from_1970_to_2400() {
    let redis = Redis::start();
    let calendars = calendars();
    let span = days_from_civil(2400, 1, 1) * MS_PER_DAY;
    // xorshift64: deterministic, so a failure replays.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let cases: Vec<(CalendarWindow, i64)> = (0..6000)
        .map(|_| {
            let calendar = calendars[(next() % calendars.len() as u64) as usize];
            let instant = (next() % span as u64) as i64;
            (calendar, instant)
        })
        .collect();
    assert_lua_matches_rust(&redis, &cases);
}

/// A calendar check of the month at -03:30, as the filter sends it.
fn monthly(key: &str, limit: u64) -> Value {
    with(
        check_of(key, "fixed_window", limit, CalendarUnit::Month.longest_ms()),
        "calendar",
        json!({ "unit": "month", "offset_minutes": -210 }),
    )
}

#[test]
fn a_calendar_check_ends_its_window_and_its_leases_at_the_month_end() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let url = shim.url("/v1/check");
    let month = CalendarWindow {
        unit: CalendarUnit::Month,
        offset_minutes: -210,
    };
    let before_ms = redis.time_ms();
    let answer = decide_at(&url, &[with(monthly("m", 10), "lease", json!(4))]);
    let after_ms = redis.time_ms();
    let (_, month_end_ms) = month.window_at(before_ms as i64);
    let month_end_ms = month_end_ms as u64;
    assert!(after_ms < month_end_ms, "the test ran across a month end");
    let result = &answer["results"][0];
    assert_eq!(result["granted"], 4, "{answer}");
    for field in ["reset_ms", "lease_window_ms"] {
        let ms = result[field].as_u64().unwrap();
        assert!(
            (month_end_ms - after_ms..=month_end_ms - before_ms).contains(&ms),
            "{field} {ms} does not end at the month end {month_end_ms} ({answer})"
        );
    }
    // The counter expires with its month: an idle client costs no memory after it.
    let expire_at_ms: u64 = redis.cli(&["PEXPIRETIME", "rl:m"]).parse().unwrap();
    assert_eq!(expire_at_ms, month_end_ms);
    // Three of the four leased tokens come back through refund.lua.
    let stamp = result["stamp"].as_i64().unwrap();
    let back = json!({ "requests": [], "returns": [{ "key": "m", "algorithm": "fixed_window",
        "limit": 10, "period_ms": CalendarUnit::Month.longest_ms(), "amount": 3, "stamp": stamp,
        "calendar": { "unit": "month", "offset_minutes": -210 } }] });
    let reply = post(&shim.url("/v1/check-batch"), &[], &back.to_string());
    assert_eq!(reply.status, 200, "{reply:?}");
    let again = decide_at(&url, &[monthly("m", 10)]);
    assert_eq!(again["results"][0]["remaining"], 8, "{again}");
}

#[test]
fn a_malformed_calendar_is_refused_naming_the_field() {
    let redis = Redis::start();
    let shim = Shim::start(&redis.url(), &[]);
    let url = shim.url("/v1/check");
    let cases = [
        (
            with(
                monthly("k", 5),
                "calendar",
                json!({ "unit": "month", "offset_minutes": 900 }),
            ),
            "checks[0].calendar.offset_minutes",
        ),
        (
            with(monthly("k", 5), "algorithm", json!("token_bucket")),
            "checks[0].calendar",
        ),
        (
            with(monthly("k", 5), "period_ms", json!(86_400_000)),
            "checks[0].period_ms",
        ),
        (
            with(monthly("k", 5), "calendar", json!({ "unit": "fortnight" })),
            "fortnight",
        ),
    ];
    for (check, expected) in cases {
        let reply = post(&url, &[], &checks_body(std::slice::from_ref(&check)));
        assert_eq!(reply.status, 400, "{check}: {reply:?}");
        assert!(reply.body.contains(expected), "{check}: {}", reply.body);
    }
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
}
