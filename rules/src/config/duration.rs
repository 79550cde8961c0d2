//! The duration syntax of the configuration: `"250ms"`, `"10s"`, `"1m"`, `"1h"`, `"1d"`.

use std::time::Duration;

/// Written exactly: digits then a lower-case unit, nothing around them (a stray space
/// is refused, as an upper-case unit is, rather than read one way here and another in
/// the next tool).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let usage = || format!("{text:?} is not a duration such as \"500ms\", \"10s\", \"1m\", \"1h\" or \"1d\"");
    let amount: u64 = digits.parse().map_err(|_| usage())?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(usage()),
    };
    amount
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}
