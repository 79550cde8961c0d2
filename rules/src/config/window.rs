//! A rule's window: an algorithm over a period, a fixed window aligned to the calendar, or
//! a concurrency limit's `max_duration` standing where the period would; and the name of
//! the counters it keeps.

use super::{parse_duration, ConfigError};
use crate::keys::{calendar_counter_name, counter_name};
use crate::wire::calendar::UtcOffset;
use crate::wire::{Algorithm, CalendarUnit, CalendarWindow, Period};
use std::time::Duration;

/// How a rule's windows are laid out: an algorithm over a `period`, or a fixed window
/// aligned to a `calendar` (whose period is the unit's longest window).
pub(super) struct Window {
    pub(super) algorithm: Algorithm,
    pub(super) period: Period,
    pub(super) calendar: Option<CalendarWindow>,
}

pub(super) fn compile_window(
    at: &str,
    algorithm: Option<Algorithm>,
    period: Option<&str>,
    max_duration: Option<&str>,
    calendar: Option<CalendarUnit>,
    utc_offset: Option<&str>,
) -> Result<Window, ConfigError> {
    let field = |name: &str| format!("{at}.{name}");
    let concurrency = algorithm.is_some_and(|a| a.traits().counts_in_flight);
    if !concurrency && max_duration.is_some() {
        return Err(ConfigError::new(
            field("max_duration"),
            "only applies to a concurrency rule",
        ));
    }
    if concurrency {
        if calendar.is_some() || utc_offset.is_some() {
            return Err(ConfigError::new(
                field("calendar"),
                "a concurrency rule limits requests in flight: it has no window",
            ));
        }
        return Ok(Window {
            algorithm: Algorithm::Concurrency,
            period: compile_max_duration(at, period, max_duration)?,
            calendar: None,
        });
    }
    match (period, calendar) {
        (Some(_), Some(_)) => Err(ConfigError::new(
            field("calendar"),
            "give either a period or a calendar, not both",
        )),
        (None, None) => Err(ConfigError::new(
            field("period"),
            "missing: give a period (e.g. \"1m\") or a calendar (\"day\", \"week\", \"month\")",
        )),
        (Some(period), None) => {
            if utc_offset.is_some() {
                return Err(ConfigError::new(
                    field("utc_offset"),
                    "only applies with a calendar",
                ));
            }
            Ok(Window {
                algorithm: algorithm.unwrap_or_default(),
                period: compile_period(field("period"), period)?,
                calendar: None,
            })
        }
        (None, Some(unit)) => {
            // A calendar quota is a count per day, week or month: a fixed window. Any
            // other algorithm would silently mean something else.
            if algorithm.is_some_and(|a| !a.traits().follows_calendar) {
                return Err(ConfigError::new(
                    field("algorithm"),
                    "a calendar quota is a fixed window aligned to the calendar: omit the algorithm or give fixed_window",
                ));
            }
            let offset = utc_offset
                .map(UtcOffset::parse)
                .transpose()
                .map_err(|reason| ConfigError::new(field("utc_offset"), reason))?
                .unwrap_or(UtcOffset(0));
            let period = Period::try_from(unit.longest_ms())
                .map_err(|bounds| ConfigError::new(field("calendar"), bounds.0))?;
            Ok(Window {
                algorithm: Algorithm::FixedWindow,
                period,
                calendar: Some(CalendarWindow {
                    unit,
                    offset_minutes: offset.0,
                }),
            })
        }
    }
}

/// The name of counters at `period`, or of the calendar's when there is one.
pub(super) fn window_counter_name(
    rule_name: &str,
    algorithm: Algorithm,
    period: Period,
    calendar: Option<CalendarWindow>,
) -> String {
    match calendar {
        Some(calendar) => calendar_counter_name(rule_name, calendar),
        None => counter_name(rule_name, algorithm, period.as_ms()),
    }
}

/// How long a concurrency slot stays taken when its release is lost, unless configured.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(60);
/// The shortest `max_duration`: a slot that expires while its request still runs stops
/// counting it, so a limit of 1 with `"1ms"` admitted 6 at once. Below a second, every
/// request slower than a round trip would escape the limit.
pub const MIN_MAX_DURATION: Duration = Duration::from_secs(1);

/// A concurrency rule's `max_duration`, which stands where a rate's period would: a
/// concurrency limit has no window, so `period` is refused.
pub(super) fn compile_max_duration(
    at: &str,
    period: Option<&str>,
    max_duration: Option<&str>,
) -> Result<Period, ConfigError> {
    let field = |name: &str| format!("{at}.{name}");
    match (period, max_duration) {
        (Some(_), _) => Err(ConfigError::new(
            field("period"),
            "a concurrency rule limits requests in flight, not a rate: it has no period (see max_duration)",
        )),
        (None, Some(max_duration)) => {
            let period = compile_period(field("max_duration"), max_duration)?;
            if u128::from(period.as_ms()) < MIN_MAX_DURATION.as_millis() {
                return Err(ConfigError::new(
                    field("max_duration"),
                    format!(
                        "must be at least {}s and above the longest request: a slot that expires while its request runs no longer counts it",
                        MIN_MAX_DURATION.as_secs()
                    ),
                ));
            }
            Ok(period)
        }
        (None, None) => Period::try_from(DEFAULT_MAX_DURATION)
            .map_err(|bounds| ConfigError::new(field("max_duration"), bounds.0)),
    }
}

/// The header dialects that announce a window (`w=60`) give it in whole seconds: with
/// them, a period of 250 ms would announce 1 s.
pub(super) fn check_whole_seconds(
    field: String,
    period: Period,
    whole_seconds: bool,
) -> Result<(), ConfigError> {
    if whole_seconds && !period.as_ms().is_multiple_of(1000) {
        return Err(ConfigError::new(
            field,
            "must be whole seconds with the configured header dialects (their window `w` is in seconds)",
        ));
    }
    Ok(())
}

pub(super) fn compile_period(field: String, period: &str) -> Result<Period, ConfigError> {
    let period = parse_duration(period).map_err(|reason| ConfigError::new(field.clone(), reason))?;
    Period::try_from(period).map_err(|bounds| ConfigError::new(field, bounds.0))
}
