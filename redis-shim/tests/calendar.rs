//! The shim's Lua calendar arithmetic (redis-shim/scripts/calendar.lua) against the wire
//! crate's Rust reference, evaluated in a real Redis: at every boundary of windows around
//! month ends of each length, leap days, year ends and Monday week starts, at offsets with
//! minutes and at both extremes, and at thousands of random instants from 1970 to 2400.
//! The Rust function is itself checked against a hand-written table of boundaries in
//! wire/src/calendar.rs (and is what the store in memory runs). The shim's answers for a
//! calendar check, on every backend, are in the suite (`suite/calendar.rs`).

mod support;

use ratelimit_wire::calendar::days_from_civil;
use ratelimit_wire::{CalendarUnit, CalendarWindow};
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
        include_str!("../scripts/common.lua"),
        include_str!("../scripts/calendar.lua"),
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
