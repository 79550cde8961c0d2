//! Calendar windows (a fixed window over a day, a week or a month at a UTC offset) as a
//! check sees them: the window, its leases and its expiry end at the month's end, and a
//! malformed calendar is refused. (`tests/calendar.rs` compares the Lua calendar with the
//! Rust one.)

use super::support::*;
use ratelimit_wire::{CalendarUnit, CalendarWindow};
use serde_json::json;
use serde_json::Value;

/// A calendar check of the month at -03:30, as the filter sends it.
fn monthly(key: &str, limit: u64) -> Value {
    with(
        check_of(key, "fixed_window", limit, CalendarUnit::Month.longest_ms()),
        "calendar",
        json!({ "unit": "month", "offset_minutes": -210 }),
    )
}

fn a_calendar_check_ends_its_window_and_its_leases_at_the_month_end(backend: Backend) {
    let shim = backend.shim(&[]);
    let url = shim.url("/v1/check");
    let month = CalendarWindow {
        unit: CalendarUnit::Month,
        offset_minutes: -210,
    };
    let before_ms = backend.time_ms();
    let answer = decide_at(&url, &[with(monthly("m", 10), "lease", json!(4))]);
    let after_ms = backend.time_ms();
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
    let key = format!("{}m", shim.key_prefix());
    if let Some(expire_at) = backend.cli(&["PEXPIRETIME", &key]) {
        assert_eq!(expire_at.parse::<u64>().unwrap(), month_end_ms);
    }
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

fn a_malformed_calendar_is_refused_naming_the_field(backend: Backend) {
    let shim = backend.shim(&[]);
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
    assert!(matches!(backend.key_count(&shim), None | Some(0)));
}

on_every_backend!(
    a_calendar_check_ends_its_window_and_its_leases_at_the_month_end,
    a_malformed_calendar_is_refused_naming_the_field,
);
