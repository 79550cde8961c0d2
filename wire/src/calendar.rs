//! Calendar windows: fixed windows aligned to the civil calendar (a day from midnight, a
//! week from Monday's midnight, a month from the 1st's midnight) at a fixed UTC offset.
//!
//! The pure date arithmetic here is the reference the shim's Lua (`calendar.lua`) follows
//! and is tested against; the filter uses it for the window `w` it announces. The
//! conversions between days since the Unix epoch and civil dates are Howard Hinnant's
//! `days_from_civil` / `civil_from_days` (proleptic Gregorian calendar), exact for every
//! date the counters can meet.

use serde::{Deserialize, Serialize};
use std::fmt;

const MS_PER_MINUTE: i64 = 60_000;
const MS_PER_DAY: i64 = 86_400_000;
/// Westernmost UTC offset in use (-12:00), in minutes.
pub const MIN_OFFSET_MINUTES: i32 = -12 * 60;
/// Easternmost UTC offset in use (+14:00), in minutes.
pub const MAX_OFFSET_MINUTES: i32 = 14 * 60;

/// The calendar unit a window spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalendarUnit {
    Day,
    /// From Monday 00:00 to the next Monday 00:00.
    Week,
    /// From the 1st 00:00 to the next month's 1st 00:00.
    Month,
}

impl CalendarUnit {
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
        }
    }

    /// The longest window of this unit in milliseconds (a month of 31 days): the
    /// `period_ms` a calendar check carries, an upper bound of every window's length.
    pub fn longest_ms(self) -> u64 {
        match self {
            CalendarUnit::Day => 86_400_000,
            CalendarUnit::Week => 7 * 86_400_000,
            CalendarUnit::Month => 31 * 86_400_000,
        }
    }
}

/// A calendar window: its unit and the fixed UTC offset (in minutes, east positive) at
/// which its days start. The offset is fixed: no daylight saving time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarWindow {
    pub unit: CalendarUnit,
    #[serde(default)]
    pub offset_minutes: i32,
}

/// How a refusal and `redis-shim counters show` name the window: `month (UTC+05:30)`.
impl fmt::Display for CalendarWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (UTC{})",
            self.unit.as_str(),
            UtcOffset(self.offset_minutes)
        )
    }
}

impl CalendarWindow {
    /// Whether the offset is one in use: `-12:00..=+14:00`.
    pub fn offset_in_bounds(self) -> bool {
        (MIN_OFFSET_MINUTES..=MAX_OFFSET_MINUTES).contains(&self.offset_minutes)
    }

    /// The window `[start, end)` (Unix milliseconds) holding the instant `unix_ms`.
    pub fn window_at(self, unix_ms: i64) -> (i64, i64) {
        let offset_ms = i64::from(self.offset_minutes) * MS_PER_MINUTE;
        let local_day = (unix_ms + offset_ms).div_euclid(MS_PER_DAY);
        let (first_day, next_first_day) = match self.unit {
            CalendarUnit::Day => (local_day, local_day + 1),
            CalendarUnit::Week => {
                // 1970-01-01 was a Thursday: day 0 is 3 days after a Monday.
                let monday = local_day - (local_day + 3).rem_euclid(7);
                (monday, monday + 7)
            }
            CalendarUnit::Month => {
                let (year, month, _) = civil_from_days(local_day);
                let (next_year, next_month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                (
                    days_from_civil(year, month, 1),
                    days_from_civil(next_year, next_month, 1),
                )
            }
        };
        (
            first_day * MS_PER_DAY - offset_ms,
            next_first_day * MS_PER_DAY - offset_ms,
        )
    }

    /// The length in milliseconds of the window holding `unix_ms`.
    pub fn length_at(self, unix_ms: i64) -> u64 {
        let (start, end) = self.window_at(unix_ms);
        (end - start).unsigned_abs()
    }

    /// What check.lua and refund.lua take as one ARGV value: `<unit>:<offset minutes>`.
    pub fn script_arg(self) -> String {
        format!("{}:{}", self.unit.as_str(), self.offset_minutes)
    }
}

/// A UTC offset written `±HH:MM`, e.g. `+05:30`, `-03:30`, `+00:00`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcOffset(pub i32);

impl UtcOffset {
    /// Parses `±HH:MM`, refusing an offset outside `-12:00..=+14:00`.
    pub fn parse(text: &str) -> Result<UtcOffset, String> {
        let malformed = || format!("{text:?} is not a UTC offset of the form ±HH:MM, e.g. +05:30");
        let &[sign, h1, h2, b':', m1, m2] = text.as_bytes() else {
            return Err(malformed());
        };
        let sign = match sign {
            b'+' => 1,
            b'-' => -1,
            _ => return Err(malformed()),
        };
        let two_digits = |tens: u8, ones: u8| -> Option<i32> {
            (tens.is_ascii_digit() && ones.is_ascii_digit())
                .then(|| i32::from(tens - b'0') * 10 + i32::from(ones - b'0'))
        };
        let (Some(hours), Some(minutes)) = (two_digits(h1, h2), two_digits(m1, m2)) else {
            return Err(malformed());
        };
        if minutes > 59 {
            return Err(format!("{text:?}: minutes must be 00..59"));
        }
        let total = sign * (hours * 60 + minutes);
        if !(MIN_OFFSET_MINUTES..=MAX_OFFSET_MINUTES).contains(&total) {
            return Err(format!("{text:?}: must be between -12:00 and +14:00"));
        }
        Ok(UtcOffset(total))
    }
}

impl fmt::Display for UtcOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { '-' } else { '+' };
        let minutes = self.0.unsigned_abs();
        write!(f, "{sign}{:02}:{:02}", minutes / 60, minutes % 60)
    }
}

/// Days since 1970-01-01 of the civil date `year-month-day` (month 1..=12).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The civil date `(year, month, day)` of a day counted from 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both fit: day is 1..=31, month 1..=12.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Unix milliseconds of a civil time at UTC.
    fn utc(year: i64, month: u32, day: u32, hour: i64, minute: i64) -> i64 {
        (days_from_civil(year, month, day) * 24 * 60 + hour * 60 + minute) * MS_PER_MINUTE
    }

    fn window(unit: CalendarUnit, offset: &str) -> CalendarWindow {
        CalendarWindow {
            unit,
            offset_minutes: UtcOffset::parse(offset).unwrap().0,
        }
    }

    /// Boundaries: (unit, offset, the boundary as a UTC instant, the start of the window
    /// before it). At the boundary the next window starts; 1 ms before, the previous one
    /// ends there.
    fn boundary_table() -> Vec<(CalendarUnit, &'static str, i64, i64)> {
        use CalendarUnit::*;
        vec![
            // Month ends of 31, 30, 28 and 29 days; leap years 2024 and 2000, not 2100.
            (Month, "+00:00", utc(2026, 2, 1, 0, 0), utc(2026, 1, 1, 0, 0)),
            (Month, "+00:00", utc(2026, 5, 1, 0, 0), utc(2026, 4, 1, 0, 0)),
            (Month, "+00:00", utc(2026, 3, 1, 0, 0), utc(2026, 2, 1, 0, 0)),
            (Month, "+00:00", utc(2024, 3, 1, 0, 0), utc(2024, 2, 1, 0, 0)),
            (Month, "+00:00", utc(2100, 3, 1, 0, 0), utc(2100, 2, 1, 0, 0)),
            (Month, "+00:00", utc(2000, 3, 1, 0, 0), utc(2000, 2, 1, 0, 0)),
            // Year end.
            (Month, "+00:00", utc(2027, 1, 1, 0, 0), utc(2026, 12, 1, 0, 0)),
            (Day, "+00:00", utc(2027, 1, 1, 0, 0), utc(2026, 12, 31, 0, 0)),
            // Leap day itself, and the day after it.
            (Day, "+00:00", utc(2024, 2, 29, 0, 0), utc(2024, 2, 28, 0, 0)),
            (Day, "+00:00", utc(2024, 3, 1, 0, 0), utc(2024, 2, 29, 0, 0)),
            // Offsets with minutes: midnight at +05:30 is 18:30 UTC the day before.
            (Day, "+05:30", utc(2026, 3, 14, 18, 30), utc(2026, 3, 13, 18, 30)),
            (Day, "-03:30", utc(2026, 3, 15, 3, 30), utc(2026, 3, 14, 3, 30)),
            (Day, "+14:00", utc(2026, 12, 31, 10, 0), utc(2026, 12, 30, 10, 0)),
            (Day, "-12:00", utc(2027, 1, 1, 12, 0), utc(2026, 12, 31, 12, 0)),
            (
                Month,
                "+05:30",
                utc(2024, 2, 29, 18, 30),
                utc(2024, 1, 31, 18, 30),
            ),
            (Month, "-03:30", utc(2025, 3, 1, 3, 30), utc(2025, 2, 1, 3, 30)),
            (
                Month,
                "+14:00",
                utc(2026, 12, 31, 10, 0),
                utc(2026, 11, 30, 10, 0),
            ),
            (Month, "-12:00", utc(2027, 1, 1, 12, 0), utc(2026, 12, 1, 12, 0)),
            // Weeks start on Monday: 2024-12-30 and 2025-03-03 were Mondays (across a
            // year end and a month end), 1970-01-05 the first Monday after the epoch.
            (Week, "+00:00", utc(2024, 12, 30, 0, 0), utc(2024, 12, 23, 0, 0)),
            (Week, "+00:00", utc(2025, 1, 6, 0, 0), utc(2024, 12, 30, 0, 0)),
            (Week, "+00:00", utc(2025, 3, 3, 0, 0), utc(2025, 2, 24, 0, 0)),
            (Week, "+00:00", utc(1970, 1, 5, 0, 0), utc(1969, 12, 29, 0, 0)),
            (Week, "+05:30", utc(2025, 3, 2, 18, 30), utc(2025, 2, 23, 18, 30)),
            (Week, "-12:00", utc(2025, 1, 6, 12, 0), utc(2024, 12, 30, 12, 0)),
        ]
    }

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        // 2100 is no leap year: Feb 28 is followed by Mar 1.
        assert_eq!(days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 28), 1);
        for day in -800_000..800_000i64 {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn windows_change_exactly_at_each_boundary() {
        for (unit, offset, boundary, previous_start) in boundary_table() {
            let calendar = window(unit, offset);
            let (start, end) = calendar.window_at(boundary);
            assert_eq!(start, boundary, "{unit:?} {offset} at the boundary starts there");
            assert!(end > start);
            assert_eq!(
                calendar.window_at(boundary - 1),
                (previous_start, boundary),
                "{unit:?} {offset} 1 ms before the boundary"
            );
            assert_eq!(calendar.window_at(end - 1), (start, end));
        }
    }

    #[test]
    fn window_lengths_follow_the_calendar() {
        let month = window(CalendarUnit::Month, "+00:00");
        let days = |ms: u64| ms / MS_PER_DAY as u64;
        assert_eq!(days(month.length_at(utc(2026, 1, 15, 0, 0))), 31);
        assert_eq!(days(month.length_at(utc(2026, 4, 15, 0, 0))), 30);
        assert_eq!(days(month.length_at(utc(2026, 2, 15, 0, 0))), 28);
        assert_eq!(days(month.length_at(utc(2024, 2, 15, 0, 0))), 29);
        assert_eq!(days(month.length_at(utc(2100, 2, 15, 0, 0))), 28);
        assert_eq!(days(month.length_at(utc(2000, 2, 15, 0, 0))), 29);
        let week = window(CalendarUnit::Week, "-03:30");
        assert_eq!(week.length_at(utc(2026, 7, 1, 0, 0)), 7 * MS_PER_DAY as u64);
        for unit in [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month] {
            let calendar = window(unit, "+14:00");
            assert!(calendar.length_at(utc(2026, 12, 31, 23, 59)) <= unit.longest_ms());
        }
    }

    #[test]
    fn offsets_parse_and_print() {
        for (text, minutes) in [
            ("+05:30", 330),
            ("-03:30", -210),
            ("+00:00", 0),
            ("+14:00", 840),
            ("-12:00", -720),
        ] {
            let offset = UtcOffset::parse(text).unwrap();
            assert_eq!(offset.0, minutes);
            assert_eq!(offset.to_string(), text);
        }
        for bad in [
            "05:30",
            "+5:30",
            "+05:60",
            "+14:01",
            "-12:30",
            "+15:00",
            "+05-30",
            "",
            "+0a:00",
            "UTC",
            "+05:300",
            "\u{2212}05:00",
        ] {
            assert!(UtcOffset::parse(bad).is_err(), "{bad} should be refused");
        }
        assert_eq!(
            CalendarWindow {
                unit: CalendarUnit::Month,
                offset_minutes: -210
            }
            .script_arg(),
            "month:-210"
        );
    }
}
